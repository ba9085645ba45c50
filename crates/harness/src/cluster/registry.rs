//! The test cluster's image registry: go-containerregistry's `registry` (built from its Go module, see
//! [`versions::registry`]), an OCI distribution server that keeps what is pushed in memory. It listens on a free
//! port of 127.0.0.1 without TLS and runs as a workload of the cluster, so `cluster down` stops it (and with it
//! everything pushed). `cargo xtask images --push` pushes to it and the real node's containerd pulls from it, as
//! users' nodes pull from theirs.

use std::time::Duration;

use anyhow::Context as _;

use super::controlplane::{self, wait_for};
use super::paths::Layout;
use super::{tools, versions};

/// The workload's name (its log is `logs/registry.log` in the cluster's state directory).
const WORKLOAD: &str = "registry";
/// How long the registry gets to answer once started.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Starts the registry (replacing one started before) and waits until it answers the distribution API's base
/// endpoint; returns its address, `127.0.0.1:<port>`.
pub fn start(layout: &Layout) -> anyhow::Result<String> {
    let binary = tools::ensure_tool(layout, &versions::registry())?.join("registry");
    let port = controlplane::free_ports(1)?[0];
    controlplane::start_workload(
        &layout.state_dir(),
        WORKLOAD,
        &binary,
        &[format!("-port={port}")],
        &[],
    )?;
    let address = format!("127.0.0.1:{port}");
    let base = format!("http://{address}/v2/");
    wait_for("the registry", START_TIMEOUT, &mut [], || {
        let response = ureq::get(&base)
            .call()
            .with_context(|| format!("GET {base}"))?;
        anyhow::ensure!(
            response.status() == 200,
            "GET {base}: {}",
            response.status()
        );
        Ok(())
    })
    .with_context(|| {
        format!(
            "the registry did not start; see {}",
            layout.state_dir().join("logs/registry.log").display()
        )
    })?;
    Ok(address)
}
