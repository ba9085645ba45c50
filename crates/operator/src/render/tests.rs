//! The default policy on one ubuntu22.04 containerd node, one golden snapshot per operand, and the rules every
//! rendered object follows.

use std::collections::BTreeSet;

use serde_json::json;

use super::fixture::{NAMESPACE, container, facts, names, objects_of, one_node, policy, snapshot};
use super::{
    COMPONENT_LABEL, DAEMONSET_LABEL, MANAGED_BY_LABEL, PART_OF_LABEL, RenderedObject, render,
};
use crate::model::{Component, ContainerRuntime};
use crate::plan::labels::{deploy_terms, runtime_requirement};

#[test]
fn default_policy_snapshots_per_operand() {
    let objects = render(&policy(json!({})), &one_node());
    let rendered: Vec<_> = objects.iter().map(|o| (o.kind(), o.name())).collect();
    assert_eq!(
        rendered,
        [
            (
                "DaemonSet",
                "nvidia-driver-daemonset-ubuntu22.04".to_owned()
            ),
            ("DaemonSet", "nvidia-container-toolkit-daemonset".into()),
            ("DaemonSet", "nvidia-operator-validator".into()),
            ("DaemonSet", "nvidia-device-plugin-daemonset".into()),
            ("DaemonSet", "gpu-feature-discovery".into()),
            ("DaemonSet", "nvidia-dcgm".into()),
            ("DaemonSet", "nvidia-dcgm-exporter".into()),
            ("Service", "nvidia-dcgm-exporter".into()),
            ("DaemonSet", "nvidia-mig-manager".into()),
        ]
    );
    // Off by default: snapshotted where they are switched on (option_tests).
    let off_by_default = [
        Component::NodeStatusExporter,
        Component::Watchdog,
        Component::DraDriver,
    ];
    for component in Component::ALL
        .into_iter()
        .filter(|c| !off_by_default.contains(c))
    {
        let name = format!("default_{}", component.label_name().replace('-', "_"));
        snapshot(&name, &objects_of(&objects, component));
    }
}

#[test]
fn every_object_carries_the_pruning_labels_and_selects_its_own_pods() {
    let all_on = json!({"nodeStatusExporter": {"enabled": true}, "dcgmExporter": {"serviceMonitor": {"enabled": true}}, "watchdog": {"enabled": true, "serviceMonitor": {"enabled": true}}, "draDriver": {"enabled": true}});
    let objects = render(&policy(all_on), &one_node());
    for object in &objects {
        let json = object.to_json();
        let labels = &json["metadata"]["labels"];
        assert_eq!(
            labels[MANAGED_BY_LABEL],
            "gpu-operator",
            "{}",
            object.name()
        );
        assert_eq!(labels[PART_OF_LABEL], "gpu-operator");
        assert_eq!(labels[COMPONENT_LABEL], object.component().label_name());
        assert_eq!(json["metadata"]["namespace"], NAMESPACE);
        assert!(
            json["metadata"]["ownerReferences"].is_null(),
            "the apply layer adds owner references"
        );
        assert_eq!(json["apiVersion"], object.api_version());
        assert_eq!(json["kind"], object.kind());
        if let RenderedObject::DaemonSet(_) = object {
            let selector = json["spec"]["selector"]["matchLabels"].as_object().unwrap();
            let pod_labels = &json["spec"]["template"]["metadata"]["labels"];
            assert_eq!(selector["app"], object.component().app_name());
            assert_eq!(selector[DAEMONSET_LABEL], object.name().as_str());
            for (key, value) in selector {
                assert_eq!(
                    &pod_labels[key],
                    value,
                    "{} pods match its selector",
                    object.name()
                );
            }
            let placement = &json["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"];
            let mut expected = deploy_terms(object.component());
            if object.component() == Component::ContainerToolkit {
                let only = ContainerRuntime::Containerd;
                for term in &mut expected {
                    term.match_expressions
                        .get_or_insert_default()
                        .push(runtime_requirement(only, &BTreeSet::from([only])));
                }
            }
            assert_eq!(
                placement,
                &serde_json::to_value(expected).unwrap(),
                "{} runs where its deploy label says (the toolkit: and its runtime label)",
                object.name()
            );
        }
    }
    assert_eq!(
        objects
            .iter()
            .filter(|o| o.kind() == "ServiceMonitor")
            .count(),
        2,
        "the exporter's and the watchdog's"
    );
}

#[test]
fn without_gpu_nodes_only_per_pool_daemonsets_are_missing() {
    let objects = render(&policy(json!({})), &facts([]));
    let components: Vec<_> = objects.iter().map(RenderedObject::component).collect();
    assert!(
        !components.contains(&Component::Driver),
        "no OS pool, no driver DaemonSet"
    );
    assert!(
        !components.contains(&Component::ContainerToolkit),
        "no runtime, no toolkit DaemonSet"
    );
    for component in [
        Component::OperatorValidator,
        Component::DevicePlugin,
        Component::MigManager,
        Component::DcgmExporter,
    ] {
        assert!(
            components.contains(&component),
            "{component} renders without GPU nodes"
        );
    }
}

