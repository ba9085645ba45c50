//! Waiting for a fresh cluster to take in its nodes before a run's clock starts. Adding nodes returns once they
//! are Ready, but the control plane goes on working on them for minutes at 5,000 nodes: kwok creates each node's
//! Lease, the node lifecycle controller writes each node, and the TTL controller annotates each one
//! (`node.alpha.kubernetes.io/ttl`). The TTL controller raises its value as the cluster grows past each of its
//! steps, but writes a node only on the node's next change: the nodes added before the last step keep the old
//! value until something writes them. Measured at 5,000 nodes: the first contender's label writes were that
//! something, and the TTL controller patched 1,360 nodes in the first 180 s of its rollout, on the two cores the
//! rollout runs on, while the second contender met a quiet cluster. So the first contender waits until the nodes
//! are taken in: no node or node Lease created and no node's metadata written for a while, and every node annotated
//! with one TTL (kwok's heartbeats, which change each node, bring the last ones along).
//!
//! [`node_intake_writes`] and [`one_ttl`] are pure; [`until_nodes_taken_in`] reads the audit log and the nodes.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use harness::cluster::audit::Mark;
use harness::cluster::{ClusterInfo, Connection};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

/// How long the cluster must go without such a write.
const QUIET: Duration = Duration::from_secs(15);
/// The longest wait: beyond it the cluster never settles, and the run says so.
const LIMIT: Duration = Duration::from_secs(900);
/// The TTL controller's annotation.
const TTL_ANNOTATION: &str = "node.alpha.kubernetes.io/ttl";

/// The writes in audit log lines that belong to taking in nodes: a Node or a node's Lease created, and any write of
/// a Node's object itself (its labels, annotations, taints). A node's status, which kwok writes as its heartbeat,
/// and Lease renewals go on for as long as the nodes exist, and are not counted.
pub fn node_intake_writes(log: &str) -> u64 {
    let mut writes = 0;
    for line in log.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if event["stage"] != "ResponseComplete" {
            continue;
        }
        let object = &event["objectRef"];
        let verb = event["verb"].as_str().unwrap_or_default();
        let node_itself = object["resource"] == "nodes"
            && object["subresource"].is_null()
            && matches!(verb, "create" | "update" | "patch");
        let lease_created = object["resource"] == "leases"
            && object["namespace"] == "kube-node-lease"
            && verb == "create";
        if node_itself || lease_created {
            writes += 1;
        }
    }
    writes
}

/// Whether every node carries the TTL annotation, all with one value: the TTL controller is done with them.
pub fn one_ttl<'a>(ttls: impl IntoIterator<Item = Option<&'a str>>) -> bool {
    let distinct: BTreeSet<Option<&str>> = ttls.into_iter().collect();
    distinct.len() == 1 && !distinct.contains(&None)
}

/// Waits until the audit log shows no write of [`node_intake_writes`] for [`QUIET`] and the nodes have
/// [`one_ttl`]; returns how long it took.
pub fn until_nodes_taken_in(info: &ClusterInfo) -> anyhow::Result<Duration> {
    let connection = Connection::open(&info.kubeconfig)?;
    let nodes: Api<Node> = Api::all(connection.client.clone());
    let started = Instant::now();
    loop {
        let mark = Mark::now(&info.audit_log())?;
        std::thread::sleep(QUIET);
        let writes = node_intake_writes(&mark.text()?);
        let listed = connection.request(nodes.list_metadata(&ListParams::default()))?;
        let ttls: Vec<Option<&str>> = listed
            .items
            .iter()
            .map(|node| {
                node.metadata
                    .annotations
                    .as_ref()
                    .and_then(|annotations| annotations.get(TTL_ANNOTATION))
                    .map(String::as_str)
            })
            .collect();
        if writes == 0 && one_ttl(ttls.iter().copied()) {
            return Ok(started.elapsed());
        }
        let distinct: BTreeSet<&Option<&str>> = ttls.iter().collect();
        anyhow::ensure!(
            started.elapsed() < LIMIT,
            "the cluster was still taking in its nodes after {} s: {writes} writes in the last {} s, TTL \
             annotations {distinct:?}",
            LIMIT.as_secs(),
            QUIET.as_secs()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Audit events as the API server writes them at Metadata level (trimmed to the fields read).
    fn event(verb: &str, resource: &str, subresource: Option<&str>, namespace: &str) -> String {
        serde_json::json!({
            "kind": "Event",
            "stage": "ResponseComplete",
            "verb": verb,
            "user": {"username": "system:serviceaccount:kube-system:ttl-controller"},
            "objectRef": {
                "resource": resource,
                "subresource": subresource,
                "namespace": namespace,
                "name": "gpu-a100-0001",
                "apiVersion": "v1",
            },
        })
        .to_string()
    }

    #[test]
    fn nodes_written_or_created_and_node_leases_created_count() {
        let log = [
            event("patch", "nodes", None, ""),
            event("create", "nodes", None, ""),
            event("create", "leases", None, "kube-node-lease"),
        ]
        .join("\n");
        assert_eq!(node_intake_writes(&log), 3);
    }

    #[test]
    fn heartbeats_renewals_reads_and_other_objects_do_not() {
        let mut started =
            serde_json::from_str::<serde_json::Value>(&event("patch", "nodes", None, "")).unwrap();
        started["stage"] = "ResponseStarted".into();
        let log = [
            event("patch", "nodes", Some("status"), ""),
            event("update", "leases", None, "kube-node-lease"),
            event("create", "leases", None, "kube-system"),
            event("get", "nodes", None, ""),
            event("create", "pods", None, "gpu-operator"),
            started.to_string(),
            "{not json, a line cut at the mark".to_owned(),
        ]
        .join("\n");
        assert_eq!(node_intake_writes(&log), 0);
    }

    #[test]
    fn nodes_are_done_when_all_carry_one_ttl() {
        assert!(one_ttl([Some("300"), Some("300")]));
        assert!(
            !one_ttl([Some("60"), Some("300")]),
            "the older nodes not yet raised"
        );
        assert!(!one_ttl([None, Some("0")]), "a node not yet annotated");
        assert!(!one_ttl(std::iter::empty()), "no node");
    }
}
