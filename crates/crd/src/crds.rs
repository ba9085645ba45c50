//! The CustomResourceDefinitions of the operator, assembled from the Rust types. This is the one place the
//! CRDs come from: `cargo xtask crdgen` writes them into the chart, and the operator applies them at start so
//! that `helm upgrade` upgrades the schemas too.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, ValidationRule,
};
use kube::CustomResourceExt;

use crate::{ClusterPolicy, GPUNode};

/// Every CRD the operator owns, ClusterPolicy first.
pub fn all() -> Vec<CustomResourceDefinition> {
    let mut cluster_policy = ClusterPolicy::crd();
    for version in &mut cluster_policy.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            && let Some(spec) = schema
                .properties
                .as_mut()
                .and_then(|properties| properties.get_mut("spec"))
        {
            preserve_unknown_fields(spec);
            add_image_rule(spec);
        }
    }
    let mut crds = vec![cluster_policy, GPUNode::crd()];
    for crd in &mut crds {
        for version in &mut crd.spec.versions {
            if let Some(schema) = version
                .schema
                .as_mut()
                .and_then(|s| s.open_api_v3_schema.as_mut())
            {
                unwrap_descriptions(schema);
            }
        }
    }
    crds
}

/// Doc comments are wrapped at the source's line width; `kubectl explain` wraps to the terminal itself. A line
/// break is kept only where a paragraph or a list item (as in Kubernetes' own descriptions) begins.
fn unwrap_descriptions(schema: &mut JSONSchemaProps) {
    if let Some(description) = schema.description.as_mut() {
        let mut text = String::with_capacity(description.len());
        for line in description.lines().map(str::trim) {
            let starts_block = line.is_empty()
                || line.starts_with(['-', '*'])
                || text.ends_with('\n')
                || text.is_empty();
            if !text.is_empty() {
                text.push(if starts_block { '\n' } else { ' ' });
            }
            text.push_str(line);
        }
        *description = text;
    }
    schema
        .properties
        .iter_mut()
        .flat_map(|p| p.values_mut())
        .for_each(unwrap_descriptions);
    if let Some(JSONSchemaPropsOrArray::Schema(item)) = schema.items.as_mut() {
        unwrap_descriptions(item);
    }
}

/// Marks every object of the spec `x-kubernetes-preserve-unknown-fields`, so that a field this version does not
/// know (a newer NVIDIA field, or a typo) is kept as written instead of being pruned by the API server; the
/// operator names such fields in its status ([`unknown_spec_fields`]).
fn preserve_unknown_fields(schema: &mut JSONSchemaProps) {
    if schema.type_.as_deref() == Some("object") && schema.properties.is_some() {
        schema.x_kubernetes_preserve_unknown_fields = Some(true);
    }
    schema
        .properties
        .iter_mut()
        .flat_map(|p| p.values_mut())
        .for_each(preserve_unknown_fields);
    if let Some(items) = schema.items.as_mut() {
        match items {
            JSONSchemaPropsOrArray::Schema(item) => preserve_unknown_fields(item),
            JSONSchemaPropsOrArray::Schemas(items) => {
                items.iter_mut().for_each(preserve_unknown_fields)
            }
        }
    }
}

/// The paths of the fields in a ClusterPolicy `spec` (as stored, unknown fields included) that its schema does
/// not define, e.g. `spec.devicePlugin.confg`. Maps (labels, resources) and the unimplemented sections accept
/// any key.
pub fn unknown_spec_fields(spec: &serde_json::Value) -> Vec<String> {
    let crd = ClusterPolicy::crd();
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|root| root.properties.as_ref())
        .and_then(|properties| properties.get("spec"));
    let mut unknown = Vec::new();
    if let Some(schema) = schema {
        collect_unknown(spec, schema, "spec", &mut unknown);
    }
    unknown
}

fn collect_unknown(
    value: &serde_json::Value,
    schema: &JSONSchemaProps,
    path: &str,
    unknown: &mut Vec<String>,
) {
    match value {
        serde_json::Value::Object(fields) => {
            // Before `all()` marks every object, only the types that keep arbitrary fields on purpose (the
            // unimplemented sections) preserve unknown fields: everything in them is expected.
            if schema.x_kubernetes_preserve_unknown_fields == Some(true) {
                return;
            }
            let Some(properties) = schema.properties.as_ref() else {
                return;
            };
            for (key, child) in fields {
                match properties.get(key) {
                    Some(child_schema) => {
                        collect_unknown(child, child_schema, &format!("{path}.{key}"), unknown)
                    }
                    None => unknown.push(format!("{path}.{key}")),
                }
            }
        }
        serde_json::Value::Array(items) => {
            if let Some(JSONSchemaPropsOrArray::Schema(item_schema)) = schema.items.as_ref() {
                for (index, item) in items.iter().enumerate() {
                    collect_unknown(item, item_schema, &format!("{path}[{index}]"), unknown);
                }
            }
        }
        _ => {}
    }
}

/// CEL rule for an object carrying an image: NVIDIA builds `repository/image:version`, so a partly set triple
/// yields a broken reference. Either all three are set, or repository and version are empty (image alone is
/// then a complete reference, or nothing is set and the default image is used).
const IMAGE_RULE: &str = "(has(self.repository) && self.repository != '') == (has(self.version) && self.version != '') \
     && (!has(self.repository) || self.repository == '' || (has(self.image) && self.image != ''))";

