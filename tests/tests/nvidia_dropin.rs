//! Drop-in on NVIDIA's own files, against the local cluster with the operator running as a local process with
//! the chart's ServiceAccount: NVIDIA's complete v26.7 values file installs unchanged and its ClusterPolicy
//! becomes ready with this operator's images; the guides' `helm` and `kubectl` commands work in the guides' order
//! on one cluster; NVIDIA's sample ClusterPolicy alone becomes ready. Each test installs the chart its own way and
//! puts the standard install back when it ends, for the suites that follow.

use std::time::Duration;

use e2e::*;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);

/// The DaemonSets of the operands this operator implements itself, which must run its own images.
const OWN_OPERANDS: [&str; 5] = [
    "nvidia-device-plugin-daemonset",
    "gpu-feature-discovery",
    "nvidia-mig-manager",
    "nvidia-dcgm-exporter",
    "nvidia-operator-validator",
];

/// This operator's images, as the operator has them compiled in (the operator runs without the chart's env).
const OWN_REPOSITORY: &str = "ghcr.io/gpu-operator-rs/";

fn fixture_path(name: &str) -> String {
    repo_root()
        .join("tests/fixtures/nvidia")
        .join(name)
        .display()
        .to_string()
}

fn daemonset(name: &str) -> Value {
    kubectl_json(&["get", "daemonset", name, "-n", NAMESPACE])
}

fn main_container(name: &str) -> Value {
    daemonset(name)["spec"]["template"]["spec"]["containers"][0].clone()
}

/// Every operand this operator implements runs its own image.
fn assert_own_images() {
    for name in OWN_OPERANDS {
        let image = main_container(name)["image"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(image.starts_with(OWN_REPOSITORY), "{name} runs {image}");
    }
}

fn component<'a>(policy: &'a Value, name: &str) -> &'a Value {
    policy["status"]["components"]
        .as_array()
        .and_then(|components| components.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no component {name} in {:#}", policy["status"]))
}

fn condition<'a>(policy: &'a Value, type_: &str) -> Option<&'a Value> {
    policy["status"]["conditions"]
        .as_array()
        .and_then(|conditions| conditions.iter().find(|c| c["type"] == type_))
}

/// Waits until the main container of DaemonSet `name` satisfies `check`.
fn wait_for_container(name: &str, what: &str, check: impl Fn(&Value) -> bool) {
    eventually(WAIT, || {
        Ok(run("kubectl", &["get", "daemonset", name, "-n", NAMESPACE])
            .success
            .then(|| main_container(name))
            .filter(|container| check(container)))
    })
    .unwrap_or_else(|e| {
        panic!(
            "DaemonSet {name}: {what}: {e:#}\n{:#}",
            main_container(name)
        )
    });
}

