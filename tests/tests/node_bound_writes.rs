//! Every write from a node is bound to that node: with the token the kubelet gives a node agent's pod on node A
//! (which names A), the API server lets the agent write A's Node labels, A's GPUNode and A's ResourceSlice, and
//! Events from and about A, and refuses the same writes for node B, a taint on A, and keys that are not the agent's,
//! with the messages of the chart's node-bound-writes policies. A token bound to no pod names no node and writes none
//! of these. Evictions, which no policy can bind (it sees the Eviction, not the pod's node), are checked by the
//! operator's webhook.

use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e::agents::{pod_token_kubeconfig, token_pod};
use e2e::*;
use serde_json::json;

const NODE_A: &str = "gpu-a100-0";
const NODE_B: &str = "gpu-a100-1";
const MIG_MANAGER: &str = "nvidia-mig-manager";
const DRA_DRIVER: &str = "nvidia-dra-driver-gpu";
/// The label and annotation the test writes with the agents' tokens (NVIDIA's prefix, as the agents' own).
const LABEL: &str = "nvidia.com/e2e-node-bound";
/// A grant of every node's claim status to the DRA driver, which Kubernetes 1.34 and 1.35 give without one.
const CLAIM_STATUS_ANY_NODE: &str = "e2e-node-bound-claim-status-any-node";

/// Runs kubectl as the user of `kubeconfig`.
fn kubectl_as(kubeconfig: &Path, args: &[&str]) -> Run {
    let config = kubeconfig.display().to_string();
    let mut all = vec!["--kubeconfig", config.as_str()];
    all.extend_from_slice(args);
    run("kubectl", &all)
}

/// `kubectl create -f -` of `manifest` as the user of `kubeconfig`.
fn create_as(kubeconfig: &Path, manifest: &serde_json::Value) -> Run {
    let config = kubeconfig.display().to_string();
    kubectl_with_input(
        &["--kubeconfig", &config, "create", "-f", "-"],
        &manifest.to_string(),
    )
}

/// `kubectl apply --server-side -f -` of `manifest` as the user of `kubeconfig` (with `extra` flags), as the agents
/// write: the DRA driver its slice (created when missing, updated after), every agent its GPUNode's status.
fn server_side_apply_as(kubeconfig: &Path, manifest: &serde_json::Value, extra: &[&str]) -> Run {
    let config = kubeconfig.display().to_string();
    let mut args = vec![
        "--kubeconfig",
        &config,
        "apply",
        "--server-side",
        "--field-manager",
        "gpu-dra-driver",
        "-f",
        "-",
    ];
    args.extend_from_slice(extra);
    kubectl_with_input(&args, &manifest.to_string())
}

/// GPUNode `node`'s status written as the agents write it (server-side apply of the status subresource).
fn write_gpu_node_status(kubeconfig: &Path, node: &str) -> Run {
    let status = json!({
        "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUNode",
        "metadata": {"name": node},
        "status": {"gpuCount": 1},
    });
    server_side_apply_as(kubeconfig, &status, &["--subresource=status"])
}

/// The request failed, and the API server said `message` (the policy's, or RBAC's).
#[track_caller]
fn assert_refused(what: &str, result: &Run, message: &str) {
    assert!(
        !result.success,
        "{what} was allowed:\n{}{}",
        result.stdout, result.stderr
    );
    assert!(
        result.stderr.contains(message),
        "{what} was refused, but not with {message:?}:\n{}",
        result.stderr
    );
}

#[track_caller]
fn assert_allowed(what: &str, result: &Run) {
    assert!(
        result.success,
        "{what} was refused:\n{}{}",
        result.stdout, result.stderr
    );
}

fn gpu_node(name: &str) -> serde_json::Value {
    json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUNode", "metadata": {"name": name}, "spec": {}})
}

/// A ResourceSlice named `name` of `driver` for `node`, in the pool named after it (as our driver names its pool).
fn slice(name: &str, driver: &str, node: &str) -> serde_json::Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver, "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    })
}

