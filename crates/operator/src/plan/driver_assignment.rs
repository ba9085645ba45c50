//! Which GPU nodes each NVIDIADriver object drives. A node gets at most one driver: an object that picks a node
//! another object already drives is refused as a whole, and its status names the node and both objects.
//!
//! Who keeps a contested node: an object whose current spec was already accepted (settled) goes before one
//! that is new or was just edited, and among equals the older goes first (then the name). So a new object, or an
//! edit, that reaches into another pool is refused, and the drivers running there stay. NVIDIA's operator refuses
//! both objects of a conflict and never looks again (NVIDIA/gpu-operator #2355, #2259); here the refused object
//! is looked at again on every change of objects or nodes, and accepted as soon as its nodes are free.
//!
//! A `default` object drives the GPU nodes that no other object picks, whatever their selectors leave over (but the
//! nodes where a refused object's drivers still run); one default object is accepted, by the same order, and a
//! second is refused naming the first.
//!
//! Only the nodeSelector decides: nodeAffinity narrows where the pods run but a selector overlap is refused even
//! when the affinities happen to keep the pods apart, as NVIDIA's operator does.

use std::collections::BTreeMap;
use std::fmt;

use crd::labels::DRIVER_OWNER;
use k8s_openapi::jiff::Timestamp;

/// One NVIDIADriver object, as the assignment sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverClaim {
    pub name: String,
    /// The labels a node needs (the object's nodeSelector, or NVIDIA's default for an empty one).
    pub selector: BTreeMap<String, String>,
    /// Whether it drives the nodes no other object picks (NVIDIA's `spec.default`); its selector is then ignored.
    pub default: bool,
    /// Whether the object's current generation was accepted before.
    pub settled: bool,
    pub created: Option<Timestamp>,
}

/// Why an object was refused: the first of its nodes that another object drives, or (`node: None`) another
/// default object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub node: Option<String>,
    pub refused: String,
    pub holder: String,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (refused, holder) = (&self.refused, &self.holder);
        match &self.node {
            Some(node) => write!(
                f,
                "node {node} is picked by the nodeSelector of NVIDIADriver {refused} and of NVIDIADriver {holder}, \
                 which drives it; a node runs one driver: change the nodeSelector of {refused} (or of {holder}) so \
                 that they pick no node in common"
            ),
            None => write!(
                f,
                "NVIDIADriver {refused} and NVIDIADriver {holder} both set spec.default, and {holder} drives the GPU \
                 nodes no other object picks; one object is the default: set spec.default to false on {refused} \
                 and give it a nodeSelector"
            ),
        }
    }
}

/// The outcome for every object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    /// Accepted objects and the nodes each drives (possibly none).
    pub accepted: BTreeMap<String, Vec<String>>,
    /// Refused objects, with the conflict that refused each.
    pub refused: BTreeMap<String, Conflict>,
}

