//! `cargo xtask deny` (a step of `cargo xtask test`): cargo-deny checks the dependency tree against `deny.toml` —
//! licences, banned or wildcard dependencies, and where crates come from. cargo-deny is pinned and built into the
//! cache on first use, so CI needs nothing installed beforehand and a version bump installs the new one beside the
//! old.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;

use harness::cluster::paths::{self, Layout};
use harness::cluster::progress;
use harness::command;

/// The cargo-deny release used (needs Rust 1.88).
const VERSION: &str = "0.20.2";

/// The checks run. `advisories` is not among them: it clones the RustSec advisory database from GitHub, which the
/// CI machines cannot reach ("failed to fetch advisory database https://github.com/RustSec/advisory-db with cli:
/// failed to clone ... fatal: unable to access 'https://github.com/RustSec/advisory-db/': Could not resolve host:
/// github.com"), so it would fail every run.
const CHECKS: [&str; 3] = ["licenses", "bans", "sources"];

pub fn run(root: &Path) -> anyhow::Result<()> {
    let binary = ensure_installed(&Layout::from_env()?)?;
    let mut args = vec![
        // Checks the tree as Cargo.lock has it; the lock file is never updated on the way.
        "--locked",
        "check",
        // A duplicate's reverse dependency tree is dozens of lines each; the lock file entries name it well enough.
        "--hide-inclusion-graph",
    ];
    args.extend(CHECKS);
    command::run(root, &[], &binary.display().to_string(), &args)
}

/// `<cache>/tools/cargo-deny-<version>/bin/cargo-deny`, installed with `cargo install` when missing.
fn ensure_installed(layout: &Layout) -> anyhow::Result<PathBuf> {
    let install_root = layout
        .root
        .join("tools")
        .join(format!("cargo-deny-{VERSION}"));
    // cargo install moves the binary into place only once it is built, so its presence means a complete install.
    let binary = install_root.join("bin").join("cargo-deny");
    if binary.exists() {
        return Ok(binary);
    }
    let logs = layout.root.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    let log = logs.join(format!("install-cargo-deny-{VERSION}.log"));
    // Its own target directory: in the shared CARGO_TARGET_DIR its release build would sit beside the project's
    // release builds; here it is removed once installed.
    let target_dir = paths::with_suffix(&install_root, ".build");
    progress::step(
        &format!("cargo install cargo-deny {VERSION} (once per version)"),
        |step| {
            let mut install = Command::new(command::cargo());
            install
                .args(["install", "cargo-deny", "--locked", "--version", VERSION])
                .arg("--root")
                .arg(&install_root)
                .arg("--target-dir")
                .arg(&target_dir)
                // cargo-deny's release profile asks for fat LTO in one codegen unit, which makes its last crate a
                // single-threaded build of several minutes; a checker run once per CI job gains nothing from it.
                .env("CARGO_PROFILE_RELEASE_LTO", "false")
                .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16")
                // Its checks take seconds whatever the optimisation; its cold build is what CI waits for.
                .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "1");
            step.run(&mut install, &log)
        },
    )?;
    std::fs::remove_dir_all(&target_dir)
        .with_context(|| format!("cannot remove {}", target_dir.display()))?;
    Ok(binary)
}
