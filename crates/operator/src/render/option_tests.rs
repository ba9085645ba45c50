//! One golden snapshot per class of option that changes the rendered objects, with the essential facts also
//! asserted in code so that a wrongly accepted snapshot cannot hide them.

use serde_json::{Value, json};

use super::fixture::{
    container, default_images, env_value, facts, host_path_of, names, node, objects_of, one_node,
    policy, policy_with, render_component, snapshot,
};
use super::render;
use crate::model::facts::RUNTIME_LABEL;
use crate::model::{AssignedDriver, Component, ContainerRuntime};

#[test]
fn two_os_pools_get_one_driver_each() {
    let facts = facts([
        node("gpu-a"),
        node("gpu-b").os("rhel", "9.4"),
        node("gpu-c"),
    ]);
    let drivers = render_component(json!({}), &facts, Component::Driver);
    assert_eq!(
        names(&drivers),
        [
            "nvidia-driver-daemonset-rhel9.4",
            "nvidia-driver-daemonset-ubuntu22.04"
        ]
    );
    assert_eq!(
        container(&drivers[0], "nvidia-driver-ctr")["image"],
        "nvcr.io/nvidia/driver:570.172.08-rhel9.4"
    );
    for driver in &drivers {
        assert_eq!(
            driver["spec"]["template"]["metadata"]["labels"]["app"],
            "nvidia-driver-daemonset"
        );
    }
    snapshot("driver_two_os_pools", &drivers);
}

#[test]
fn precompiled_drivers_get_one_daemonset_per_kernel() {
    let facts = facts([
        node("gpu-a"),
        node("gpu-b").kernel("6.8.0-45-generic"),
        node("gpu-c"),
    ]);
    let drivers = render_component(
        json!({"driver": {"usePrecompiled": true}}),
        &facts,
        Component::Driver,
    );
    assert_eq!(
        names(&drivers),
        [
            "nvidia-driver-daemonset-5.15.0-119-generic-ubuntu22.04",
            "nvidia-driver-daemonset-6.8.0-45-generic-ubuntu22.04"
        ]
    );
    assert_eq!(
        container(&drivers[1], "nvidia-driver-ctr")["image"],
        "nvcr.io/nvidia/driver:570.172.08-6.8.0-45-generic-ubuntu22.04"
    );
    snapshot("driver_precompiled", &drivers);
}

