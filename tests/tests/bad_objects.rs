//! Objects the operator could not read are refused by the API server: every integer of the CRDs is bounded as its
//! Rust type (`crd::crds`), so a GPUNode status with a count past that range is never stored, where it would fail
//! every list of GPUNodes the operator's watch makes. (The operator also leaves out and reports an object that
//! still cannot be read, e.g. one stored under an older schema: `controller::guarded`'s unit tests.)

use std::process::Command;

use e2e::*;
use serde_json::{Value, json};

const GPU_NODE: &str = "e2e-bad-objects";

/// Deletes the test's GPUNode when dropped, also when an assertion fails.
struct TestGpuNode;

impl Drop for TestGpuNode {
    fn drop(&mut self) {
        clean_up(&["gpunode", GPU_NODE]);
    }
}

/// `kubectl patch gpunode <GPU_NODE> --subresource=status` with a merge patch of `status`.
fn patch_status(status: &Value) -> Run {
    run(
        "kubectl",
        &[
            "patch",
            "gpunode",
            GPU_NODE,
            "--subresource=status",
            "--type=merge",
            "-p",
            &json!({ "status": status }).to_string(),
        ],
    )
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn api_server_refuses_a_gpu_node_status_out_of_its_rust_range() {
    chart_installed();
    // This checkout's CRDs, applied as the operator applies them at start with the chart's RBAC: a cluster that
    // was installed earlier may hold an older schema, which `helm upgrade` leaves alone.
    let applied: Run = Command::new(operator_bin())
        .args(["crd", "apply"])
        .env("KUBECONFIG", service_account_kubeconfig("gpu-operator"))
        .output()
        .expect("start gpu-operator")
        .into();
    assert!(
        applied.success,
        "gpu-operator crd apply: {}",
        applied.stderr
    );

    let _gpu_node = TestGpuNode;
    let manifest = json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUNode",
        "metadata": {"name": GPU_NODE}, "spec": {}});
    let created = kubectl_apply(&manifest.to_string(), &[]);
    assert!(created.success, "GPUNode not created: {}", created.stderr);
    // The largest values each type holds are stored: what follows is refused for its bounds alone.
    let in_range =
        json!({"gpuCount": 2_147_483_647, "devicePlugin": {"unhealthyGpus": [4_294_967_295_u32]}});
    let accepted = patch_status(&in_range);
    assert!(
        accepted.success,
        "in-range status refused: {}",
        accepted.stderr
    );

    let cases = [
        // i32
        (
            json!({"gpuCount": 4_294_967_296_u64}),
            "status.gpuCount",
            "2147483647",
        ),
        // Vec<u32>
        (
            json!({"devicePlugin": {"unhealthyGpus": [4_294_967_296_u64]}}),
            "status.devicePlugin.unhealthyGpus[0]",
            "4294967295",
        ),
    ];
    for (status, field, maximum) in cases {
        let refused = patch_status(&status);
        assert!(
            !refused.success
                && refused.stderr.contains(field)
                && refused
                    .stderr
                    .contains(&format!("less than or equal to {maximum}")),
            "{status} was not refused for {field} above {maximum}: success={} stderr={}",
            refused.success,
            refused.stderr
        );
    }
    let stored = kubectl_json(&["get", "gpunode", GPU_NODE]);
    assert_eq!(stored["status"]["gpuCount"], json!(2_147_483_647));
}
