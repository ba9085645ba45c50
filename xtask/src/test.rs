//! `cargo xtask test`: every check and test of the project, in the order a failure is cheapest to find.
//! This is the README's test command and what CI runs.

use std::path::Path;

use crate::{cluster, command, crdgen, deny, e2e, images};

pub fn run(root: &Path) -> anyhow::Result<()> {
    let cargo = command::cargo();
    step("formatting");
    command::run(root, &[], &cargo, &["fmt", "--all", "--", "--check"])?;
    step("dependencies: licences, bans and sources (cargo-deny)");
    deny::run(root)?;
    step("generated CRDs match the Rust types");
    crdgen::run(true)?;
    step("clippy");
    command::run(
        root,
        &[],
        &cargo,
        &[
            "clippy",
            "--locked",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    step("unit tests");
    command::run(root, &[], &cargo, &["test", "--locked", "--workspace"])?;
    step("container images (release builds; each binary started in its image)");
    images::run(root, &images::Args::default())?;
    step("helm lint (helm is built with the cluster's tools)");
    let info = cluster::ensure_up()?;
    let chart = root.join("charts/gpu-operator").display().to_string();
    command::run(
        root,
        &cluster::env_vars(&info),
        "helm",
        &["lint", "--strict", &chart],
    )?;
    step("end-to-end tests against the local cluster");
    e2e::run(root, false, false, None)?;
    step("end-to-end tests on the real node (containerd, images built here)");
    e2e::run(root, false, true, None)
}

fn step(name: &str) {
    println!("\n=== {name}");
}
