use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use serde_json::json;

use super::*;

fn pod(uid: &str, phase: &str, claims: &[&str]) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": "team", "name": format!("pod-{uid}"), "uid": uid},
        "status": {
            "phase": phase,
            "resourceClaimStatuses": claims
                .iter()
                .map(|claim| json!({"name": "gpu", "resourceClaimName": claim}))
                .collect::<Vec<_>>(),
        }
    }))
    .expect("a pod")
}

/// Claim `uid` generated for pod `owner`, allocated, and reserved for `reserved`.
fn claim(uid: &str, owner: &str, reserved: &[&str]) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {
            "namespace": "team", "name": format!("claim-{uid}"), "uid": uid,
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Pod", "name": format!("pod-{owner}"), "uid": owner,
                "controller": true, "blockOwnerDeletion": true
            }]
        },
        "spec": {"devices": {}},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-0"}
            ]}},
            "reservedFor": reserved
                .iter()
                .map(|pod| json!({"resource": "pods", "name": format!("pod-{pod}"), "uid": pod}))
                .collect::<Vec<_>>(),
        }
    }))
    .expect("a claim")
}

fn store(pods: &[Pod]) -> (Store<Pod>, Writer<Pod>) {
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for pod in pods {
        writer.apply_watcher_event(&watcher::Event::InitApply(pod.clone()));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    (store, writer)
}

#[test]
fn a_pods_generated_claims_are_read_while_it_may_start() {
    assert_eq!(
        generated_claims(&pod("p", "Pending", &["pod-p-gpu-x1"])),
        ["pod-p-gpu-x1"]
    );
    assert!(generated_claims(&pod("p", "Succeeded", &["c"])).is_empty());
    let mut deleting = serde_json::to_value(pod("p", "Running", &["c"])).unwrap();
    deleting["metadata"]["deletionTimestamp"] = json!("2026-11-28T00:00:00Z");
    let deleting: Pod = serde_json::from_value(deleting).unwrap();
    assert!(generated_claims(&deleting).is_empty());
    // A claim the pod names itself (`resourceClaimName` in its spec) is not in its status: shared, read at prepare.
    assert!(generated_claims(&pod("p", "Pending", &[])).is_empty());
}

#[test]
fn only_a_claim_its_pod_controls_and_reserves_is_settled() {
    let owner = pod("p", "Pending", &["claim-c"]);
    assert!(settled_for(&claim("c", "p", &["p"]), &owner));
    // Read before the scheduler reserved it, or generated for another pod.
    assert!(!settled_for(&claim("c", "p", &[]), &owner));
    assert!(!settled_for(&claim("c", "q", &["p"]), &owner));
    let mut shared = claim("c", "p", &["p"]);
    shared.metadata.owner_references = None;
    assert!(!settled_for(&shared, &owner));
    let mut unallocated = claim("c", "p", &["p"]);
    unallocated.status.as_mut().unwrap().allocation = None;
    assert!(!settled_for(&unallocated, &owner));
}

#[test]
fn a_claim_read_ahead_is_handed_out_once_while_its_pod_may_start() {
    let owner = pod("p", "Pending", &["claim-c"]);
    let (pods, mut writer) = store(std::slice::from_ref(&owner));
    let prefetched = Prefetched::new(pods);

    assert!(!prefetched.keep(&owner, claim("x", "q", &["p"])));
    assert!(prefetched.keep(&owner, claim("c", "p", &["p"])));
    assert_eq!(
        prefetched.take("c").and_then(|claim| claim.metadata.uid),
        Some("c".to_owned())
    );
    assert!(prefetched.take("c").is_none(), "handed out once");
    assert!(prefetched.take("x").is_none());

    // Its pod finished (or was deleted) before the kubelet asked: the claim is read from the API server.
    assert!(prefetched.keep(&owner, claim("c", "p", &["p"])));
    writer.apply_watcher_event(&watcher::Event::Apply(pod("p", "Failed", &["claim-c"])));
    assert!(prefetched.take("c").is_none());

    // A pod of the same name with another UID is another pod.
    let mut successor = pod("p2", "Pending", &[]);
    successor.metadata.name = Some("pod-p".into());
    let (pods, _writer) = store(&[successor]);
    let prefetched = Prefetched::new(pods);
    assert!(prefetched.keep(&owner, claim("c", "p", &["p"])));
    assert!(prefetched.take("c").is_none());
}

#[test]
fn claims_of_pods_that_are_gone_are_forgotten() {
    let owner = pod("p", "Running", &["claim-c"]);
    let (pods, mut writer) = store(std::slice::from_ref(&owner));
    let prefetched = Prefetched::new(pods);
    assert!(prefetched.keep(&owner, claim("c", "p", &["p"])));
    prefetched.prune();
    assert_eq!(prefetched.lock().len(), 1);
    writer.apply_watcher_event(&watcher::Event::Delete(owner));
    prefetched.prune();
    assert!(prefetched.lock().is_empty());
}