fn args_of(container: &Value) -> String {
    container["args"].to_string()
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn nvidias_complete_values_file_installs_and_runs_our_images() {
    step(
        "helm install -f NVIDIA's v26.7.0 values.yaml, unchanged (nfd.enabled: true, migManager.config.name: \"\")",
    );
    let _install = OwnInstall::start(
        &["-f", &fixture_path("values-v26.7.0.yaml")],
        "e2e-dropin-values",
    );

    step("the ClusterPolicy NVIDIA's values make becomes ready");
    let policy = wait_for_policy_state("cluster-policy", "ready", WAIT);
    // NVIDIA's values name NVIDIA's images for every operand: the CR keeps them as written.
    assert_eq!(policy["spec"]["devicePlugin"]["image"], "k8s-device-plugin");
    assert_eq!(
        policy["spec"]["migManager"]["config"],
        json!({"default": "all-disabled"})
    );

    step("every operand this operator implements runs its own image, and its status says so");
    assert_own_images();
    for (component_name, field) in [
        ("device-plugin", "devicePlugin"),
        ("gpu-feature-discovery", "gfd"),
        ("mig-manager", "migManager"),
        ("dcgm-exporter", "dcgmExporter"),
        ("operator-validator", "validator"),
    ] {
        let warnings = component(&policy, component_name)["warnings"].to_string();
        assert!(
            warnings.contains(&format!(
                "spec.{field} names NVIDIA's image nvcr.io/nvidia/"
            )),
            "{component_name}: {warnings}"
        );
    }
    // Driver and toolkit are NVIDIA's, at the versions NVIDIA's values pin.
    let drivers = kubectl_json(&[
        "get",
        "daemonsets",
        "-n",
        NAMESPACE,
        "-l",
        "app=nvidia-driver-daemonset",
    ]);
    let driver_images: Vec<String> = drivers["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| d["spec"]["template"]["spec"]["containers"][0]["image"].to_string())
        .collect();
    assert!(!driver_images.is_empty());
    assert!(
        driver_images
            .iter()
            .all(|image| image.contains("nvcr.io/nvidia/driver:595.91.07-")),
        "{driver_images:?}"
    );
    assert_eq!(
        main_container("nvidia-container-toolkit-daemonset")["image"],
        "nvcr.io/nvidia/k8s/container-toolkit:v1.20.0"
    );
    // migManager.config.name "" is the built-in geometries, which the chart installed.
    assert!(
        args_of(&main_container("nvidia-mig-manager"))
            .contains(r#""--config-map","default-mig-parted-config""#)
    );
    kubectl(&[
        "get",
        "configmap",
        "default-mig-parted-config",
        "-n",
        NAMESPACE,
    ]);
    // No Node Feature Discovery was deployed although nfd.enabled is true: the node agent's node-facts role runs on
    // every node instead, and publishes the labels the operator needs with only its own ServiceAccount's rights.
    let deployments = kubectl(&["get", "deployments", "-n", NAMESPACE, "-o", "name"]);
    assert_eq!(deployments.trim(), "deployment.apps/gpu-operator");
    node_facts_replace_nfd();
}

/// The chart's node-facts DaemonSet runs the node agent's image on every node, and the role (a local process with
/// the DaemonSet's ServiceAccount, on a host root that says what the node's OS labels say) puts back the NFD label
/// that makes a node a GPU node, and records that it owns it.
fn node_facts_replace_nfd() {
    step("node-facts in place of Node Feature Discovery");
    let daemonset = kubectl_json(&["get", "daemonset", "gpu-node-facts", "-n", NAMESPACE]);
    let pod = &daemonset["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "gpu-node-facts");
    assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
    let container = &pod["containers"][0];
    assert!(
        container["image"]
            .as_str()
            .is_some_and(|image| image.starts_with(&format!("{OWN_REPOSITORY}gpu-node-agent:"))),
        "{container:#}"
    );
    assert_eq!(container["args"][0], "node-facts");

    let node = gpu_node_names().into_iter().next().expect("a GPU node");
    let labels = kubectl_json(&["get", "node", &node])["metadata"]["labels"].clone();
    let label = |name: &str| {
        labels[format!("feature.node.kubernetes.io/{name}")]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let host = scenario_dir("node-facts");
    std::fs::create_dir_all(host.join("etc")).expect("host root");
    std::fs::write(
        host.join("etc/os-release"),
        format!(
            "ID={}\nVERSION_ID=\"{}\"\n",
            label("system-os_release.ID"),
            label("system-os_release.VERSION_ID")
        ),
    )
    .expect("os-release");
    std::fs::write(
        host.join("kernel"),
        format!("{}\n", label("kernel-version.full")),
    )
    .expect("kernel release");
    kubectl(&[
        "label",
        "node",
        &node,
        "feature.node.kubernetes.io/pci-10de.present-",
    ]);

    let agent = agents::NodeAgent::node_facts(&node, &host.join("gpus.json"), &host);
    eventually(WAIT, || {
        let node = kubectl_json(&["get", "node", &node]);
        let present =
            node["metadata"]["labels"]["feature.node.kubernetes.io/pci-10de.present"] == "true";
        let owned = node["metadata"]["annotations"]["nvidia.com/node-facts.labels"]
            .as_str()
            .is_some_and(|owned| owned.contains("pci-10de.present"));
        Ok((present && owned).then_some(()))
    })
    .unwrap_or_else(|e| panic!("node-facts did not label {node}: {e:#}\n{}", agent.output()));
    let after = kubectl_json(&["get", "node", &node])["metadata"]["labels"].clone();
    for name in [
        "system-os_release.ID",
        "system-os_release.VERSION_ID",
        "kernel-version.full",
    ] {
        let key = format!("feature.node.kubernetes.io/{name}");
        assert_eq!(
            after[&key],
            labels[&key],
            "{key} changed: {}",
            agent.output()
        );
    }
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn the_guides_commands_work_in_order() {
    // The guide's command, character for character; OwnInstall runs it as `helm install --wait gpu-operator -n
    // gpu-operator --create-namespace <chart> --set driver.enabled=false --set nfd.enabled=false`.
    step("helm install --wait ... --set driver.enabled=false --set nfd.enabled=false");
    assert_eq!((RELEASE, NAMESPACE), ("gpu-operator", "gpu-operator"));
    let _install = OwnInstall::start(
        &[
            "--set",
            "driver.enabled=false",
            "--set",
            "nfd.enabled=false",
        ],
        "e2e-dropin-guides",
    );
    wait_for_policy_state("cluster-policy", "ready", WAIT);

    step("time-slicing: the ConfigMap with key `any`, then the guide's patch with default any");
    let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "time-slicing-config-all", "namespace": NAMESPACE},
        "data": {"any": "version: v1\nflags:\n  migStrategy: none\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"}});
    let created = kubectl_apply(&config_map.to_string(), &[]);
    assert!(created.success, "{}", created.stderr);
    guide_patch(
        r#"{"spec": {"devicePlugin": {"config": {"name": "time-slicing-config-all", "default": "any"}}}}"#,
    );
    wait_for_container(
        "nvidia-device-plugin-daemonset",
        "reads the ConfigMap",
        |c| {
            args_of(c)
                .contains(r#""--config-map","time-slicing-config-all","--default-config","any""#)
        },
    );
    wait_for_policy_state("cluster-policy", "ready", WAIT);

    step("the AKS guide's removal patch, right after: name \"\" while default is still any");
    guide_patch(r#"{"spec": {"devicePlugin": {"config": {"name": ""}}}}"#);
    wait_for_container(
        "nvidia-device-plugin-daemonset",
        "runs without a ConfigMap",
        |c| !args_of(c).contains("--config-map"),
    );
    let policy = wait_for_policy_state("cluster-policy", "ready", WAIT);
    assert_eq!(
        policy["spec"]["devicePlugin"]["config"],
        json!({"name": "", "default": "any"})
    );
    let warnings = condition(&policy, "Warnings").expect("a Warnings condition");
    assert!(
        warnings["message"].as_str().unwrap_or_default().contains(
            "spec.devicePlugin.config.default is \"any\" but spec.devicePlugin.config.name is empty"
        ),
        "{warnings:#}"
    );

    step("MIG on clouds: the WITH_REBOOT patch");
    guide_patch(r#"{"spec": {"migManager": {"env": [{"name": "WITH_REBOOT", "value": "true"}]}}}"#);
    wait_for_container("nvidia-mig-manager", "has WITH_REBOOT=true", |c| {
        c["env"]
            .as_array()
            .is_some_and(|env| env.contains(&json!({"name": "WITH_REBOOT", "value": "true"})))
    });

    step("node labels: a device-plugin config and a MIG config per node");
    let nodes = gpu_node_names();
    let node = nodes.first().expect("a GPU node");
    kubectl(&[
        "label",
        "node",
        node,
        "nvidia.com/device-plugin.config=slice-4",
    ]);
    kubectl(&[
        "label",
        "node",
        node,
        "nvidia.com/mig.config=all-1g.10gb",
        "--overwrite",
    ]);
    let labels = kubectl_json(&["get", "node", node])["metadata"]["labels"].clone();
    assert_eq!(labels["nvidia.com/device-plugin.config"], "slice-4");
    assert_eq!(labels["nvidia.com/mig.config"], "all-1g.10gb");
    // Leave the node as the other suites expect it.
    kubectl(&[
        "label",
        "node",
        node,
        "nvidia.com/device-plugin.config-",
        "nvidia.com/mig.config=all-disabled",
        "--overwrite",
    ]);
    kubectl(&[
        "delete",
        "configmap",
        "time-slicing-config-all",
        "-n",
        NAMESPACE,
    ]);
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn nvidias_sample_cluster_policy_alone_becomes_ready() {
    step(
        "the chart without its ClusterPolicy (clusterPolicy.deployCR=false, as in NVIDIA's chart)",
    );
    let _install = OwnInstall::start(
        &["--set", "clusterPolicy.deployCR=false"],
        "e2e-dropin-sample",
    );
    let policies = kubectl(&["get", "clusterpolicies", "-o", "name"]);
    assert!(policies.trim().is_empty(), "{policies}");

    step("kubectl apply -f NVIDIA's config/samples/v1_clusterpolicy.yaml");
    let manifest = std::fs::read_to_string(fixture_path("sample-clusterpolicy.yaml"))
        .expect("the sample fixture");
    let applied = kubectl_apply(&manifest, &[]);
    assert!(applied.success, "{}", applied.stderr);
    let policy = wait_for_policy_state("gpu-cluster-policy", "ready", WAIT);
    // No image field anywhere: the built-in images run every operand it enables.
    assert_own_images();
    assert_eq!(
        main_container("nvidia-dcgm")["image"],
        "nvcr.io/nvidia/cloud-native/dcgm:4.6.0-1-ubuntu24.04"
    );
    // vGPU and VFIO are enabled in the sample but sandbox workloads are not: nothing is deployed or reported.
    assert!(
        condition(&policy, "Unsupported").is_none(),
        "{:#}",
        policy["status"]
    );
}

/// The objects `helm template` renders from NVIDIA's values file plus `extra` values given as YAML.
fn template_with_nvidias_values(extra: &str) -> Vec<Value> {
    let path = std::env::temp_dir().join(format!("dropin-values-{}.yaml", std::process::id()));
    std::fs::write(&path, extra).expect("write the extra values");
    let chart = chart_dir();
    let out = ok(
        "helm",
        &[
            "template",
            RELEASE,
            &chart,
            "-n",
            NAMESPACE,
            "-f",
            &fixture_path("values-v26.7.0.yaml"),
            "-f",
            &path.display().to_string(),
        ],
    );
    serde_saphyr::from_multiple::<Value>(&out)
        .expect("helm template prints YAML")
        .into_iter()
        .filter(|object| !object.is_null())
        .collect()
}

#[test]
#[ignore = "needs the local cluster's helm: run `cargo xtask e2e`"]
fn nvidias_config_map_values_create_config_maps() {
    // The layouts of NVIDIA's values file: the metrics CSV as text, the MIG ConfigMap's data with key config.yaml.
    let objects = template_with_nvidias_values(
        "dcgmExporter:\n  config:\n    name: custom-dcgm-exporter-metrics\n    create: true\n    data: |-\n      DCGM_FI_DEV_SM_CLOCK, gauge, SM clock frequency (in MHz).\n\
         migManager:\n  config:\n    name: custom-mig-parted-configs\n    create: true\n    data:\n      config.yaml: |-\n        version: v1\n        mig-configs:\n          all-disabled:\n            - devices: all\n              mig-enabled: false\n",
    );
    let config_map = |name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no ConfigMap {name}"))
            .clone()
    };
    assert_eq!(
        config_map("custom-dcgm-exporter-metrics")["data"]["dcgm-metrics.csv"],
        "DCGM_FI_DEV_SM_CLOCK, gauge, SM clock frequency (in MHz)."
    );
    assert!(
        config_map("custom-mig-parted-configs")["data"]["config.yaml"]
            .as_str()
            .unwrap_or_default()
            .starts_with("version: v1\nmig-configs:")
    );
    // The built-in geometries stay installed for nodes of other policies.
    config_map("default-mig-parted-config");
    let policy = objects
        .iter()
        .find(|o| o["kind"] == "ClusterPolicy")
        .expect("the ClusterPolicy");
    assert_eq!(
        policy["spec"]["dcgmExporter"]["config"],
        json!({"name": "custom-dcgm-exporter-metrics"})
    );
    assert_eq!(
        policy["spec"]["migManager"]["config"],
        json!({"name": "custom-mig-parted-configs", "default": "all-disabled"})
    );
}
