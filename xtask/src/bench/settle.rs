//! Waiting for a fresh cluster to take in its nodes before a run's clock starts. Adding nodes returns once they
//! are Ready, but the control plane goes on working on them: kwok creates each node's Lease, the node lifecycle
//! controller writes each node, and the TTL controller annotates each one (`node.alpha.kubernetes.io/ttl`). The
//! TTL controller raises its value as the cluster grows past each of its steps, but writes a node only when the
//! node changes next (it counts on kubelets' status updates every few seconds; kwok's nodes send none at rest): the
//! nodes added before the last step keep a smaller value until something writes them. Measured at 5,000 nodes:
//! the first contender's label writes were that something, and the TTL controller patched 1,360 nodes in the first
//! 180 s of its rollout, on the two cores the rollout runs on, while the second contender met them done.
//!
//! So before the first contender the bench brings the cluster to where a cluster that has run a while is: it
//! touches each node with a smaller TTL than the others (an annotation of its own), and waits until no node or node
//! Lease was created and no node's metadata written for a while, with every node at one TTL.
//!
//! [`node_intake_writes`] and [`behind_on_ttl`] are pure; [`until_nodes_taken_in`] reads and writes the cluster.

use std::time::{Duration, Instant};

use harness::cluster::audit::Mark;
use harness::cluster::{ClusterInfo, Connection};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

use super::floor::patch_nodes;

/// How long the cluster must go without such a write.
const QUIET: Duration = Duration::from_secs(15);
/// The longest wait: beyond it the cluster never settles, and the run says so.
const LIMIT: Duration = Duration::from_secs(900);
/// The TTL controller's annotation.
const TTL_ANNOTATION: &str = "node.alpha.kubernetes.io/ttl";
/// The bench's own annotation, whose change makes a node's next change for the TTL controller.
const TOUCHED_ANNOTATION: &str = "bench.gpu-operator-rs/touched";

/// The writes in audit log lines that belong to taking in nodes: a Node or a node's Lease created, and any write of
/// a Node's object itself (its labels, annotations, taints). A node's status and Lease renewals go on for as long
/// as the nodes exist, and are not counted.
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

/// The nodes the TTL controller has not brought to the cluster's TTL yet: those without its annotation, or with a
/// smaller value than the largest any node has (the TTL only grows with the cluster, and the nodes added last
/// carry the current one). Empty once every node carries one value.
pub fn behind_on_ttl<'a>(ttls: &[(&'a str, Option<&str>)]) -> Vec<&'a str> {
    let seconds = |ttl: Option<&str>| ttl.and_then(|ttl| ttl.parse::<u64>().ok());
    let current = ttls.iter().filter_map(|(_, ttl)| seconds(*ttl)).max();
    ttls.iter()
        .filter(|(_, ttl)| current.is_none() || seconds(*ttl) < current)
        .map(|(node, _)| *node)
        .collect()
}

/// Waits until the audit log shows no write of [`node_intake_writes`] for [`QUIET`] and no node is
/// [`behind_on_ttl`], touching the nodes behind whenever the cluster is otherwise quiet; returns how long it took.
pub fn until_nodes_taken_in(info: &ClusterInfo) -> anyhow::Result<Duration> {
    let connection = Connection::open(&info.kubeconfig)?;
    let nodes: Api<Node> = Api::all(connection.client.clone());
    let started = Instant::now();
    let mut round: u32 = 0;
    loop {
        round += 1;
        let mark = Mark::now(&info.audit_log())?;
        std::thread::sleep(QUIET);
        let writes = node_intake_writes(&mark.text()?);
        let listed = connection.request(nodes.list_metadata(&ListParams::default()))?;
        let ttls: Vec<(&str, Option<&str>)> = listed
            .items
            .iter()
            .map(|node| {
                let ttl = node
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|annotations| annotations.get(TTL_ANNOTATION));
                (
                    node.metadata.name.as_deref().unwrap_or_default(),
                    ttl.map(String::as_str),
                )
            })
            .collect();
        let behind = behind_on_ttl(&ttls);
        if writes == 0 && behind.is_empty() {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(
            started.elapsed() < LIMIT,
            "the cluster was still taking in its nodes after {} s: {writes} writes in the last {} s, {} nodes \
             behind on the TTL annotation",
            LIMIT.as_secs(),
            QUIET.as_secs(),
            behind.len()
        );
        if writes == 0 {
            let behind: Vec<String> = behind.into_iter().map(str::to_owned).collect();
            super::say(format!(
                "touching {} nodes for the TTL controller",
                behind.len()
            ));
            let touched =
                serde_json::json!({"annotations": {TOUCHED_ANNOTATION: round.to_string()}});
            patch_nodes(&connection, &behind, &touched)?;
        }
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
    fn nodes_without_the_ttl_or_with_a_smaller_one_are_behind() {
        let ttls = [
            ("added-first", Some("0")),
            ("added-early", Some("15")),
            ("not-yet-annotated", None),
            ("added-last", Some("30")),
            ("also-last", Some("30")),
        ];
        assert_eq!(
            behind_on_ttl(&ttls),
            ["added-first", "added-early", "not-yet-annotated"]
        );
        assert!(behind_on_ttl(&[("a", Some("300")), ("b", Some("300"))]).is_empty());
        assert_eq!(
            behind_on_ttl(&[("a", None)]),
            ["a"],
            "none annotated yet: all behind"
        );
    }
}
