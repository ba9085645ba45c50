//! Whether a pod template places a pod on a node, as the DaemonSet controller decides it from the template's
//! nodeSelector and required node affinity: for the driver upgrade, which must know which driver DaemonSet serves
//! each node, and for the tests that hold the operands' affinity to the node label plan.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, PodSpec};

/// Whether a pod of `pod` may run on the node named `node` with `labels`: every nodeSelector entry matches, and
/// one term of the required node affinity, if any, matches.
#[must_use]
pub fn places_on(pod: &PodSpec, node: &str, labels: &BTreeMap<String, String>) -> bool {
    let selected = pod.node_selector.as_ref().is_none_or(|selector| {
        selector
            .iter()
            .all(|(key, value)| labels.get(key) == Some(value))
    });
    let required = pod
        .affinity
        .as_ref()
        .and_then(|affinity| affinity.node_affinity.as_ref())
        .and_then(|affinity| {
            affinity
                .required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    selected
        && required.is_none_or(|required| {
            required
                .node_selector_terms
                .iter()
                .any(|term| term_matches(term, node, labels))
        })
}

/// A term matches when all its requirements do; an empty term matches no node (as Kubernetes reads it).
fn term_matches(term: &NodeSelectorTerm, node: &str, labels: &BTreeMap<String, String>) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    // The only field a node selector term may name is the node's name.
    let fields = term.match_fields.as_deref().unwrap_or_default();
    (!expressions.is_empty() || !fields.is_empty())
        && expressions
            .iter()
            .all(|requirement| requirement_matches(requirement, labels))
        && (fields.is_empty() || {
            let node_name = BTreeMap::from([("metadata.name".to_owned(), node.to_owned())]);
            fields
                .iter()
                .all(|requirement| requirement_matches(requirement, &node_name))
        })
}

fn requirement_matches(
    requirement: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> bool {
    let value = labels.get(&requirement.key);
    let values = requirement.values.as_deref().unwrap_or_default();
    let compared = |keep: fn(i64, i64) -> bool| {
        let number = value.and_then(|v| v.parse::<i64>().ok());
        let bound = values.first().and_then(|v| v.parse::<i64>().ok());
        number.zip(bound).is_some_and(|(n, b)| keep(n, b))
    };
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => compared(|n, b| n > b),
        "Lt" => compared(|n, b| n < b),
        // The API server refuses any other operator.
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Affinity, NodeAffinity, NodeSelector};

    fn requirement(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn term(expressions: Vec<NodeSelectorRequirement>) -> NodeSelectorTerm {
        NodeSelectorTerm {
            match_expressions: Some(expressions),
            match_fields: None,
        }
    }

    fn pod(selector: &[(&str, &str)], terms: Option<Vec<NodeSelectorTerm>>) -> PodSpec {
        PodSpec {
            node_selector: Some(
                selector
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            affinity: terms.map(|terms| Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: terms,
                    }),
                    ..NodeAffinity::default()
                }),
                ..Affinity::default()
            }),
            ..PodSpec::default()
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_node_selector_and_one_affinity_term_must_match() {
        let spec = pod(
            &[("pool", "gpu")],
            Some(vec![
                term(vec![requirement("a", "In", &["1", "2"])]),
                term(vec![
                    requirement("a", "DoesNotExist", &[]),
                    requirement("b", "NotIn", &["false"]),
                ]),
            ]),
        );
        assert!(places_on(
            &spec,
            "n",
            &labels(&[("pool", "gpu"), ("a", "2")])
        ));
        assert!(places_on(&spec, "n", &labels(&[("pool", "gpu")])));
        assert!(places_on(
            &spec,
            "n",
            &labels(&[("pool", "gpu"), ("b", "x")])
        ));
        assert!(!places_on(
            &spec,
            "n",
            &labels(&[("pool", "gpu"), ("b", "false")])
        ));
        assert!(!places_on(
            &spec,
            "n",
            &labels(&[("pool", "gpu"), ("a", "3")])
        ));
        assert!(
            !places_on(&spec, "n", &labels(&[("a", "1")])),
            "the selector"
        );
    }

    #[test]
    fn numbers_fields_and_empty_terms_read_as_kubernetes_reads_them() {
        let gt = pod(
            &[],
            Some(vec![term(vec![requirement("cores", "Gt", &["8"])])]),
        );
        assert!(places_on(&gt, "n", &labels(&[("cores", "16")])));
        assert!(!places_on(&gt, "n", &labels(&[("cores", "8")])));
        assert!(!places_on(&gt, "n", &labels(&[("cores", "many")])));
        let lt = pod(
            &[],
            Some(vec![term(vec![requirement("cores", "Lt", &["8"])])]),
        );
        assert!(places_on(&lt, "n", &labels(&[("cores", "4")])));
        assert!(!places_on(&lt, "n", &labels(&[])));

        let by_name = pod(
            &[],
            Some(vec![NodeSelectorTerm {
                match_expressions: None,
                match_fields: Some(vec![requirement("metadata.name", "In", &["gpu-1"])]),
            }]),
        );
        assert!(places_on(&by_name, "gpu-1", &labels(&[])));
        assert!(!places_on(&by_name, "gpu-2", &labels(&[])));

        let empty = pod(&[], Some(vec![term(vec![])]));
        assert!(
            !places_on(&empty, "n", &labels(&[])),
            "an empty term matches nothing"
        );
        assert!(places_on(&pod(&[], None), "n", &labels(&[])));
    }
}
