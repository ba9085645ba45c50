//! Debian packages that xtask's tasks need on the machine (the real node's container runtime, the plots' font, the
//! arm64 cross toolchain and qemu-user for the images), and the foreign architectures whose packages the images'
//! userlands are assembled from.

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
        output("apt-get", &["update", "-q"])?;
        let mut install = vec!["install", "-y", "-q", "--no-install-recommends"];
        install.extend(&missing);
        output("apt-get", &install).map(drop)
    })
}

/// Adds Debian architecture `architecture` (e.g. `arm64`) to dpkg's foreign architectures, so that apt offers its
/// packages (`apt-get download libc6:arm64`), and updates the package lists when it was missing. Nothing of that
/// architecture is installed by this.
pub fn ensure_architecture(architecture: &str) -> anyhow::Result<()> {
    let native = output("dpkg", &["--print-architecture"])?;
    let foreign = output("dpkg", &["--print-foreign-architectures"])?;
    if native.trim() == architecture
        || foreign
            .split_whitespace()
            .any(|known| known == architecture)
    {
        return Ok(());
    }
    progress::step(
        &format!("dpkg --add-architecture {architecture}; apt-get update"),
        |_| {
            output("dpkg", &["--add-architecture", architecture])?;
            output("apt-get", &["update", "-q"]).map(drop)
        },
    )
}

fn output(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(program)
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .with_context(|| {
            format!("cannot run {program}: this task needs Debian's (or Ubuntu's) packages")
        })?;
    anyhow::ensure!(
        output.status.success(),
        "{program} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