/// With `driver.useNvidiaDriverCRD`, each accepted NVIDIADriver gets one DaemonSet per OS pool among its own
/// nodes, with its image, tolerations and resources, on the nodes labelled with its name; the ClusterPolicy's driver section renders none.
#[test]
fn nvidia_drivers_get_one_daemonset_per_object_and_pool_of_their_nodes() {
    let mut facts = facts([
        node("a100-0"),
        node("a100-1").os("rhel", "9.4"),
        node("h100-0"),
    ]);
    let spec =
        |value| serde_json::from_value::<crd::nvidia_driver::NvidiaDriverSpec>(value).unwrap();
    facts.nvidia_drivers = vec![
        AssignedDriver {
            name: "a100".into(),
            spec: spec(json!({
                "repository": "nvcr.io/nvidia", "image": "driver", "version": "570.172.08",
                "nodeSelector": {"pool": "a100"},
                "tolerations": [{"key": "sku", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}],
                "resources": {"limits": {"memory": "2Gi"}}
            })),
            nodes: ["a100-0".into(), "a100-1".into()].into(),
        },
        AssignedDriver {
            name: "h100".into(),
            spec: spec(json!({
                "repository": "nvcr.io/nvidia", "image": "driver", "version": "580.95.05",
                "nodeSelector": {"pool": "h100"}, "kernelModuleType": "open"
            })),
            nodes: ["h100-0".into()].into(),
        },
    ];
    let drivers = render_component(
        json!({"driver": {"useNvidiaDriverCRD": true}, "daemonsets": {"priorityClassName": "gpu-critical"}}),
        &facts,
        Component::Driver,
    );
    assert_eq!(
        names(&drivers),
        [
            "nvidia-gpu-driver-a100-rhel9.4",
            "nvidia-gpu-driver-a100-ubuntu22.04",
            "nvidia-gpu-driver-h100-ubuntu22.04",
        ]
    );
    let [a100_rhel, _, h100] = &drivers[..] else {
        unreachable!("three DaemonSets, checked above")
    };
    let a100_main = container(a100_rhel, "nvidia-driver-ctr");
    assert_eq!(
        a100_main["image"],
        "nvcr.io/nvidia/driver:570.172.08-rhel9.4"
    );
    assert_eq!(a100_main["resources"]["limits"]["memory"], "2Gi");
    let pod = &a100_rhel["spec"]["template"]["spec"];
    // Where the operator wrote the object's name, not the object's own selector (a default object has none).
    assert_eq!(
        pod["nodeSelector"]["nvidia.com/gpu-operator.driver.owner"],
        "a100"
    );
    assert_eq!(pod["nodeSelector"]["pool"], serde_json::Value::Null);
    assert_eq!(
        a100_rhel["metadata"]["labels"]["nvidia.com/gpu-operator.driver.owner"],
        "a100"
    );
    assert_eq!(
        pod["nodeSelector"]["feature.node.kubernetes.io/system-os_release.ID"],
        "rhel"
    );
    assert_eq!(pod["tolerations"][0]["value"], "a100");
    // What the object leaves unset comes from the ClusterPolicy's daemonsets section.
    assert_eq!(pod["priorityClassName"], "gpu-critical");
    assert_eq!(a100_rhel["spec"]["updateStrategy"]["type"], "OnDelete");
    let h100_main = container(h100, "nvidia-driver-ctr");
    assert_eq!(
        h100_main["image"],
        "nvcr.io/nvidia/driver:580.95.05-ubuntu22.04"
    );
    assert_eq!(env_value(h100_main, "KERNEL_MODULE_TYPE"), Some("open"));
    assert_eq!(
        h100["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu-operator.driver.owner"],
        "h100"
    );
    snapshot("driver_nvidia_drivers", &drivers);
}

/// The upgrade controller replaces driver pods one node at a time, so the DaemonSet itself must never roll:
/// OnDelete with automatic upgrades as without, whatever `daemonsets.updateStrategy` says.
#[test]
fn driver_auto_upgrade_uses_on_delete() {
    let spec = json!({
        "driver": {"upgradePolicy": {"autoUpgrade": true, "maxUnavailable": "25%"}},
        "daemonsets": {"updateStrategy": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "2"}}
    });
    let drivers = render_component(spec, &one_node(), Component::Driver);
    assert_eq!(
        drivers[0]["spec"]["updateStrategy"],
        json!({"type": "OnDelete"})
    );
    let default = render_component(json!({}), &one_node(), Component::Driver);
    assert_eq!(
        default[0]["spec"]["updateStrategy"],
        json!({"type": "OnDelete"})
    );
    snapshot("driver_auto_upgrade", &drivers);
}