/// ResourceClaim `name` in the default namespace, allocated device gpu-0 of `node`'s pool as the scheduler
/// allocates it (created and allocated by the admin).
fn allocated_claim(name: &str, node: &str) {
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
    });
    assert_allowed(
        &format!("the admin creating ResourceClaim {name}"),
        &kubectl_apply(&claim.to_string(), &[]),
    );
    let allocation = json!({"status": {"allocation": {
        "devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": "gpu-0"}
        ]},
        "nodeSelector": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]},
    }}});
    assert_allowed(
        &format!("the admin allocating ResourceClaim {name} on {node}"),
        &run(
            "kubectl",
            &[
                "patch",
                "resourceclaim",
                name,
                "-n",
                "default",
                "--subresource=status",
                "--type=merge",
                "-p",
                &allocation.to_string(),
            ],
        ),
    );
}

/// The device status of claim `name` as the DRA driver writes it (server-side apply of the status subresource),
/// for device `device` of `pool`, and `allocation` if given (which a driver must never write).
fn write_claim_status(
    kubeconfig: &Path,
    name: &str,
    pool: &str,
    allocation: Option<serde_json::Value>,
) -> Run {
    let mut status = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "status": {"devices": [{
            "driver": "gpu.nvidia.com", "pool": pool, "device": "gpu-0",
            "data": {"memoryEnforcement": "mpsPinned"},
        }]},
    });
    if let Some(allocation) = allocation {
        status["status"]["allocation"] = allocation;
    }
    server_side_apply_as(
        kubeconfig,
        &status,
        &["--subresource=status", "--force-conflicts"],
    )
}

/// The value of `key` among node `node`'s labels or annotations (`kind`), as the admin reads it.
fn node_metadata(node: &str, kind: &str, key: &str) -> Option<String> {
    let node = kubectl_json(&["get", "node", node]);
    node["metadata"][kind][key].as_str().map(str::to_owned)
}

