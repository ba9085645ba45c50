//! The failed tests of a `cargo test` run, read from libtest's output as it streams by, so that a long run ends
//! with what failed and why: CI shows a log's first and last lines, and the failures of a suite that ran early
//! would otherwise sit in the middle of a megabyte of output.

use std::fmt;

/// The most lines of one failure's panic kept for the summary: the panic's location and its message.
const PANIC_LINES: usize = 8;

/// One failed test: its name and the panic lines libtest captured for it (the panic's location names its file;
/// cargo prints which test target runs on standard error, which a reader of the output does not see).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Failure {
    pub name: String,
    pub panic: Vec<String>,
}

/// Reads libtest's output line by line (`cargo test -- --show-output`, one test binary after another).
#[derive(Debug, Default)]
pub struct TestReport {
    failures: Vec<Failure>,
    /// The failure whose captured output is being read (`---- name stdout ----` of a failed test).
    reading: Option<usize>,
}

impl TestReport {
    /// Takes the next line of output.
    pub fn line(&mut self, line: &str) {
        let line = line.trim_end();
        if let Some(name) = line
            .strip_prefix("test ")
            .and_then(|rest| rest.strip_suffix(" ... FAILED"))
        {
            self.failures.push(Failure {
                name: name.to_owned(),
                panic: Vec::new(),
            });
        } else if let Some(name) = line
            .strip_prefix("---- ")
            .and_then(|rest| rest.strip_suffix(" stdout ----"))
        {
            self.reading = self
                .failures
                .iter()
                .rposition(|failure| failure.name == name);
        } else if [
            "failures:",
            "successes:",
            "test result: ",
            "stack backtrace:",
            "note: run with",
        ]
        .iter()
        .any(|end| line.starts_with(end))
        {
            self.reading = None;
        } else if let Some(index) = self.reading {
            let panic = &mut self.failures[index].panic;
            let panicking =
                !panic.is_empty() || (line.starts_with("thread '") && line.contains("panicked at"));
            if panicking && !line.is_empty() && panic.len() < PANIC_LINES {
                panic.push(line.to_owned());
            }
        }
    }

    pub fn failures(&self) -> &[Failure] {
        &self.failures
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name)?;
        for line in &self.panic {
            write!(f, "\n    {line}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libtest's output for two suites with `--show-output`, one test failing in each (cargo's `Running` lines are
    /// on standard error in a real run, and are ignored here).
    const OUTPUT: &str = "\
     Running tests/chaos.rs (/target/debug/deps/chaos-0f)

running 2 tests
test survives_a_restart ... ok
test survives_a_kill ... FAILED

successes:

---- survives_a_restart stdout ----
--- step one
thread 'survives_a_restart' panicked at nowhere: this is a success's output and is not read

successes:
    survives_a_restart

failures:

---- survives_a_kill stdout ----
--- the agent is killed
thread 'survives_a_kill' panicked at tests/tests/chaos.rs:42:9:
the agent came back: timed out after 60 s
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace


failures:
    survives_a_kill

test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s

     Running tests/dra.rs (/target/debug/deps/dra-1a)

running 1 test
test prepares_claims ... FAILED

failures:

---- prepares_claims stdout ----
thread 'prepares_claims' panicked at tests/tests/dra.rs:7:5:
assertion `left == right` failed
  left: 1
 right: 2

failures:
    prepares_claims

test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.10s
";

    #[test]
    fn names_each_failed_test_with_its_panic() {
        let mut report = TestReport::default();
        OUTPUT.lines().for_each(|line| report.line(line));
        assert_eq!(
            report.failures(),
            [
                Failure {
                    name: "survives_a_kill".into(),
                    panic: vec![
                        "thread 'survives_a_kill' panicked at tests/tests/chaos.rs:42:9:".into(),
                        "the agent came back: timed out after 60 s".into(),
                    ],
                },
                Failure {
                    name: "prepares_claims".into(),
                    panic: vec![
                        "thread 'prepares_claims' panicked at tests/tests/dra.rs:7:5:".into(),
                        "assertion `left == right` failed".into(),
                        "  left: 1".into(),
                        " right: 2".into(),
                    ],
                },
            ]
        );
        assert_eq!(
            report.failures()[1].to_string(),
            "prepares_claims\n    thread 'prepares_claims' panicked at tests/tests/dra.rs:7:5:\n    \
             assertion `left == right` failed\n      left: 1\n     right: 2"
        );
    }

    #[test]
    fn a_passing_run_has_no_failures() {
        let mut report = TestReport::default();
        "running 1 test\ntest works ... ok\n\ntest result: ok. 1 passed; 0 failed"
            .lines()
            .for_each(|line| report.line(line));
        assert!(report.failures().is_empty());
    }
}