/// Assigns `nodes` (name and labels) to `claims`.
pub fn assign(claims: &[DriverClaim], nodes: &[(String, BTreeMap<String, String>)]) -> Assignment {
    let mut ordered: Vec<&DriverClaim> = claims.iter().collect();
    // Settled first; then the oldest (an object without a creation time, which the API server always sets,
    // last); then by name, so that the order never depends on the listing.
    ordered.sort_by(|a, b| {
        b.settled
            .cmp(&a.settled)
            .then_with(|| match (a.created, b.created) {
                (Some(a), Some(b)) => a.cmp(&b),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => std::cmp::Ordering::Equal,
            })
            .then_with(|| a.name.cmp(&b.name))
    });
    let (defaults, selecting): (Vec<&DriverClaim>, Vec<&DriverClaim>) =
        ordered.into_iter().partition(|claim| claim.default);
    let mut driven_by: BTreeMap<&str, &str> = BTreeMap::new();
    let mut assignment = Assignment::default();
    for claim in selecting {
        let picked: Vec<&str> = nodes
            .iter()
            .filter(|(_, labels)| selects(&claim.selector, labels))
            .map(|(name, _)| name.as_str())
            .collect();
        if let Some((node, holder)) = picked
            .iter()
            .find_map(|node| driven_by.get(node).map(|holder| (*node, *holder)))
        {
            assignment.refused.insert(
                claim.name.clone(),
                Conflict {
                    node: Some(node.to_owned()),
                    refused: claim.name.clone(),
                    holder: holder.to_owned(),
                },
            );
            continue;
        }
        for node in &picked {
            driven_by.insert(node, &claim.name);
        }
        assignment.accepted.insert(
            claim.name.clone(),
            picked.into_iter().map(str::to_owned).collect(),
        );
    }
    let mut defaults = defaults.into_iter();
    if let Some(default) = defaults.next() {
        // Nor the nodes a refused object's drivers still run on (their owner label names it).
        let still_refused_objects = |labels: &BTreeMap<String, String>| {
            labels
                .get(DRIVER_OWNER)
                .is_some_and(|owner| assignment.refused.contains_key(owner))
        };
        let left_over = nodes
            .iter()
            .filter(|(name, labels)| {
                !driven_by.contains_key(name.as_str()) && !still_refused_objects(labels)
            })
            .map(|(name, _)| name.clone())
            .collect();
        assignment.accepted.insert(default.name.clone(), left_over);
        for refused in defaults {
            assignment.refused.insert(
                refused.name.clone(),
                Conflict {
                    node: None,
                    refused: refused.name.clone(),
                    holder: default.name.clone(),
                },
            );
        }
    }
    assignment
}