#[test]
fn a_disabled_component_renders_nothing() {
    let sections = [
        (Component::Driver, "driver"),
        (Component::ContainerToolkit, "toolkit"),
        (Component::DevicePlugin, "devicePlugin"),
        (Component::GpuFeatureDiscovery, "gfd"),
        (Component::Dcgm, "dcgm"),
        (Component::DcgmExporter, "dcgmExporter"),
        (Component::MigManager, "migManager"),
        (Component::NodeStatusExporter, "nodeStatusExporter"),
        (Component::Watchdog, "watchdog"),
        (Component::DraDriver, "draDriver"),
    ];
    let all_on = json!({"nodeStatusExporter": {"enabled": true}, "watchdog": {"enabled": true}, "draDriver": {"enabled": true}});
    let everything = render(&policy(all_on.clone()), &one_node());
    for (component, section) in sections {
        let mut spec = all_on.clone();
        spec[section] = json!({"enabled": false});
        let objects = render(&policy(spec), &one_node());
        assert!(
            objects_of(&objects, component).is_empty(),
            "{component} disabled renders nothing"
        );
        assert_eq!(
            objects.len(),
            everything.len() - objects_of(&everything, component).len(),
            "only {component} goes"
        );
    }
    let objects = render(&policy(json!({"dcgm": {"enabled": false}})), &one_node());
    assert!(
        !names(
            &objects
                .iter()
                .map(RenderedObject::to_json)
                .collect::<Vec<_>>()
        )
        .contains(&"nvidia-dcgm")
    );
}

#[test]
fn operands_wait_for_the_driver_and_toolkit() {
    let objects = render(
        &policy(
            json!({"nodeStatusExporter": {"enabled": true}, "watchdog": {"enabled": true}, "draDriver": {"enabled": true}}),
        ),
        &one_node(),
    );
    let own_waits = [
        Component::Driver,
        Component::ContainerToolkit,
        Component::OperatorValidator,
    ];
    for component in Component::ALL
        .into_iter()
        .filter(|c| !own_waits.contains(c))
    {
        let ds = &objects_of(&objects, component)[0];
        let wait = container(ds, "toolkit-validation");
        assert_eq!(
            wait["args"],
            json!(["validate", "wait", "--for", "driver", "--for", "toolkit"]),
            "{component}"
        );
    }
    let toolkit = &objects_of(&objects, Component::ContainerToolkit)[0];
    assert_eq!(
        container(toolkit, "driver-validation")["args"],
        json!(["validate", "wait", "--for", "driver"])
    );
}

#[test]
fn rendering_is_deterministic() {
    let spec = json!({"daemonsets": {"labels": {"b": "2", "a": "1"}}, "nodeStatusExporter": {"enabled": true}});
    let facts = facts([
        super::fixture::node("b").os("rhel", "9.4"),
        super::fixture::node("a"),
    ]);
    let first: Vec<_> = render(&policy(spec.clone()), &facts)
        .iter()
        .map(RenderedObject::to_json)
        .collect();
    let second: Vec<_> = render(&policy(spec), &facts)
        .iter()
        .map(RenderedObject::to_json)
        .collect();
    assert_eq!(
        serde_json::to_string(&first).unwrap(),
        serde_json::to_string(&second).unwrap()
    );
}

#[test]
fn the_pool_that_takes_over_nvidias_driver_keeps_its_name_and_on_delete() {
    let mut cluster = facts([
        super::fixture::node("a"),
        super::fixture::node("b").os("rhel", "9.4"),
    ]);
    cluster.nvidia_driver_pool = cluster
        .os_pools()
        .into_iter()
        .find(|pool| pool.id == "ubuntu");
    let objects = render(&policy(json!({})), &cluster);
    let drivers = objects_of(&objects, Component::Driver);
    let names: Vec<_> = drivers
        .iter()
        .map(|ds| ds["metadata"]["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        names,
        ["nvidia-driver-daemonset-rhel9.4", "nvidia-driver-daemonset"]
    );
    let taken_over = &drivers[1];
    assert_eq!(
        taken_over["spec"]["template"]["metadata"]["labels"]["app"], "nvidia-driver-daemonset",
        "the pods carry the label NVIDIA's selector selects by"
    );
    assert_eq!(
        taken_over["spec"]["template"]["spec"]["nodeSelector"]["feature.node.kubernetes.io/system-os_release.ID"],
        "ubuntu"
    );
    assert_eq!(taken_over["spec"]["updateStrategy"]["type"], "OnDelete");
    // Precompiled drivers (one DaemonSet per kernel) take nothing over: NVIDIA names those by kernel.
    let precompiled = render(
        &policy(json!({"driver": {"usePrecompiled": true}})),
        &cluster,
    );
    assert!(
        objects_of(&precompiled, Component::Driver)
            .iter()
            .all(|ds| ds["metadata"]["name"] != "nvidia-driver-daemonset")
    );
}
