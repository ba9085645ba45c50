//! Compiles the kubelet's device plugin API with protox, a protobuf compiler in Rust, so that building needs nothing
//! outside crates.io (no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/deviceplugin.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
