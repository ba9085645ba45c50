//! `gpu-operator render --policy POLICY.yaml --nodes NODES.yaml`: every object the operator would apply for
//! that ClusterPolicy and that set of Nodes, as YAML, without a cluster. For users checking a change before
//! they make it, and for tests.

use std::path::Path;

use crd::ClusterPolicy;
use k8s_openapi::api::core::v1::Node;
use serde::de::DeserializeOwned;

use crate::model::{ClusterFacts, ContainerRuntime, DefaultImages, ValidateError, validate};
use crate::render::render;

#[derive(Debug, thiserror::Error)]
pub enum RenderCommandError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{path} holds no ClusterPolicy")]
    NoPolicy { path: String },
    #[error(transparent)]
    Invalid(#[from] ValidateError),
    #[error("writing YAML: {0}")]
    Yaml(String),
}

/// What the command prints: the objects as YAML on standard output, and the warnings the operator would write
/// into the status (settings tolerated as NVIDIA's operator tolerates them, NVIDIA images replaced by this
/// operator's) on standard error.
#[derive(Debug)]
pub struct Rendered {
    pub yaml: String,
    pub warnings: Vec<String>,
}

/// Renders the objects for the policy in `policy_path` on the nodes in `nodes_path`.
pub fn render_files(
    policy_path: &Path,
    nodes_path: &Path,
    namespace: &str,
    defaults: &DefaultImages,
) -> Result<Rendered, RenderCommandError> {
    let policy: ClusterPolicy =
        documents(policy_path)?
            .into_iter()
            .next()
            .ok_or_else(|| RenderCommandError::NoPolicy {
                path: policy_path.display().to_string(),
            })?;
    let nodes: Vec<Node> = documents(nodes_path)?;
    let validated = validate(&policy.spec, defaults)?;
    let default_runtime = ContainerRuntime::from_default(&validated.spec.operator.default_runtime);
    let facts = ClusterFacts::from_nodes(namespace, &nodes, default_runtime);
    let yaml = render(&validated, &facts)
        .iter()
        .map(|object| {
            serde_saphyr::to_string(&object.to_json())
                .map(|yaml| format!("---\n{yaml}"))
                .map_err(|error| RenderCommandError::Yaml(error.to_string()))
        })
        .collect::<Result<String, _>>()?;
    let warnings = validated
        .warnings
        .iter()
        .chain(validated.component_warnings.values().flatten())
        .cloned()
        .collect();
    Ok(Rendered { yaml, warnings })
}

/// The objects of a YAML file: several documents, and `kind: List` documents unpacked.
fn documents<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>, RenderCommandError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| RenderCommandError::Read {
        path: name.clone(),
        source,
    })?;
    let parse_error = |message: String| RenderCommandError::Parse {
        path: name.clone(),
        message,
    };
    let values: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).map_err(|e| parse_error(e.to_string()))?;
    let mut objects = Vec::new();
    for value in values.into_iter().filter(|v| !v.is_null()) {
        let items = match value.get("kind").and_then(|k| k.as_str()) {
            Some("List") | Some("NodeList") => value
                .get("items")
                .and_then(|i| i.as_array())
                .cloned()
                .unwrap_or_default(),
            _ => vec![value],
        };
        for item in items {
            objects.push(serde_json::from_value(item).map_err(|e| parse_error(e.to_string()))?);
        }
    }
    Ok(objects)
}
