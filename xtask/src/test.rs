//! `cargo xtask test`: every check and test of the project, in the order a failure is cheapest to find.
//! This is the README's test command and what CI runs.

use std::path::Path;

use crate::{chart, crdgen, deny, e2e};
use harness::{cluster, command, images};

pub fn run(root: &Path) -> anyhow::Result<()> {
    let cargo = command::cargo();
    step("formatting");
    command::run(root, &[], &cargo, &["fmt", "--all", "--", "--check"])?;
    step("dependencies: licences, bans and sources (cargo-deny)");
    deny::run(root)?;
    step("generated files (CRDs, values schema, MIG geometries) match their Rust sources");
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
    command::run_tests(root, &[], &["test", "--locked", "--workspace"])?;
    step(
        "the Helm chart: lint, values schema, DRA objects per Kubernetes version, labels (helm is built with the cluster's tools; no cluster)",
    );
    chart::check(root, &cluster::tools_env()?)?;
    step("end-to-end tests against the local cluster (the images' build beside them)");
    let log = cluster::paths::Layout::from_env()?
        .root
        .join("logs/images-build.log");
    let images_build = images::build_in_background(root, e2e::IMAGES_PROFILE, &log)?;
    if let Err(error) = e2e::run(root, false, false, None) {
        images_build.cancel();
        return Err(error);
    }
    images_build.finish()?;
    step(
        "end-to-end tests on the real node (the images assembled, each binary started in its image, pushed to the \
         cluster's registry and pulled by containerd)",
    );
    e2e::run(root, false, true, None)
}

fn step(name: &str) {
    println!("\n=== {name}");
}
