//! Compiles the kubelet's PodResources API with protox, a protobuf compiler in Rust, so that building needs nothing
//! outside crates.io (no system `protoc`).
//!
//! Of PodResources the agent is only a client. Its server side is generated apart, into `server/`, and included by
//! the tests alone (they answer the client from a fake kubelet): a build script cannot tell a test build from
//! another, and a server compiled into the agent would be dead code.

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
    Ok(())
}