#[test]
fn driver_manager_and_driver_options() {
    let spec = json!({"driver": {
        "manager": {"repository": "registry.local/nvidia", "image": "k8s-driver-manager", "version": "v0.8.1",
                    "imagePullSecrets": ["manager-pull"], "env": [{"name": "ENABLE_GPU_POD_EVICTION", "value": "true"}]},
        "kernelModuleType": "open",
        "repoConfig": {"configMapName": "apt-mirror"},
        "certConfig": {"name": "proxy-ca"},
        "kernelModuleConfig": {"name": "nvidia-module-params"},
        "secretEnv": "driver-secrets",
        "startupProbe": {"failureThreshold": 240},
        "livenessProbe": {"periodSeconds": 30},
        "readinessProbe": {"initialDelaySeconds": 5},
    }});
    let drivers = render_component(spec, &one_node(), Component::Driver);
    let manager = container(&drivers[0], "k8s-driver-manager");
    assert_eq!(
        manager["image"],
        "registry.local/nvidia/k8s-driver-manager:v0.8.1"
    );
    assert_eq!(env_value(manager, "ENABLE_GPU_POD_EVICTION"), Some("true"));
    assert_eq!(
        env_value(
            container(&drivers[0], "nvidia-driver-ctr"),
            "KERNEL_MODULE_TYPE"
        ),
        Some("open")
    );
    snapshot("driver_manager_and_options", &drivers);

    let mut images = default_images();
    images.0.remove("DRIVER_MANAGER_IMAGE");
    let without_manager = policy_with(json!({}), &images);
    let drivers = objects_of(&render(&without_manager, &one_node()), Component::Driver);
    assert!(
        drivers[0]["spec"]["template"]["spec"]["initContainers"].is_null(),
        "no manager image, no init container"
    );
}

#[test]
fn toolkit_per_runtime() {
    let facts = facts([
        node("gpu-k3s").runtime(ContainerRuntime::K3sContainerd),
        node("gpu-crio").runtime(ContainerRuntime::CriO),
        node("gpu-docker").runtime(ContainerRuntime::Docker),
    ]);
    let toolkits = render_component(json!({}), &facts, Component::ContainerToolkit);
    assert_eq!(
        names(&toolkits),
        [
            "nvidia-container-toolkit-daemonset-k3s",
            "nvidia-container-toolkit-daemonset-crio",
            "nvidia-container-toolkit-daemonset-docker"
        ]
    );
    let ctr = container(&toolkits[0], "nvidia-container-toolkit-ctr");
    assert_eq!(env_value(ctr, "RUNTIME"), Some("containerd"));
    assert_eq!(
        env_value(ctr, "RUNTIME_SOCKET"),
        Some("/runtime/sock-dir/containerd.sock")
    );
    let volumes = &toolkits[0]["spec"]["template"]["spec"]["volumes"];
    assert_eq!(
        volumes[0]["hostPath"]["path"],
        "/var/lib/rancher/k3s/agent/etc/containerd"
    );
    assert_eq!(volumes[1]["hostPath"]["path"], "/run/k3s/containerd");
    assert_eq!(
        env_value(
            container(&toolkits[2], "nvidia-container-toolkit-ctr"),
            "RUNTIME_CONFIG"
        ),
        Some("/runtime/config-dir/daemon.json")
    );
    for (toolkit, runtime) in toolkits.iter().zip(["k3s", "crio", "docker"]) {
        assert_eq!(
            runtime_requirements(toolkit),
            [json!({"key": RUNTIME_LABEL, "operator": "In", "values": [runtime]})],
            "with several runtimes an unlabelled node could be any: only the {runtime} label admits"
        );
    }
    snapshot("toolkit_k3s_crio_docker", &toolkits);
}

#[test]
fn toolkit_of_the_only_runtime_runs_before_the_runtime_label() {
    let toolkits = render_component(
        json!({}),
        &facts([node("gpu-0"), node("gpu-1")]),
        Component::ContainerToolkit,
    );
    assert_eq!(names(&toolkits), ["nvidia-container-toolkit-daemonset"]);
    assert_eq!(
        runtime_requirements(&toolkits[0]),
        [json!({
            "key": RUNTIME_LABEL,
            "operator": "NotIn",
            "values": ["k3s", "rke2", "crio", "docker"]
        })],
        "a node without the label yet, or with containerd's, admits the toolkit"
    );
    assert!(
        toolkits[0]["spec"]["template"]["spec"]["nodeSelector"][RUNTIME_LABEL].is_null(),
        "no equality on the label, which would wait for its write"
    );
}

