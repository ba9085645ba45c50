//! Running the tools a task needs (cargo, helm, kubectl), echoing each command so CI logs show what ran.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};

/// Runs `program args...` in `dir` with extra environment, streaming its output; fails when it fails.
pub fn run(
    dir: &Path,
    env: &[(String, String)],
    program: &str,
    args: &[&str],
) -> anyhow::Result<()> {
    println!("$ {program} {}", args.join(" "));
    let status = Command::new(program)
        .args(args)
        .current_dir(dir)
        .envs(env.iter().map(|(key, value)| (key, value)))
        .status()
        .with_context(|| format!("cannot start {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed ({status})", args.join(" "));
    }
    Ok(())
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
