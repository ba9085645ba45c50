//! Compiles the kubelet's APIs with protox, a protobuf compiler in Rust, so that building needs nothing outside
//! crates.io (no system `protoc`).
//!
//! Of PodResources the agent is only a client. Its server side is generated apart, into `server/`, and included by
//! the tests alone (they answer the client from a fake kubelet): a build script cannot tell a test build from
//! another, and a server compiled into the agent would be dead code. Of the DRA plugin, DRA health and plugin
//! registration APIs the agent is the server (the DRA driver role); their clients are generated for the tests, which
//! play the kubelet.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/podresources.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    let server = PathBuf::from(std::env::var("OUT_DIR")?).join("server");
    std::fs::create_dir_all(&server)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(descriptors.clone())?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .out_dir(server)
        .compile_fds(descriptors)?;
    let served = ["proto/dra.proto", "proto/pluginregistration.proto"];
    for proto in served {
        println!("cargo:rerun-if-changed={proto}");
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(protox::compile(served, ["proto"])?)?;
    // The health API's package is `v1`, as PodResources' is: it goes to a folder of its own.
    let health = "proto/dra_health.proto";
    println!("cargo:rerun-if-changed={health}");
    let health_out = PathBuf::from(std::env::var("OUT_DIR")?).join("dra_health");
    std::fs::create_dir_all(&health_out)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .out_dir(health_out)
        .compile_fds(protox::compile([health], ["proto"])?)?;
    Ok(())
}