const IMAGE_RULE_MESSAGE: &str = "repository, image and version must be set together (e.g. repository: nvcr.io/nvidia, \
     image: k8s-device-plugin, version: v0.17.0), or set only image to a complete reference such as \
     nvcr.io/nvidia/k8s-device-plugin:v0.17.0";

/// Adds [`IMAGE_RULE`] to every object schema that has the three image fields, wherever it sits. The rule is
/// attached here rather than on each section type because the image fields are flattened into the sections.
fn add_image_rule(schema: &mut JSONSchemaProps) {
    let has_image = schema.properties.as_ref().is_some_and(|properties| {
        ["repository", "image", "version"]
            .iter()
            .all(|field| properties.contains_key(*field))
    });
    if has_image {
        schema
            .x_kubernetes_validations
            .get_or_insert_with(Vec::new)
            .push(ValidationRule {
                rule: IMAGE_RULE.into(),
                message: Some(IMAGE_RULE_MESSAGE.into()),
                ..ValidationRule::default()
            });
    }
    schema
        .properties
        .iter_mut()
        .flat_map(|p| p.values_mut())
        .for_each(add_image_rule);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn property<'a>(schema: &'a JSONSchemaProps, path: &[&str]) -> &'a JSONSchemaProps {
        path.iter().fold(schema, |schema, field| {
            schema
                .properties
                .as_ref()
                .and_then(|p| p.get(*field))
                .unwrap_or_else(|| panic!("no property {field}"))
        })
    }

    fn root_schema(crd: &CustomResourceDefinition) -> &JSONSchemaProps {
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("schema")
    }

    #[test]
    fn image_rule_is_on_every_operand_with_an_image() {
        let crds = all();
        let spec = property(root_schema(&crds[0]), &["spec"]);
        for section in [
            "driver",
            "toolkit",
            "devicePlugin",
            "dcgmExporter",
            "dcgm",
            "gfd",
            "migManager",
            "validator",
        ] {
            let rules = property(spec, &[section]).x_kubernetes_validations.as_ref();
            assert!(
                rules.is_some_and(|rules| rules.iter().any(|r| r.rule == IMAGE_RULE)),
                "spec.{section} lacks the image rule"
            );
        }
        let init_container = property(spec, &["operator", "initContainer"]);
        assert!(init_container.x_kubernetes_validations.is_some());
    }

    #[test]
    fn sections_keep_unknown_fields() {
        let crds = all();
        let spec = property(root_schema(&crds[0]), &["spec"]);
        let nested = [
            &["driver"][..],
            &["devicePlugin", "config"],
            &["daemonsets", "rollingUpdate"],
            &["vgpuManager"],
        ];
        for path in nested {
            assert_eq!(
                property(spec, path).x_kubernetes_preserve_unknown_fields,
                Some(true),
                "spec.{}",
                path.join(".")
            );
        }
    }

    #[test]
    fn unknown_spec_fields_are_named_by_path() {
        let spec = serde_json::json!({
            "devicePlugin": {"confg": {"name": "x"}, "env": [{"name": "A", "valu": "1"}]},
            "daemonsets": {"labels": {"anything": "goes"}, "tolerations": [{"key": "k", "operator": "Exists"}]},
            "vgpuManager": {"enabled": true, "driverManager": {"image": "x"}},
            "futureSection": {}
        });
        assert_eq!(
            unknown_spec_fields(&spec),
            [
                "spec.devicePlugin.confg",
                "spec.devicePlugin.env[0].valu",
                "spec.futureSection"
            ]
        );
    }

    #[test]
    fn descriptions_keep_paragraphs_and_lists_only() {
        let mut schema = JSONSchemaProps {
            description: Some(
                "A wrapped\nsentence.\n\nSecond paragraph:\n- item one\n- item two\n  continued"
                    .into(),
            ),
            ..JSONSchemaProps::default()
        };
        unwrap_descriptions(&mut schema);
        assert_eq!(
            schema.description.as_deref(),
            Some("A wrapped sentence.\n\nSecond paragraph:\n- item one\n- item two continued")
        );
    }

    #[test]
    fn every_field_has_a_description() {
        fn walk(schema: &JSONSchemaProps, path: &str, missing: &mut Vec<String>) {
            for (name, child) in schema.properties.iter().flatten() {
                let child_path = format!("{path}.{name}");
                if child.description.as_deref().unwrap_or_default().is_empty() {
                    missing.push(child_path.clone());
                }
                walk(child, &child_path, missing);
            }
        }
        let mut missing = Vec::new();
        for crd in all() {
            let root = root_schema(&crd);
            for top in ["spec", "status"] {
                if let Some(schema) = root.properties.as_ref().and_then(|p| p.get(top)) {
                    // Kubernetes' own types (tolerations, affinity, conditions) carry upstream descriptions.
                    walk(
                        schema,
                        &format!("{}.{top}", crd.spec.names.kind),
                        &mut missing,
                    );
                }
            }
        }
        assert!(
            missing.is_empty(),
            "fields without a description: {missing:#?}"
        );
    }
}