/// Removes what the test wrote, as the admin, when dropped (also when an assertion fails).
struct Cleanup {
    /// Token pods, in the operator's namespace.
    pods: Vec<String>,
    /// Workload pods, in the default namespace.
    workloads: Vec<String>,
    kubeconfigs: Vec<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for node in [NODE_A, NODE_B] {
            drop(run(
                "kubectl",
                &[
                    "label",
                    "node",
                    node,
                    &format!("{LABEL}-"),
                    "example.com/e2e-node-bound-",
                ],
            ));
            drop(run(
                "kubectl",
                &[
                    "annotate",
                    "node",
                    node,
                    &format!("{LABEL}-"),
                    "example.com/e2e-node-bound-",
                ],
            ));
            drop(run("kubectl", &["taint", "node", node, "e2e-node-bound-"]));
            clean_up(&["gpunode", node]);
        }
        clean_up(&[
            "events.events.k8s.io",
            "e2e-node-bound-own",
            "-n",
            "default",
        ]);
        for slice in [
            "e2e-node-bound-a",
            "e2e-node-bound-b",
            "e2e-node-bound-other",
        ] {
            clean_up(&["resourceslice", slice]);
        }
        for claim in ["e2e-node-bound-claim-a", "e2e-node-bound-claim-b"] {
            clean_up(&["resourceclaim", claim, "-n", "default"]);
        }
        clean_up(&["clusterrolebinding,clusterrole", CLAIM_STATUS_ANY_NODE]);
        for pod in &self.pods {
            clean_up(&["pod", pod, "-n", NAMESPACE, "--wait=false"]);
        }
        for pod in &self.workloads {
            clean_up(&["pod", pod, "-n", "default", "--wait=false"]);
        }
        for kubeconfig in &self.kubeconfigs {
            let _ = std::fs::remove_file(kubeconfig);
        }
    }
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn node_agents_write_only_their_own_nodes_objects() {
    chart_installed();
    // The GPUNodes are created afresh by the agents' tokens below.
    clean_up(&["gpunode", NODE_A]);
    clean_up(&["gpunode", NODE_B]);

    step(
        "tokens of the MIG manager's and the DRA driver's pods on gpu-a100-0, and a MIG manager token of no pod",
    );
    let mig = pod_token_kubeconfig(MIG_MANAGER, NODE_A);
    let dra = pod_token_kubeconfig(DRA_DRIVER, NODE_A);
    let unbound = service_account_kubeconfig(MIG_MANAGER);
    let _cleanup = Cleanup {
        pods: vec![
            token_pod(MIG_MANAGER, NODE_A).0,
            token_pod(DRA_DRIVER, NODE_A).0,
        ],
        workloads: Vec::new(),
        kubeconfigs: vec![mig.clone(), dra.clone(), unbound.clone()],
    };
    let label = format!("{LABEL}=yes");
    // The API server loads a new policy within moments of its creation: wait until it decides (a dry run writes
    // nothing).
    eventually(Duration::from_secs(30), || {
        let labelled = kubectl_as(&mig, &["label", "node", NODE_B, &label, "--dry-run=server"]);
        Ok((!labelled.success).then_some(()))
    })
    .expect("the node-bound-writes policy never refused a write to another node");

    step("MIG manager on gpu-a100-0: another Node, the taints, and keys not NVIDIA's are refused");
    assert_refused(
        "labelling gpu-a100-1",
        &kubectl_as(&mig, &["label", "node", NODE_B, &label]),
        "nvidia-mig-manager on node gpu-a100-0 may only write its own Node, not Node gpu-a100-1",
    );
    assert_eq!(node_metadata(NODE_B, "labels", LABEL), None);
    assert_refused(
        "tainting gpu-a100-0",
        &kubectl_as(
            &mig,
            &["taint", "node", NODE_A, "e2e-node-bound=yes:NoSchedule"],
        ),
        "nvidia-mig-manager on node gpu-a100-0 may only change labels and annotations of its Node, never its spec \
         (taints, unschedulable), owner references or finalizers",
    );
    let taints = kubectl_json(&["get", "node", NODE_A])["spec"]["taints"].to_string();
    assert!(!taints.contains("e2e-node-bound"), "{taints}");
    // What `kubectl cordon` sends (which itself exits 0 when the API server refuses it).
    assert_refused(
        "marking gpu-a100-0 unschedulable",
        &kubectl_as(
            &mig,
            &[
                "patch",
                "node",
                NODE_A,
                "-p",
                r#"{"spec":{"unschedulable":true}}"#,
            ],
        ),
        "may only change labels and annotations of its Node, never its spec",
    );
    assert_eq!(
        kubectl_json(&["get", "node", NODE_A])["spec"]["unschedulable"],
        serde_json::Value::Null
    );
    assert_refused(
        "a label not NVIDIA's on gpu-a100-0",
        &kubectl_as(
            &mig,
            &["label", "node", NODE_A, "example.com/e2e-node-bound=yes"],
        ),
        "nvidia-mig-manager on node gpu-a100-0 may only change its Node's nvidia.com/ labels, not \
         example.com/e2e-node-bound",
    );
    assert_refused(
        "an annotation not NVIDIA's on gpu-a100-0",
        &kubectl_as(
            &mig,
            &["annotate", "node", NODE_A, "example.com/e2e-node-bound=yes"],
        ),
        "nvidia-mig-manager on node gpu-a100-0 may only change its Node's nvidia.com/ annotations, not \
         example.com/e2e-node-bound",
    );

    step(
        "MIG manager on gpu-a100-0: Events reported from another node, or about another Node, are refused; its own are recorded",
    );
    let event = |name: &str, reported_from: &str, about: &str| {
        json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": name, "namespace": "default"},
            "eventTime": "2026-11-26T12:00:00.000000Z",
            "reportingController": "gpu-node-agent-mig", "reportingInstance": reported_from,
            "action": "E2eNodeBound", "reason": "E2eNodeBound", "type": "Normal", "note": "node-bound events",
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": about},
        })
    };
    assert_refused(
        "an Event reported from gpu-a100-1",
        &create_as(&mig, &event("e2e-node-bound-from-b", NODE_B, NODE_B)),
        "nvidia-mig-manager on node gpu-a100-0 may only record Events reported from node gpu-a100-0, not from 'gpu-a100-1'",
    );
    assert_refused(
        "an Event about Node gpu-a100-1",
        &create_as(&mig, &event("e2e-node-bound-about-b", NODE_A, NODE_B)),
        "nvidia-mig-manager on node gpu-a100-0 may only record Events about its own Node, not Node gpu-a100-1",
    );
    assert_refused(
        "an Event without a pod-bound token",
        &create_as(&unbound, &event("e2e-node-bound-unbound", NODE_A, NODE_A)),
        "nvidia-mig-manager may record Events only with the token of its pod",
    );
    assert_allowed(
        "its own Event",
        &create_as(&mig, &event("e2e-node-bound-own", NODE_A, NODE_A)),
    );

    step(
        "MIG manager on gpu-a100-0: its own Node's NVIDIA labels and annotations are written and removed",
    );
    assert_allowed(
        "labelling gpu-a100-0",
        &kubectl_as(&mig, &["label", "node", NODE_A, &label]),
    );
    assert_eq!(
        node_metadata(NODE_A, "labels", LABEL).as_deref(),
        Some("yes")
    );
    assert_allowed(
        "annotating gpu-a100-0",
        &kubectl_as(&mig, &["annotate", "node", NODE_A, &label]),
    );
    assert_eq!(
        node_metadata(NODE_A, "annotations", LABEL).as_deref(),
        Some("yes")
    );
    let removal = format!("{LABEL}-");
    assert_allowed(
        "removing the label",
        &kubectl_as(&mig, &["label", "node", NODE_A, &removal]),
    );
    assert_eq!(node_metadata(NODE_A, "labels", LABEL), None);

    step("a token bound to no pod names no node: it writes no Node and no GPUNode");
    assert_refused(
        "labelling gpu-a100-0 without a pod",
        &kubectl_as(&unbound, &["label", "node", NODE_A, &label]),
        "nvidia-mig-manager may write Nodes only with the token of its pod, which names the pod's node; this \
         token names no node",
    );
    assert_refused(
        "creating GPUNode gpu-a100-0 without a pod",
        &create_as(&unbound, &gpu_node(NODE_A)),
        "nvidia-mig-manager may write GPUNodes only with the token of its pod",
    );

    step(
        "DRA driver on gpu-a100-0: it writes no Node at all (RBAC), and no GPUNode or ResourceSlice of gpu-a100-1",
    );
    assert_refused(
        "labelling gpu-a100-0 as the DRA driver",
        &kubectl_as(&dra, &["label", "node", NODE_A, &label]),
        "cannot patch resource \"nodes\"",
    );
    assert_refused(
        "tainting gpu-a100-0 as the DRA driver",
        &kubectl_as(
            &dra,
            &["taint", "node", NODE_A, "e2e-node-bound=yes:NoSchedule"],
        ),
        "cannot patch resource \"nodes\"",
    );
    assert_refused(
        "creating GPUNode gpu-a100-1",
        &create_as(&dra, &gpu_node(NODE_B)),
        "nvidia-dra-driver-gpu on node gpu-a100-0 may only write GPUNode gpu-a100-0, its own node's, not GPUNode \
         gpu-a100-1",
    );
    assert_allowed(
        "the admin creating GPUNode gpu-a100-1",
        &kubectl_apply(&gpu_node(NODE_B).to_string(), &[]),
    );
    assert_refused(
        "writing the status of GPUNode gpu-a100-1",
        &write_gpu_node_status(&dra, NODE_B),
        "nvidia-dra-driver-gpu on node gpu-a100-0 may only write GPUNode gpu-a100-0",
    );
    assert_refused(
        "publishing gpu-a100-1's ResourceSlice",
        &server_side_apply_as(
            &dra,
            &slice("e2e-node-bound-b", "gpu.nvidia.com", NODE_B),
            &[],
        ),
        "nvidia-dra-driver-gpu on node gpu-a100-0 may only write its own node's ResourceSlice (node gpu-a100-0, \
         pool gpu-a100-0), not one of node gpu-a100-1, pool gpu-a100-1",
    );
    assert_refused(
        "publishing another driver's ResourceSlice on gpu-a100-0",
        &server_side_apply_as(
            &dra,
            &slice("e2e-node-bound-other", "other.example.com", NODE_A),
            &[],
        ),
        "nvidia-dra-driver-gpu on node gpu-a100-0 may only write ResourceSlices of driver gpu.nvidia.com, not of \
         driver other.example.com",
    );
    let slices = kubectl_json(&["get", "resourceslices"]).to_string();
    assert!(!slices.contains("e2e-node-bound-"), "{slices}");

    step("DRA driver on gpu-a100-0: its own GPUNode and ResourceSlice are written");
    assert_allowed(
        "creating GPUNode gpu-a100-0",
        &create_as(&dra, &gpu_node(NODE_A)),
    );
    assert_allowed(
        "writing the status of GPUNode gpu-a100-0",
        &write_gpu_node_status(&dra, NODE_A),
    );
    assert_eq!(
        kubectl_json(&["get", "gpunode", NODE_A])["status"]["gpuCount"],
        json!(1)
    );
    let own = slice("e2e-node-bound-a", "gpu.nvidia.com", NODE_A);
    assert_allowed(
        "publishing gpu-a100-0's ResourceSlice",
        &server_side_apply_as(&dra, &own, &[]),
    );
    let mut next = own.clone();
    next["spec"]["pool"]["generation"] = json!(2);
    assert_allowed(
        "updating gpu-a100-0's ResourceSlice",
        &server_side_apply_as(&dra, &next, &[]),
    );
    let stored = kubectl_json(&["get", "resourceslice", "e2e-node-bound-a"]);
    assert_eq!(stored["spec"]["nodeName"], NODE_A);
    assert_eq!(stored["spec"]["pool"]["generation"], json!(2));
    // The driver never deletes a slice (the kubelet does): it may not.
    assert_refused(
        "deleting gpu-a100-0's ResourceSlice",
        &kubectl_as(&dra, &["delete", "resourceslice", "e2e-node-bound-a"]),
        "cannot delete resource \"resourceslices\"",
    );

    step(
        "DRA driver on gpu-a100-0: the device status of a claim allocated on its node is written; a claim of gpu-a100-1, \
         another pool's entry and the allocation itself are refused",
    );
    allocated_claim("e2e-node-bound-claim-a", NODE_A);
    allocated_claim("e2e-node-bound-claim-b", NODE_B);
    // Kubernetes 1.36+ refuses these itself (the driver holds `associated-node` verbs for its own driver only, and
    // entries must name allocated devices); the chart's gpu-node-agent-resourceclaim-status policy refuses the same
    // on the clusters before that authorization (1.33 to 1.35), where the status subresource alone would allow them.
    assert_refused(
        "writing the device status of a claim allocated on gpu-a100-1",
        &write_claim_status(&dra, "e2e-node-bound-claim-b", NODE_B, None),
        "cannot arbitrary-node:patch resource \"resourceclaims/driver\"",
    );
    // On 1.34 and 1.35 the API server has no `resourceclaims/driver` check: the status subresource is enough, and
    // the chart's policy is all that stands between a driver and another node's claims. Given the verbs that 1.36+
    // asks for, the driver meets that policy alone here, and it must refuse the same write.
    let granted = json!({
        "apiVersion": "v1", "kind": "List", "items": [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": CLAIM_STATUS_ANY_NODE},
                "rules": [{
                    "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
                    "resourceNames": ["gpu.nvidia.com"],
                    "verbs": ["arbitrary-node:patch", "arbitrary-node:update"],
                }],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": CLAIM_STATUS_ANY_NODE},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLAIM_STATUS_ANY_NODE},
                "subjects": [{"kind": "ServiceAccount", "name": DRA_DRIVER, "namespace": NAMESPACE}],
            },
        ],
    });
    assert_allowed(
        "granting the DRA driver every node's claims, as 1.34 and 1.35 do",
        &kubectl_apply(&granted.to_string(), &[]),
    );
    let refused = eventually(Duration::from_secs(30), || {
        let written = write_claim_status(&dra, "e2e-node-bound-claim-b", NODE_B, None);
        // RBAC grants reach the authorizer's cache within a moment: until then, the authorizer still refuses.
        Ok((!written.stderr.contains("arbitrary-node")).then_some(written))
    })
    .expect("the grant of arbitrary-node verbs never took effect");
    assert_refused(
        "writing the device status of a claim allocated on gpu-a100-1, with every node's claims granted",
        &refused,
        "may only write the status of ResourceClaims allocated on its node",
    );
    clean_up(&["clusterrolebinding,clusterrole", CLAIM_STATUS_ANY_NODE]);
    assert_refused(
        "writing another pool's device status on a claim of gpu-a100-0",
        &write_claim_status(&dra, "e2e-node-bound-claim-a", NODE_B, None),
        "must be an allocated device in the claim",
    );
    let moved = json!({
        "devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE_A, "device": "gpu-1"}
        ]},
        "nodeSelector": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE_A]}]}
        ]},
    });
    let changed = write_claim_status(&dra, "e2e-node-bound-claim-a", NODE_A, Some(moved));
    assert!(
        !changed.success,
        "a driver changed an allocation:\n{}",
        changed.stdout
    );
    assert_allowed(
        "writing the device status of a claim allocated on gpu-a100-0",
        &write_claim_status(&dra, "e2e-node-bound-claim-a", NODE_A, None),
    );
    let stored = kubectl_json(&[
        "get",
        "resourceclaim",
        "e2e-node-bound-claim-a",
        "-n",
        "default",
    ]);
    assert_eq!(
        stored["status"]["devices"][0]["data"]["memoryEnforcement"], "mpsPinned",
        "{stored:#}"
    );
    assert_eq!(
        stored["status"]["allocation"]["devices"]["results"][0]["device"], "gpu-0",
        "{stored:#}"
    );
}

