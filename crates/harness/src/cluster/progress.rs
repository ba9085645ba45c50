//! Telling a person (or a CI log) which step runs, for how long, and what the tool it runs last said.
//!
//! Everything goes to stderr, so that stdout stays clean for `eval "$(cargo xtask cluster env)"`. On a terminal a
//! spinner shows the step, its elapsed time and the last line of output; elsewhere plain lines are printed: one when
//! a step starts, one every [`HEARTBEAT`] with the last line of output, and one when it ends.

use std::fs::File;
use std::io::{BufRead as _, BufReader, IsTerminal as _, Read, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};

/// How often a non-interactive step says it is still running.
const HEARTBEAT: Duration = Duration::from_secs(30);
/// How many lines of a failed command's output an error shows.
const TAIL_LINES: usize = 25;

/// Prints a message line, above any running spinner.
pub fn say(message: impl AsRef<str>) {
    eprintln!("{}", message.as_ref());
}

/// Runs `work` as a named step with a spinner (terminal) or start/end lines (anything else).
pub fn step<T>(name: &str, work: impl FnOnce(&Step) -> anyhow::Result<T>) -> anyhow::Result<T> {
    let step = Step::start(name);
    let result = work(&step);
    step.finish(result.is_ok());
    result
}

/// One running step.
#[derive(Debug)]
pub struct Step {
    name: String,
    started: Instant,
    spinner: Option<ProgressBar>,
    last_heartbeat: std::cell::Cell<Instant>,
}

impl Step {
    fn start(name: &str) -> Self {
        let spinner = std::io::stderr().is_terminal().then(|| {
            let spinner = ProgressBar::new_spinner();
            let style = ProgressStyle::with_template(
                "{spinner:.cyan} {prefix:.bold} [{elapsed}] {wide_msg:.dim}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
            spinner.set_style(style);
            spinner.set_prefix(name.to_owned());
            spinner.enable_steady_tick(Duration::from_millis(120));
            spinner
        });
        if spinner.is_none() {
            say(format!("==> {name}"));
        }
        let now = Instant::now();
        Self {
            name: name.to_owned(),
            started: now,
            spinner,
            last_heartbeat: std::cell::Cell::new(now),
        }
    }

    /// Shows `line` as the latest thing that happened in this step.
    pub fn update(&self, line: &str) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        match &self.spinner {
            Some(spinner) => spinner.set_message(line.to_owned()),
            None if self.last_heartbeat.get().elapsed() >= HEARTBEAT => {
                self.last_heartbeat.set(Instant::now());
                say(format!(
                    "    ... {} still running ({}s): {line}",
                    self.name,
                    self.started.elapsed().as_secs()
                ));
            }
            None => {}
        }
    }

    fn finish(self, ok: bool) {
        let elapsed = self.started.elapsed().as_secs_f64();
        let mark = if ok { "done" } else { "FAILED" };
        let line = format!("{mark}: {} ({elapsed:.1}s)", self.name);
        match self.spinner {
            Some(spinner) => {
                spinner.finish_and_clear();
                say(if ok {
                    format!("✓ {} ({elapsed:.1}s)", self.name)
                } else {
                    format!("✗ {line}")
                });
            }
            None => say(format!("    {line}")),
        }
    }

    /// Runs `command` to completion, copying its stdout and stderr into `log` (appended) and showing each line as
    /// progress. A failure names the command, its exit status, the last lines of output, and the log file.
    pub fn run(&self, command: &mut Command, log: &Path) -> anyhow::Result<()> {
        let shown = describe(command);
        let mut log_file = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("cannot open log file {}", log.display()))?;
        writeln!(log_file, "$ {shown}")?;
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start `{shown}`"))?;
        let (sender, lines) = mpsc::channel();
        let readers = [
            child
                .stdout
                .take()
                .map(|out| forward_lines(out, sender.clone())),
            child.stderr.take().map(|err| forward_lines(err, sender)),
        ];
        let mut tail = std::collections::VecDeque::with_capacity(TAIL_LINES);
        loop {
            match lines.recv_timeout(Duration::from_millis(200)) {
                Ok(line) => {
                    writeln!(log_file, "{line}")?;
                    self.update(&line);
                    if tail.len() == TAIL_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => self.update(""),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        for reader in readers.into_iter().flatten() {
            // A reader thread only ends when its pipe closes; its panics would be bugs in this file.
            let _ = reader.join();
        }
        let status = child
            .wait()
            .with_context(|| format!("cannot wait for `{shown}`"))?;
        if status.success() {
            return Ok(());
        }
        let tail = tail.into_iter().collect::<Vec<_>>().join("\n");
        anyhow::bail!(
            "`{shown}` failed ({status}); last lines of output:\n{tail}\n(full log: {})",
            log.display()
        )
    }
}

fn forward_lines(
    stream: impl Read + Send + 'static,
    sender: mpsc::Sender<String>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    })
}

/// `program arg arg ...` for messages.
pub fn describe(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|part| part.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The last `lines` lines of a log file, for error messages (empty when it cannot be read).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read(path)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_logs_output_and_reports_failures_with_the_tail() {
        let dir = std::env::temp_dir().join(format!("xtask-progress-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("run.log");
        step("echo", |step| {
            step.run(
                Command::new("sh").args(["-c", "echo out; echo err >&2"]),
                &log,
            )
        })
        .unwrap();
        let logged = std::fs::read_to_string(&log).unwrap();
        assert!(logged.contains("out") && logged.contains("err"), "{logged}");

        let error = step("fail", |step| {
            step.run(Command::new("sh").args(["-c", "echo boom; exit 3"]), &log)
        })
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("sh -c echo boom; exit 3") && error.contains("boom"),
            "{error}"
        );
        assert!(error.contains(&log.display().to_string()), "{error}");
        assert_eq!(log_tail(&log, 1), "boom");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