/// The distinct requirements on the runtime label over a DaemonSet's affinity terms; every term carries them.
fn runtime_requirements(daemonset: &Value) -> Vec<Value> {
    let terms = daemonset["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        .as_array()
        .unwrap();
    let mut found: Vec<Value> = Vec::new();
    for term in terms {
        let on_label: Vec<&Value> = term["matchExpressions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["key"] == RUNTIME_LABEL)
            .collect();
        assert_eq!(
            on_label.len(),
            1,
            "every term requires the runtime label: {term}"
        );
        if !found.contains(on_label[0]) {
            found.push(on_label[0].clone());
        }
    }
    found
}

#[test]
fn toolkit_disabled_validates_the_driver_only() {
    let objects = render(&policy(json!({"toolkit": {"enabled": false}})), &one_node());
    let validator = &objects_of(&objects, Component::OperatorValidator)[0];
    let init = validator["spec"]["template"]["spec"]["initContainers"]
        .as_array()
        .unwrap();
    assert_eq!(
        init.iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["driver-validation"]
    );
    let plugin = &objects_of(&objects, Component::DevicePlugin)[0];
    assert_eq!(
        container(plugin, "toolkit-validation")["args"],
        json!(["validate", "wait", "--for", "driver"])
    );
    snapshot(
        "toolkit_disabled_validator",
        &objects_of(&objects, Component::OperatorValidator),
    );
}

#[test]
fn device_plugin_config_mig_mixed_cdi_off() {
    let spec = json!({
        "devicePlugin": {"config": {"name": "time-slicing-config-all", "default": "any"}, "mps": {"root": "/var/mps"}},
        "mig": {"strategy": "mixed"},
        "cdi": {"enabled": false},
        "hostPaths": {"kubeletRootDir": "/var/lib/k0s/kubelet"},
    });
    let objects = render(&policy(spec), &one_node());
    let plugin = objects_of(&objects, Component::DevicePlugin);
    assert_eq!(
        container(&plugin[0], "nvidia-device-plugin")["args"],
        json!([
            "run",
            "--mig-strategy",
            "mixed",
            "--mps-root",
            "/var/mps",
            "--config-map",
            "time-slicing-config-all",
            "--default-config",
            "any"
        ])
    );
    // The kubelet registers device plugins at a fixed path, whatever its root directory.
    assert_eq!(
        host_path_of(&plugin[0], "device-plugins"),
        "/var/lib/kubelet/device-plugins"
    );
    snapshot("device_plugin_config_mixed_no_cdi", &plugin);
    let discovery = objects_of(&objects, Component::GpuFeatureDiscovery);
    assert_eq!(
        container(&discovery[0], "gpu-feature-discovery")["args"],
        json!([
            "discovery",
            "--mig-strategy",
            "mixed",
            "--device-plugin-config-map",
            "time-slicing-config-all",
            "--default-config",
            "any"
        ])
    );
    snapshot("discovery_config_mixed", &discovery);
}

#[test]
fn mig_manager_with_reboot_and_gpu_clients() {
    let spec = json!({
        "migManager": {
            "env": [{"name": "WITH_REBOOT", "value": "true"}],
            "config": {"name": "custom-mig-parted-config", "default": ""},
            "gpuClientsConfig": {"name": "gpu-clients"},
        },
        "hostPaths": {"kubeletRootDir": "/var/lib/k0s/kubelet"},
    });
    let managers = render_component(spec, &one_node(), Component::MigManager);
    let manager = container(&managers[0], "nvidia-mig-manager");
    assert_eq!(env_value(manager, "WITH_REBOOT"), Some("true"));
    assert_eq!(
        manager["args"],
        json!([
            "mig",
            "--config-map",
            "custom-mig-parted-config",
            "--kubelet-root",
            "/var/lib/k0s/kubelet",
            "--gpu-clients-config-map",
            "gpu-clients"
        ])
    );
    // The kubelet's pod-resources socket, at the same path inside, so that the flag names it there too.
    let volumes = &managers[0]["spec"]["template"]["spec"]["volumes"];
    assert!(
        volumes.as_array().unwrap().contains(&json!({
            "name": "pod-resources",
            "hostPath": {"path": "/var/lib/k0s/kubelet/pod-resources"}
        })),
        "{volumes}"
    );
    assert!(
        manager["volumeMounts"]
            .as_array()
            .unwrap()
            .contains(&json!({
                "name": "pod-resources",
                "mountPath": "/var/lib/k0s/kubelet/pod-resources",
                "readOnly": true
            })),
        "{}",
        manager["volumeMounts"]
    );
    // The reboot signals the host's systemd: the host's PID namespace with WITH_REBOOT, and only then.
    let pod = &managers[0]["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    assert!(pod["hostIPC"].is_null(), "{pod}");
    let default = render_component(json!({}), &one_node(), Component::MigManager);
    assert!(default[0]["spec"]["template"]["spec"]["hostPID"].is_null());
    snapshot("mig_manager_reboot_gpu_clients", &managers);
}

#[test]
fn exporter_host_network_node_port_and_service_monitor() {
    let spec = json!({"dcgmExporter": {
        "hostNetwork": true,
        "hostPID": true,
        "config": {"name": "custom-metrics"},
        "podLabels": {"team": "ml"},
        "podAnnotations": {"prometheus.io/scrape": "false"},
        "service": {"type": "NodePort", "internalTrafficPolicy": "Local"},
        "serviceMonitor": {
            "enabled": true, "interval": "15s", "honorLabels": true,
            "additionalLabels": {"release": "kube-prometheus-stack"},
            "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance", "action": "replace"}],
        },
    }});
    let objects = render_component(spec, &one_node(), Component::DcgmExporter);
    let kinds: Vec<_> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["DaemonSet", "Service", "ServiceMonitor"]);
    assert_eq!(objects[1]["spec"]["type"], "NodePort");
    assert_eq!(
        objects[2]["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    assert_eq!(
        objects[2]["spec"]["endpoints"][0]["port"],
        objects[1]["spec"]["ports"][0]["name"]
    );
    snapshot("exporter_host_network_node_port_service_monitor", &objects);
}

#[test]
fn every_daemonsets_option_on_one_operand() {
    let spec = json!({"daemonsets": {
        "labels": {"team": "gpu-platform"},
        "annotations": {"example.com/owner": "gpu-platform"},
        "tolerations": [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
        "priorityClassName": "system-node-critical",
        "updateStrategy": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "25%"},
        "podSecurityContext": {"runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"}},
        "nodeSelector": {"pool": "gpu", "nvidia.com/gpu.deploy.device-plugin": "false"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["a100"]}]}]}}},
    }});
    let plugin = render_component(spec, &one_node(), Component::DevicePlugin);
    let pod = &plugin[0]["spec"]["template"];
    assert_eq!(
        pod["spec"]["nodeSelector"],
        json!({"pool": "gpu"}),
        "the deploy label is the affinity's to decide"
    );
    let terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"]
        .as_array()
        .unwrap();
    assert_eq!(
        terms.len(),
        4,
        "the user's one term joined with each of ours"
    );
    for term in terms {
        assert_eq!(
            term["matchExpressions"][0]["key"], "node.kubernetes.io/instance-type",
            "{term}"
        );
        assert_eq!(
            term["matchExpressions"][1]["key"],
            "nvidia.com/gpu.deploy.device-plugin"
        );
    }
    assert_eq!(pod["metadata"]["labels"]["team"], "gpu-platform");
    assert_eq!(
        plugin[0]["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
        "25%"
    );
    snapshot("daemonsets_options_device_plugin", &plugin);

    // NVIDIA's values write a node count as a string; Kubernetes takes a string only as a percentage.
    let count = render_component(
        json!({"daemonsets": {"rollingUpdate": {"maxUnavailable": "1"}}}),
        &one_node(),
        Component::DevicePlugin,
    );
    assert_eq!(
        count[0]["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
        json!(1)
    );

    // Empty is unset, as NVIDIA's operator reads it: the default of 1.
    let empty = render_component(
        json!({"daemonsets": {"rollingUpdate": {"maxUnavailable": ""}}}),
        &one_node(),
        Component::DevicePlugin,
    );
    assert_eq!(
        empty[0]["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
        json!(1)
    );

    let on_delete = render_component(
        json!({"daemonsets": {"updateStrategy": "OnDelete"}}),
        &one_node(),
        Component::DevicePlugin,
    );
    assert_eq!(
        on_delete[0]["spec"]["updateStrategy"],
        json!({"type": "OnDelete"})
    );
}

#[test]
fn images_by_digest_and_alone() {
    let spec = json!({
        "devicePlugin": {"repository": "registry.local/gpu", "image": "device-plugin", "version": "sha256:0123456789abcdef"},
        "gfd": {"image": "registry.local/gpu/node-agent:custom"},
        "driver": {"repository": "registry.local/nvidia", "image": "driver", "version": "sha256:fedcba9876543210"},
    });
    let objects = render(&policy(spec), &one_node());
    let images: Vec<_> = [
        Component::Driver,
        Component::DevicePlugin,
        Component::GpuFeatureDiscovery,
    ]
    .into_iter()
    .map(|component| {
        objects_of(&objects, component)[0]["spec"]["template"]["spec"]["containers"][0]["image"]
            .clone()
    })
    .collect();
    assert_eq!(
        images,
        [
            "registry.local/nvidia/driver@sha256:fedcba9876543210",
            "registry.local/gpu/device-plugin@sha256:0123456789abcdef",
            "registry.local/gpu/node-agent:custom"
        ]
    );
    snapshot(
        "image_digest_device_plugin",
        &objects_of(&objects, Component::DevicePlugin),
    );
    snapshot(
        "image_alone_discovery",
        &objects_of(&objects, Component::GpuFeatureDiscovery),
    );
}

#[test]
fn container_settings_from_the_section() {
    let spec = json!({"toolkit": {
        "imagePullPolicy": "Always",
        "imagePullSecrets": ["nvcr-pull"],
        "resources": {"limits": {"cpu": "500m", "memory": "512Mi"}, "requests": {"cpu": "100m"}},
        "args": ["--debug"],
        "env": [{"name": "RUNTIME_CONFIG", "value": "/runtime/config-dir/config.toml.tmpl"}, {"name": "CONTAINERD_SET_AS_DEFAULT", "value": "true"}],
    }, "validator": {"imagePullSecrets": ["validator-pull"]}});
    let toolkits = render_component(spec, &one_node(), Component::ContainerToolkit);
    let ctr = container(&toolkits[0], "nvidia-container-toolkit-ctr");
    assert_eq!(
        env_value(ctr, "RUNTIME_CONFIG"),
        Some("/runtime/config-dir/config.toml.tmpl"),
        "user env wins"
    );
    assert_eq!(
        ctr["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "RUNTIME_CONFIG")
            .count(),
        1
    );
    assert_eq!(ctr["args"], json!(["--debug"]));
    assert_eq!(
        toolkits[0]["spec"]["template"]["spec"]["imagePullSecrets"],
        json!([{"name": "nvcr-pull"}, {"name": "validator-pull"}])
    );
    snapshot("container_settings_toolkit", &toolkits);
}

#[test]
fn node_status_exporter_enabled() {
    let exporters = render_component(
        json!({"nodeStatusExporter": {"enabled": true}}),
        &one_node(),
        Component::NodeStatusExporter,
    );
    assert_eq!(names(&exporters), ["nvidia-node-status-exporter"]);
    snapshot("node_status_exporter_enabled", &exporters);
}

#[test]
fn watchdog_enabled_with_defaults_and_with_every_setting() {
    let defaults = render_component(
        json!({"watchdog": {"enabled": true}}),
        &one_node(),
        Component::Watchdog,
    );
    assert_eq!(
        names(&defaults),
        ["nvidia-gpu-watchdog", "nvidia-gpu-watchdog"]
    );
    let pod = &defaults[0]["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    assert_eq!(pod["containers"][0]["command"], json!(["gpu-node-agent"]));
    assert_eq!(
        pod["containers"][0]["args"],
        json!([
            "watchdog",
            "--listen",
            ":9402",
            "--kubelet-root",
            "/var/lib/kubelet",
            "--interval-seconds",
            "5",
            "--grace-period-seconds",
            "30",
            "--kill-grace-period-seconds",
            "10",
            "--default-budget",
            "replica-share"
        ])
    );
    assert!(
        pod["containers"][0]["securityContext"]["privileged"] != true,
        "signalling needs CAP_KILL, not a privileged container"
    );
    snapshot("watchdog_enabled", &defaults);

    let tuned = render_component(
        json!({"watchdog": {"enabled": true, "dryRun": true, "intervalSeconds": 1, "gracePeriodSeconds": 0,
               "killGracePeriodSeconds": 3, "defaultBudget": "none",
               "serviceMonitor": {"enabled": true, "interval": "15s"}}}),
        &one_node(),
        Component::Watchdog,
    );
    assert_eq!(
        tuned[0]["spec"]["template"]["spec"]["containers"][0]["args"],
        json!([
            "watchdog",
            "--listen",
            ":9402",
            "--kubelet-root",
            "/var/lib/kubelet",
            "--interval-seconds",
            "1",
            "--grace-period-seconds",
            "0",
            "--kill-grace-period-seconds",
            "3",
            "--default-budget",
            "none",
            "--dry-run"
        ])
    );
    assert_eq!(tuned[2]["kind"], "ServiceMonitor");
    assert_eq!(tuned[2]["spec"]["endpoints"][0]["port"], "watchdog-metrics");
    snapshot("watchdog_dry_run_no_default_budget", &tuned);
}

#[test]
fn dra_driver_takes_its_gpus_from_the_device_plugin() {
    let spec = json!({"draDriver": {"enabled": true, "gpus": "2-3", "sharedGPUs": "3", "dynamicMIG": "2"}});
    let drivers = render_component(spec.clone(), &one_node(), Component::DraDriver);
    assert_eq!(names(&drivers), ["nvidia-dra-driver-gpu"]);
    let pod = &drivers[0]["spec"]["template"]["spec"];
    let main = &pod["containers"][0];
    assert_eq!(main["command"], json!(["gpu-dra-driver"]));
    assert_eq!(main["args"][0], "run");
    let env = |container: &serde_json::Value, name: &str| {
        container["env"]
            .as_array()
            .and_then(|env| env.iter().find(|var| var["name"] == name))
            .map(|var| var["value"].clone())
    };
    assert_eq!(env(main, "DRA_GPUS"), Some(json!("2-3")));
    assert_eq!(env(main, "DRA_SHARED_GPUS"), Some(json!("3")));
    assert_eq!(env(main, "DRA_DYNAMIC_MIG_GPUS"), Some(json!("2")));
    let mounts: Vec<&str> = main["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|mount| mount["mountPath"].as_str())
        .collect();
    for path in [
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins/gpu.nvidia.com",
        "/var/run/cdi",
        "/run/nvidia/mps",
    ] {
        assert!(mounts.contains(&path), "{path} in {mounts:?}");
    }
    snapshot("dra_driver_enabled", &drivers);
    let defaults = render_component(
        json!({"draDriver": {"enabled": true}}),
        &one_node(),
        Component::DraDriver,
    );
    let main = &defaults[0]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(env(main, "DRA_GPUS"), Some(json!("all")));
    assert_eq!(env(main, "DRA_SHARED_GPUS"), Some(json!("all")));
    assert_eq!(
        env(main, "DRA_DYNAMIC_MIG_GPUS"),
        Some(json!("none")),
        "no GPU is MIG on demand unless asked"
    );
    assert_eq!(
        env(main, "MEMORY_LIMIT_HOOK"),
        None,
        "the toolkit NVIDIA's chart pins (v1.20.0) cannot apply GPU memory limits"
    );
    let newer_toolkit = render_component(
        json!({"draDriver": {"enabled": true},
               "toolkit": {"repository": "nvcr.io/nvidia/k8s", "image": "container-toolkit", "version": "v1.20.1"}}),
        &one_node(),
        Component::DraDriver,
    );
    let main = &newer_toolkit[0]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        env(main, "MEMORY_LIMIT_HOOK"),
        Some(json!("/usr/local/nvidia/toolkit/nvidia-cdi-hook"))
    );

    let plugins = render_component(spec.clone(), &one_node(), Component::DevicePlugin);
    let plugin = &plugins[0]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        env(plugin, "DRA_GPUS"),
        Some(json!("2-3")),
        "the plugin leaves the driver's GPUs out"
    );
    let alone = render_component(json!({}), &one_node(), Component::DevicePlugin);
    let plugin = &alone[0]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        env(plugin, "DRA_GPUS"),
        None,
        "without a DRA driver the plugin keeps every GPU"
    );

    // The MIG manager leaves the instances of the GPUs served as MIG on demand to the driver.
    let managers = render_component(spec, &one_node(), Component::MigManager);
    let manager = &managers[0]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(env(manager, "DRA_GPUS"), Some(json!("2-3")));
    assert_eq!(env(manager, "DRA_DYNAMIC_MIG_GPUS"), Some(json!("2")));
}

#[test]
fn dcgm_host_port() {
    let dcgm = render_component(
        json!({"dcgm": {"hostPort": 5555}}),
        &one_node(),
        Component::Dcgm,
    );
    assert_eq!(
        container(&dcgm[0], "nvidia-dcgm-ctr")["ports"][0]["hostPort"],
        5555
    );
}

#[test]
fn a_simulator_state_file_in_a_section_env_mounts_its_host_folder_where_it_is_set() {
    let simulated = json!([
        {"name": "GPU_SIMULATE", "value": "node"},
        {"name": "GPU_SIM_STATE", "value": "/run/gpu-simulator/state.json"}
    ]);
    let spec = json!({
        "toolkit": {"enabled": false},
        "validator": {"env": simulated, "driver": {"env": simulated}},
        "devicePlugin": {"env": simulated}
    });
    let validator = render_component(spec.clone(), &one_node(), Component::OperatorValidator);
    let plugin = render_component(spec, &one_node(), Component::DevicePlugin);
    let mounts_state = |daemonset: &serde_json::Value, name: &str| {
        container(daemonset, name)["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["name"] == "gpu-simulator-state" && m["mountPath"] == "/run/gpu-simulator")
    };
    assert!(mounts_state(&validator[0], "driver-validation"));
    assert!(mounts_state(&validator[0], "nvidia-operator-validator"));
    assert!(mounts_state(&plugin[0], "nvidia-device-plugin"));
    // The init container that only waits for ready files has no simulator env, so no mount.
    assert!(!mounts_state(&plugin[0], "toolkit-validation"));
    for daemonset in [&validator[0], &plugin[0]] {
        let volumes = daemonset["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .expect("volumes");
        let state: Vec<_> = volumes
            .iter()
            .filter(|v| v["name"] == "gpu-simulator-state")
            .collect();
        assert_eq!(
            state,
            [&json!({"name": "gpu-simulator-state",
                "hostPath": {"path": "/run/gpu-simulator", "type": "DirectoryOrCreate"}})]
        );
    }
    // Without the env, as on real GPUs, nothing of the simulator is rendered.
    let real = render_component(json!({}), &one_node(), Component::DevicePlugin);
    assert!(!real[0].to_string().contains("gpu-simulator"));
    assert_eq!(
        env_value(
            container(&plugin[0], "nvidia-device-plugin"),
            "GPU_SIMULATE"
        ),
        Some("node")
    );
    snapshot("validator_simulated", &validator);
    snapshot("device_plugin_simulated", &plugin);
}
