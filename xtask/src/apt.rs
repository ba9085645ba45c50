//! Debian packages that xtask's tasks need on the machine (the real node's container runtime, the plots' font).

use std::path::Path;
use std::process::Command;

use anyhow::Context as _;

use crate::cluster::progress;

/// Installs those of `packages` (name, a file it provides) whose file is missing, with `apt-get update` first,
/// since a fresh machine has no package lists.
pub fn ensure(packages: &[(&str, &str)]) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .filter(|(_, file)| !Path::new(file).exists())
        .map(|(package, _)| *package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    progress::step(&format!("apt-get install {}", missing.join(" ")), |_| {
        let apt = |args: &[&str]| -> anyhow::Result<()> {
            let output = Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .output()
                .context("cannot run apt-get: this task needs Debian's (or Ubuntu's) packages")?;
            anyhow::ensure!(
                output.status.success(),
                "apt-get {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr)
            );
            Ok(())
        };
        apt(&["update", "-q"])?;
        let mut install = vec!["install", "-y", "-q", "--no-install-recommends"];
        install.extend(&missing);
        apt(&install)
    })
}
