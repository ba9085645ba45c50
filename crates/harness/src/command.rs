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