/// The Eviction of pod `pod` in the default namespace, as `kubeconfig`'s user sends it (what `kubectl drain` and the
/// MIG manager send).
fn evict_as(kubeconfig: &Path, pod: &str) -> Run {
    let config = kubeconfig.display().to_string();
    let eviction = json!({
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": pod, "namespace": "default"},
    });
    kubectl_with_input(
        &[
            "--kubeconfig",
            &config,
            "create",
            "--raw",
            &format!("/api/v1/namespaces/default/pods/{pod}/eviction"),
            "-f",
            "-",
        ],
        &eviction.to_string(),
    )
}

/// A workload pod on `node` in the default namespace, removed when the test ends.
fn workload_on(node: &str) -> String {
    let name = format!("e2e-evictable-{node}");
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        },
    });
    let created = kubectl_apply(&pod.to_string(), &[]);
    assert!(created.success, "{}{}", created.stdout, created.stderr);
    name
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn node_agents_evict_only_pods_on_their_own_node() {
    chart_installed();
    // The operator's validating webhook reads the pod an agent evicts: RBAC grants pods/eviction cluster-wide,
    // and an admission policy sees the Eviction, not the pod's node.
    let _operator = Operator::with_webhook("e2e-evictions", free_port());
    let mig = pod_token_kubeconfig(MIG_MANAGER, NODE_A);
    let unbound = service_account_kubeconfig(MIG_MANAGER);
    let on_a = workload_on(NODE_A);
    let on_b = workload_on(NODE_B);
    let _cleanup = Cleanup {
        pods: vec![token_pod(MIG_MANAGER, NODE_A).0],
        workloads: vec![on_a.clone(), on_b.clone()],
        kubeconfigs: vec![mig.clone(), unbound.clone()],
    };

    step("MIG manager on gpu-a100-0: evicting a pod on gpu-a100-1 is refused, naming both nodes");
    assert_refused(
        "evicting the pod on gpu-a100-1",
        &evict_as(&mig, &on_b),
        &format!(
            "nvidia-mig-manager on node gpu-a100-0 may evict only pods on node gpu-a100-0; pod default/{on_b} \
             runs on node gpu-a100-1"
        ),
    );
    let still_there = kubectl_json(&["get", "pod", &on_b, "-n", "default"]);
    assert_eq!(
        still_there["metadata"]["deletionTimestamp"],
        serde_json::Value::Null
    );

    step("a token bound to no pod names no node: it evicts nothing");
    assert_refused(
        "evicting the pod on gpu-a100-0 without a pod-bound token",
        &evict_as(&unbound, &on_a),
        "its token names no node (authentication.kubernetes.io/node-name)",
    );

    step("MIG manager on gpu-a100-0: the pod on its own node is evicted");
    assert_allowed("evicting the pod on gpu-a100-0", &evict_as(&mig, &on_a));
    eventually(Duration::from_secs(60), || {
        let pod = run(
            "kubectl",
            &["get", "pod", &on_a, "-n", "default", "-o", "json"],
        );
        let deleting = !pod.success
            || serde_json::from_str::<serde_json::Value>(&pod.stdout)
                .is_ok_and(|pod| pod["metadata"]["deletionTimestamp"].is_string());
        Ok(deleting.then_some(()))
    })
    .expect("the evicted pod is deleted");
}
