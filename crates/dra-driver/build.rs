//! Compiles the kubelet's APIs with protox, a protobuf compiler in Rust, so that building needs nothing outside
//! crates.io (no system `protoc`).
//!
//! Of the DRA plugin, DRA health and plugin registration APIs the driver is the server; their clients are generated
//! too, for the tests, which play the kubelet, and for the benchmark's `prepare_latency` example.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let served = ["proto/dra.proto", "proto/pluginregistration.proto"];
    for proto in served {
        println!("cargo:rerun-if-changed={proto}");
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(protox::compile(served, ["proto"])?)?;
    // The health API's package is a bare `v1` (PodResources' is too): it goes to a folder of its own, where no other
    // API's `v1.rs` can land.
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