/// Whether a node with `labels` has every label of `selector`.
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector
        .iter()
        .all(|(key, value)| labels.get(key) == Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn claim(name: &str, selector: &[(&str, &str)], settled: bool, created: i64) -> DriverClaim {
        DriverClaim {
            name: name.into(),
            selector: labels(selector),
            default: false,
            settled,
            created: Some(Timestamp::from_second(created).expect("a valid time")),
        }
    }

    /// Two pools (A100 and H100) and one node of each more, all GPU nodes.
    fn nodes() -> Vec<(String, BTreeMap<String, String>)> {
        [
            ("a100-0", "A100"),
            ("a100-1", "A100"),
            ("h100-0", "H100"),
            ("h100-1", "H100"),
        ]
        .iter()
        .map(|(name, product)| {
            (
                (*name).to_owned(),
                labels(&[("nvidia.com/gpu.present", "true"), ("pool", product)]),
            )
        })
        .collect()
    }

    #[test]
    fn two_objects_on_two_pools_each_drive_their_pool() {
        let claims = [
            claim("a100-driver", &[("pool", "A100")], false, 10),
            claim("h100-driver", &[("pool", "H100")], false, 20),
        ];
        let assignment = assign(&claims, &nodes());
        assert!(assignment.refused.is_empty(), "{assignment:?}");
        assert_eq!(assignment.accepted["a100-driver"], ["a100-0", "a100-1"]);
        assert_eq!(assignment.accepted["h100-driver"], ["h100-0", "h100-1"]);
    }

    #[test]
    fn a_third_object_that_reaches_into_a_pool_is_refused_naming_the_node_and_both_objects() {
        let claims = [
            claim("a100-driver", &[("pool", "A100")], true, 10),
            claim("h100-driver", &[("pool", "H100")], true, 20),
            // NVIDIA's default selector: every GPU node.
            claim("default", &[("nvidia.com/gpu.present", "true")], false, 5),
        ];
        let assignment = assign(&claims, &nodes());
        assert_eq!(assignment.accepted.len(), 2, "{assignment:?}");
        let conflict = &assignment.refused["default"];
        assert_eq!(
            conflict,
            &Conflict {
                node: Some("a100-0".into()),
                refused: "default".into(),
                holder: "a100-driver".into(),
            }
        );
        let message = conflict.to_string();
        for name in ["a100-0", "default", "a100-driver"] {
            assert!(message.contains(name), "{message}");
        }
    }

    #[test]
    fn among_new_objects_the_older_keeps_the_contested_nodes() {
        let claims = [
            claim("newer", &[("pool", "A100")], false, 20),
            claim("older", &[("nvidia.com/gpu.present", "true")], false, 10),
        ];
        let assignment = assign(&claims, &nodes());
        assert_eq!(assignment.accepted["older"].len(), 4);
        assert_eq!(assignment.refused["newer"].holder, "older");
    }

    #[test]
    fn an_edit_that_reaches_into_another_pool_is_refused_and_the_running_driver_stays() {
        // The older object was edited (its new generation not yet accepted) to pick every GPU node.
        let claims = [
            claim("older", &[("nvidia.com/gpu.present", "true")], false, 10),
            claim("h100-driver", &[("pool", "H100")], true, 20),
        ];
        let assignment = assign(&claims, &nodes());
        assert_eq!(assignment.accepted["h100-driver"], ["h100-0", "h100-1"]);
        assert_eq!(assignment.refused["older"].holder, "h100-driver");
        assert_eq!(assignment.refused["older"].node.as_deref(), Some("h100-0"));
    }

    #[test]
    fn a_refused_object_is_accepted_once_its_nodes_are_free() {
        let mut claims = vec![
            claim("a100-driver", &[("pool", "A100")], true, 10),
            claim(
                "everything",
                &[("nvidia.com/gpu.present", "true")],
                false,
                20,
            ),
        ];
        assert!(assign(&claims, &nodes()).refused.contains_key("everything"));
        claims.remove(0);
        let assignment = assign(&claims, &nodes());
        assert_eq!(assignment.accepted["everything"].len(), 4);
    }

    #[test]
    fn the_default_object_drives_the_nodes_no_other_object_picks_and_a_second_default_is_refused() {
        let default = |name: &str, created| DriverClaim {
            default: true,
            ..claim(name, &[("nvidia.com/gpu.present", "true")], false, created)
        };
        let claims = [
            default("newer-default", 30),
            default("default", 5),
            claim("h100-driver", &[("pool", "H100")], false, 20),
        ];
        let assignment = assign(&claims, &nodes());
        assert_eq!(assignment.accepted["h100-driver"], ["h100-0", "h100-1"]);
        assert_eq!(
            assignment.accepted["default"],
            ["a100-0", "a100-1"],
            "older than h100-driver, yet it yields the nodes another object picks"
        );
        let conflict = &assignment.refused["newer-default"];
        assert_eq!(
            (conflict.node.as_ref(), conflict.holder.as_str()),
            (None, "default")
        );
        let message = conflict.to_string();
        assert!(
            message.contains("newer-default") && message.contains("spec.default"),
            "{message}"
        );
    }

    #[test]
    fn the_default_object_leaves_the_nodes_where_a_refused_object_s_drivers_still_run() {
        let mut nodes = nodes();
        for (name, labels) in &mut nodes {
            if name.starts_with("a100") {
                labels.insert(DRIVER_OWNER.into(), "a100-driver".into());
            }
        }
        let claims = [
            // Edited to reach into the H100 pool, which h100-driver holds: refused, its drivers kept.
            claim(
                "a100-driver",
                &[("nvidia.com/gpu.present", "true")],
                false,
                10,
            ),
            claim("h100-driver", &[("pool", "H100")], true, 20),
            DriverClaim {
                default: true,
                ..claim("default", &[], true, 30)
            },
        ];
        let assignment = assign(&claims, &nodes);
        assert!(assignment.refused.contains_key("a100-driver"));
        assert_eq!(assignment.accepted["default"], Vec::<String>::new());
    }

    #[test]
    fn an_object_that_picks_no_node_is_accepted_with_none() {
        let claims = [claim("l40s-driver", &[("pool", "L40S")], false, 10)];
        let assignment = assign(&claims, &nodes());
        assert_eq!(assignment.accepted["l40s-driver"], Vec::<String>::new());
    }

    #[test]
    fn the_outcome_does_not_depend_on_the_listing_order() {
        let mut claims = vec![
            claim("a", &[("pool", "A100")], false, 10),
            claim("b", &[("pool", "A100")], false, 10),
            claim("c", &[("pool", "H100")], true, 30),
        ];
        let first = assign(&claims, &nodes());
        claims.reverse();
        assert_eq!(assign(&claims, &nodes()), first);
        assert_eq!(first.refused["b"].holder, "a");
    }
}
