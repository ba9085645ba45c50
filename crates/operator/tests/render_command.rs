//! `gpu-operator render` as users run it: a policy file and a nodes file in, every object out.

use std::process::{Command, Output};

use operator::model::DefaultImages;

fn repo_file(path: &str) -> String {
    format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"))
}

fn render(policy: &str, nodes: &str) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpu-operator"));
    command.args(["render", "--policy", policy, "--nodes", nodes]);
    // The variables that override the built-in images, cleared so that the built-in ones are what is tested.
    for variable in DefaultImages::VARIABLES {
        command.env_remove(variable);
    }
    command.output().expect("run gpu-operator render")
}

/// The objects `render` printed, which must have succeeded.
fn rendered(output: &Output) -> Vec<serde_json::Value> {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_saphyr::from_multiple(&String::from_utf8_lossy(&output.stdout))
        .expect("render prints YAML documents")
}

/// `(DaemonSet name, main container image)` of every DaemonSet, in the printed order.
fn daemonset_images(objects: &[serde_json::Value]) -> Vec<(String, String)> {
    objects
        .iter()
        .filter(|o| o["kind"] == "DaemonSet")
        .map(|o| {
            (
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                o["spec"]["template"]["spec"]["containers"][0]["image"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

/// NVIDIA's own sample ClusterPolicy names no image at all: the built-in images render every operand it
/// enables (NVIDIA's pinned driver and toolkit, this operator's own images for the rest).
#[test]
fn nvidias_sample_policy_renders_every_operand() {
    let output = render(
        &repo_file("tests/fixtures/nvidia/sample-clusterpolicy.yaml"),
        &repo_file("tests/fixtures/nodes-two-os.yaml"),
    );
    let objects = rendered(&output);
    let version = env!("CARGO_PKG_VERSION");
    let agent = format!("ghcr.io/gpu-operator-rs/gpu-node-agent:{version}");
    let plugin = format!("ghcr.io/gpu-operator-rs/gpu-device-plugin:{version}");
    let expected: Vec<(String, String)> = [
        (
            "nvidia-driver-daemonset-rhel9.4",
            "nvcr.io/nvidia/driver:595.91.07-rhel9.4",
        ),
        (
            "nvidia-driver-daemonset-ubuntu22.04",
            "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04",
        ),
        (
            "nvidia-container-toolkit-daemonset",
            "nvcr.io/nvidia/k8s/container-toolkit:v1.20.0",
        ),
        ("nvidia-operator-validator", agent.as_str()),
        ("nvidia-device-plugin-daemonset", plugin.as_str()),
        ("gpu-feature-discovery", agent.as_str()),
        (
            "nvidia-dcgm",
            "nvcr.io/nvidia/cloud-native/dcgm:4.6.0-1-ubuntu24.04",
        ),
        ("nvidia-dcgm-exporter", agent.as_str()),
        ("nvidia-mig-manager", agent.as_str()),
    ]
    .into_iter()
    .map(|(name, image)| (name.to_owned(), image.to_owned()))
    .collect();
    assert_eq!(daemonset_images(&objects), expected);
    // `migManager.config.name: ""`: the built-in geometries.
    let mig_manager = objects
        .iter()
        .find(|o| o["metadata"]["name"] == "nvidia-mig-manager")
        .expect("MIG manager");
    let command = mig_manager["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(
        command.contains(r#""--config-map","default-mig-parted-config""#),
        "{command}"
    );
    // Nothing in the sample needs a warning.
    assert!(
        output.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A ClusterPolicy as NVIDIA's chart makes it names NVIDIA's images: the operands this operator implements run
/// its own, and `render` says so for each.
#[test]
fn nvidias_images_are_replaced_with_a_warning_each() {
    let dir = std::env::temp_dir().join(format!("render-nvidia-images-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let policy = dir.join("policy.yaml");
    let text = "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: p}\nspec:\n  \
        devicePlugin: {repository: nvcr.io/nvidia, image: k8s-device-plugin, version: v0.20.0}\n  \
        migManager: {repository: nvcr.io/nvidia/cloud-native, image: k8s-mig-manager, version: v0.15.0}\n";
    std::fs::write(&policy, text).expect("write policy");
    let output = render(
        &policy.display().to_string(),
        &repo_file("tests/fixtures/nodes-two-os.yaml"),
    );
    let images = daemonset_images(&rendered(&output));
    let version = env!("CARGO_PKG_VERSION");
    for (name, image) in [
        ("nvidia-device-plugin-daemonset", "gpu-device-plugin"),
        ("nvidia-mig-manager", "gpu-node-agent"),
    ] {
        assert!(
            images.contains(&(
                name.to_owned(),
                format!("ghcr.io/gpu-operator-rs/{image}:{version}")
            )),
            "{images:?}"
        );
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 2, "{stderr}");
    assert!(
        stderr.contains("warning: spec.devicePlugin names NVIDIA's image nvcr.io/nvidia/k8s-device-plugin:v0.20.0"),
        "{stderr}"
    );
    assert!(
        stderr.contains("warning: spec.migManager names NVIDIA's image nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.15.0"),
        "{stderr}"
    );
}

#[test]
fn two_os_pools_render_two_driver_daemonsets() {
    let output = render(
        &repo_file("tests/fixtures/nvidia-clusterpolicy.yaml"),
        &repo_file("tests/fixtures/nodes-two-os.yaml"),
    );
    let drivers: Vec<(String, String)> = daemonset_images(&rendered(&output))
        .into_iter()
        .filter(|(name, _)| name.starts_with("nvidia-driver-daemonset"))
        .collect();
    assert_eq!(
        drivers,
        [
            (
                "nvidia-driver-daemonset-rhel9.4".to_owned(),
                "nvcr.io/nvidia/driver:570.172.08-rhel9.4".to_owned()
            ),
            (
                "nvidia-driver-daemonset-ubuntu22.04".to_owned(),
                "nvcr.io/nvidia/driver:570.172.08-ubuntu22.04".to_owned()
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
