//! Running the tools a task needs (cargo, helm, kubectl), echoing each command so CI logs show what ran.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::test_report::TestReport;

/// Runs `program args...` in `dir` with extra environment, streaming its output; fails when it fails.
pub fn run(
    dir: &Path,
    env: &[(String, String)],
    program: &str,
    args: &[&str],
) -> anyhow::Result<()> {
    let status = echoed(dir, env, program, args)
        .status()
        .with_context(|| format!("cannot start {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

/// `program args...` in `dir` with extra environment, echoed as it will run.
fn echoed(dir: &Path, env: &[(String, String)], program: &str, args: &[&str]) -> Command {
    println!("$ {program} {}", args.join(" "));
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(dir)
        .envs(env.iter().map(|(key, value)| (key, value)));
    command
}

/// Runs `cargo test` (`args` after `cargo`) as [`run`] does, and when it fails, names every failed test and its
/// panic at the end of the output (and in the error), where a CI log's tail shows it. Output passes through as it
/// comes, so that a test's progress stays in order with what its processes print to standard error.
pub fn run_tests(dir: &Path, env: &[(String, String)], args: &[&str]) -> anyhow::Result<()> {
    run_reporting_failed_tests(dir, env, &cargo(), args, std::io::stdout())
}

/// [`run_tests`] with any program that prints libtest's output, echoed to `echo`.
fn run_reporting_failed_tests(
    dir: &Path,
    env: &[(String, String)],
    program: &str,
    args: &[&str],
    echo: impl Write + Send + 'static,
) -> anyhow::Result<()> {
    let mut child = echoed(dir, env, program, args)
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {program}"))?;
    // The output is read beside the wait: a process a test started and left running may hold the pipe open after
    // cargo ends, and the run must not wait for it.
    let report = Arc::new(Mutex::new(TestReport::default()));
    let (done, drained) = mpsc::channel();
    if let Some(stdout) = child.stdout.take() {
        let report = report.clone();
        std::thread::spawn(move || {
            echo_and_read(stdout, echo, &report);
            let _ = done.send(());
        });
    }
    let status = child
        .wait()
        .with_context(|| format!("waiting for {program}"))?;
    let _ = drained.recv_timeout(Duration::from_secs(5));
    if status.success() {
        return Ok(());
    }
    let report = report
        .lock()
        .map_err(|_| anyhow::anyhow!("the output reader panicked"))?;
    let failures = report.failures();
    if failures.is_empty() {
        bail!(
            "`{program} {}` failed ({status}) with no failed test named: a test binary or the build failed, see above",
            args.join(" ")
        );
    }
    println!("\n=== {} failed test(s)", failures.len());
    for failure in failures {
        println!("{failure}");
    }
    let names: Vec<&str> = failures
        .iter()
        .map(|failure| failure.name.as_str())
        .collect();
    bail!("failed tests: {}", names.join(", "))
}

/// Copies `stdout` to `out` as it comes, and gives `report` each whole line.
fn echo_and_read(stdout: impl Read, mut out: impl Write, report: &Mutex<TestReport>) {
    let mut reader = BufReader::new(stdout);
    let mut pending = Vec::new();
    while let Ok(chunk) = reader.fill_buf() {
        if chunk.is_empty() {
            return;
        }
        // Echoing is best effort: a closed standard output must not stop the tests.
        let _ = out.write_all(chunk).and_then(|()| out.flush());
        pending.extend_from_slice(chunk);
        let length = chunk.len();
        reader.consume(length);
        while let Some(end) = pending.iter().position(|&byte| byte == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            if let Ok(mut report) = report.lock() {
                report.line(&String::from_utf8_lossy(&line));
            }
        }
    }
}

/// Runs a command and returns its standard output; fails with its standard error when it fails.
pub fn output(env: &[(String, String)], program: &str, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(key, value)| (key, value)))
        .output()
        .with_context(|| format!("cannot start {program}"))?;
    if !output.status.success() {
        bail!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The cargo that runs this xtask, so nested builds use the same toolchain.
pub fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// The cargo target directory: `$CARGO_TARGET_DIR`, else `target/` in the workspace.
pub fn target_dir(root: &Path) -> std::path::PathBuf {
    std::env::var("CARGO_TARGET_DIR").map_or_else(|_| root.join("target"), std::path::PathBuf::from)
}

/// The environment of every release build (the images' and the benchmarks' alike): the target
/// and cargo-home paths rewritten to fixed names, so that the same commit gives the same binaries wherever it is
/// built. The checkout's own path needs no rewriting: cargo hands rustc the workspace's sources by relative path. It
/// is left out on purpose, since these flags are part of every artifact's fingerprint: with it, each fresh clone
/// would rebuild every dependency.
pub fn release_env(root: &Path) -> Vec<(String, String)> {
    let cargo_home = std::env::var("CARGO_HOME")
        .unwrap_or_else(|_| format!("{}/.cargo", std::env::var("HOME").unwrap_or_default()));
    let flags = [
        (target_dir(root).display().to_string(), "/target"),
        (cargo_home, "/cargo"),
    ]
    .iter()
    .map(|(from, to)| format!("--remap-path-prefix={from}={to}"))
    .collect::<Vec<_>>()
    .join(" ");
    vec![("RUSTFLAGS".into(), flags)]
}

/// `cargo build --release --locked` of the given `--package`/`--bin`/`--example` arguments, with [`release_env`].
pub fn release_build(root: &Path, targets: &[String]) -> anyhow::Result<()> {
    let mut args = vec!["build", "--release", "--locked"];
    args.extend(targets.iter().map(String::as_str));
    run(root, &release_env(root), &cargo(), &args)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `script` run as a test command; its output is not echoed, so that this test's own output does not read
    /// as a failed test to whoever runs this crate's tests through [`run_tests`].
    fn failing_run(script: &str) -> anyhow::Result<()> {
        run_reporting_failed_tests(Path::new("."), &[], "sh", &["-c", script], std::io::sink())
    }

    #[test]
    fn a_failed_run_names_its_failed_tests_and_their_panics() {
        let error = failing_run(
            "printf '     Running tests/dra.rs (x)\\ntest prepares ... FAILED\\n\\nfailures:\\n\\n\
             ---- prepares stdout ----\\nthread '\\''prepares'\\'' panicked at tests/tests/dra.rs:7:5:\\nno claim\\n\
             \\nfailures:\\n    prepares\\n'; exit 101",
        )
        .unwrap_err();
        assert_eq!(error.to_string(), "failed tests: prepares");
    }

    #[test]
    fn a_failure_without_a_failed_test_says_so() {
        let error = failing_run("echo 'error: could not compile'; exit 101").unwrap_err();
        assert!(
            error.to_string().contains("with no failed test named"),
            "{error}"
        );
    }

    #[test]
    fn a_passing_run_does_not_wait_for_a_process_that_keeps_the_output_open() {
        // The background sleep holds the pipe after the shell exits, as a process a test leaves running would.
        failing_run("sleep 30 & echo 'test result: ok.'; exit 0").unwrap();
    }
}
