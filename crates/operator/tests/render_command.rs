//! `gpu-operator render` as users run it: a policy file and a nodes file in, every object out.

use std::process::{Command, Output};

fn repo_file(path: &str) -> String {
    format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"))
}

fn render(policy: &str, nodes: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
        .args(["render", "--policy", policy, "--nodes", nodes])
        .output()
        .expect("run gpu-operator render")
}

#[test]
fn two_os_pools_render_two_driver_daemonsets() {
    let output = render(
        &repo_file("tests/fixtures/nvidia-clusterpolicy.yaml"),
        &repo_file("tests/fixtures/nodes-two-os.yaml"),
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let objects: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&String::from_utf8_lossy(&output.stdout))
            .expect("render prints YAML documents");
    let drivers: Vec<(&str, &str)> = objects
        .iter()
        .filter(|o| {
            o["kind"] == "DaemonSet" && o["metadata"]["labels"]["app"] == "nvidia-driver-daemonset"
        })
        .map(|o| {
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            let image = o["spec"]["template"]["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap_or_default();
            (name, image)
        })
        .collect();
    assert_eq!(
        drivers,
        [
            (
                "nvidia-driver-daemonset-rhel9.4",
                "nvcr.io/nvidia/driver:570.172.08-rhel9.4"
            ),
            (
                "nvidia-driver-daemonset-ubuntu22.04",
                "nvcr.io/nvidia/driver:570.172.08-ubuntu22.04"
            ),
        ]
    );
}

#[test]
fn an_invalid_policy_names_the_field() {
    let dir = std::env::temp_dir().join(format!("render-invalid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let policy = dir.join("policy.yaml");
    let text = "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: p}\nspec:\n  mig: {strategy: both}\n";
    std::fs::write(&policy, text).expect("write policy");
    let output = render(
        &policy.display().to_string(),
        &repo_file("tests/fixtures/nodes-two-os.yaml"),
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "spec.mig.strategy: \"both\" is not a MIG strategy: use none, single or mixed"
        ),
        "{stderr}"
    );
}
