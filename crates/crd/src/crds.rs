//! The CustomResourceDefinitions of the operator, assembled from the Rust types. This is the one place the
//! CRDs come from: `cargo xtask crdgen` writes them into the chart, and the operator applies them at start so
//! that `helm upgrade` upgrades the schemas too.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
    ValidationRule,
};
use kube::CustomResourceExt;

use crate::nvidia_driver::NVIDIADriver;
use crate::{ClusterPolicy, GPUNode};

/// Every CRD the operator owns, ClusterPolicy first. NVIDIADriver is NVIDIA's, applied here as NVIDIA's chart does,
/// so that `driver.useNvidiaDriverCRD` works without a second install step.
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
    let mut crds = vec![cluster_policy, GPUNode::crd(), NVIDIADriver::crd()];
    for crd in &mut crds {
        for version in &mut crd.spec.versions {
            if let Some(schema) = version
                .schema
                .as_mut()
                .and_then(|s| s.open_api_v3_schema.as_mut())
            {
                unwrap_descriptions(schema);
                bound_integers(schema);
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

/// The largest `f64` that is not above `i64::MAX` (2^63 - 1024), the maximum of every 64-bit integer field. The API
/// server holds a schema's bounds as float64 and stored integers as int64: it checks an integer against a maximum
/// by converting the float to int64 (kube-openapi `MaximumNativeType`), and `i64::MAX` as a float is 2^63, which
/// overflows that conversion (to `i64::MIN` on amd64: every value would exceed it). A `u64` field is bounded the
/// same way because the API server cannot store a larger integer as one: it decodes it as a float, which the
/// Rust type cannot read back.
const INT64_MAXIMUM: f64 = 9_223_372_036_854_774_784.0;
/// The minimum of every signed 64-bit integer field: `-INT64_MAXIMUM`, not `i64::MIN` (-2^63). The API server
/// refuses an object whose schema has a CEL rule on an int64 field with the minimum -2^63 ("Minimum boundary value
/// must be of type integer with format int64", seen on Kubernetes 1.37 with `watchdog.intervalSeconds`), while it
/// accepts -(2^63 - 1024).
const INT64_MINIMUM: f64 = -INT64_MAXIMUM;

/// The range of an integer `format` as schemars writes it for each Rust type (`uint` and `int` are usize and
/// isize), as (minimum, maximum); `None` for a format with no such range.
fn format_range(format: &str) -> Option<(f64, f64)> {
    Some(match format {
        "int8" => (i8::MIN.into(), i8::MAX.into()),
        "int16" => (i16::MIN.into(), i16::MAX.into()),
        "int32" => (i32::MIN.into(), i32::MAX.into()),
        "int64" | "int" => (INT64_MINIMUM, INT64_MAXIMUM),
        "uint8" => (0.0, u8::MAX.into()),
        "uint16" => (0.0, u16::MAX.into()),
        "uint32" => (0.0, u32::MAX.into()),
        "uint64" | "uint" => (0.0, INT64_MAXIMUM),
        _ => return None,
    })
}

/// Gives every integer the range of its Rust type as `minimum` and `maximum` (keeping a tighter bound written on
/// the field), so that the API server refuses a value the operator could not read: one unreadable object in a
/// list would otherwise fail the whole list of a watch.
fn bound_integers(schema: &mut JSONSchemaProps) {
    if schema.type_.as_deref() == Some("integer")
        && let Some((minimum, maximum)) = schema.format.as_deref().and_then(format_range)
    {
        schema.minimum = Some(schema.minimum.map_or(minimum, |set| set.max(minimum)));
        schema.maximum = Some(schema.maximum.map_or(maximum, |set| set.min(maximum)));
    }
    schema
        .properties
        .iter_mut()
        .flat_map(|p| p.values_mut())
        .for_each(bound_integers);
    match schema.items.as_mut() {
        Some(JSONSchemaPropsOrArray::Schema(item)) => bound_integers(item),
        Some(JSONSchemaPropsOrArray::Schemas(items)) => items.iter_mut().for_each(bound_integers),
        None => {}
    }
    if let Some(JSONSchemaPropsOrBool::Schema(values)) = schema.additional_properties.as_mut() {
        bound_integers(values);
    }
    [&mut schema.all_of, &mut schema.any_of, &mut schema.one_of]
        .into_iter()
        .flatten()
        .flatten()
        .for_each(bound_integers);
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
    let mut unknown = Vec::new();
    if let Some(schema) = typed_spec_schema() {
        collect_unknown(spec, &schema, "spec", &mut unknown);
    }
    unknown
}

/// The ClusterPolicy `spec` schema as the Rust types define it: only the types that keep arbitrary fields on
/// purpose (the unimplemented sections) preserve unknown fields, before [`all`] marks every object.
fn typed_spec_schema() -> Option<JSONSchemaProps> {
    let crd = ClusterPolicy::crd();
    crd.spec
        .versions
        .into_iter()
        .next()?
        .schema?
        .open_api_v3_schema?
        .properties?
        .remove("spec")
}

/// The ClusterPolicy `spec` schema for the Helm chart's values.schema.json (`cargo xtask crdgen`): the fields,
/// descriptions and integer bounds of the CRD, and unknown fields refused wherever the Rust types define every
/// field, so that a misspelled value is caught at `helm install` instead of being kept and reported.
pub fn cluster_policy_spec_schema() -> Option<JSONSchemaProps> {
    let mut spec = typed_spec_schema()?;
    unwrap_descriptions(&mut spec);
    bound_integers(&mut spec);
    Some(spec)
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

/// CEL rule for an object carrying an image: either all three of repository, image and version are set, or
/// repository and version are empty (image alone is then a complete reference, or nothing is set and the default
/// image is used). Kept because NVIDIA's operator fails on the same input: its `imagePath`
/// (api/nvidia/v1/clusterpolicy_types.go) returns "invalid image specification: repository, image and version
/// must all be set" for a partly set triple, and the component is not deployed. Like NVIDIA's, which resolves
/// images only for the components it deploys, the rule does not look at a section with `enabled: false`
/// ([`IMAGE_RULE_DISABLED`]).
const IMAGE_RULE: &str = "(has(self.repository) && self.repository != '') == (has(self.version) && self.version != '') \
     && (!has(self.repository) || self.repository == '' || (has(self.image) && self.image != ''))";

/// What [`IMAGE_RULE`] is prefixed with in sections that have an `enabled` switch.
const IMAGE_RULE_DISABLED: &str = "(has(self.enabled) && !self.enabled) || ";

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
        let switchable = schema
            .properties
            .as_ref()
            .is_some_and(|properties| properties.contains_key("enabled"));
        let rule = if switchable {
            format!("{IMAGE_RULE_DISABLED}({IMAGE_RULE})")
        } else {
            IMAGE_RULE.to_owned()
        };
        schema
            .x_kubernetes_validations
            .get_or_insert_with(Vec::new)
            .push(ValidationRule {
                rule,
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

    /// Walks each generated CRD as the API server reads it (JSON), so an integer is found wherever it sits (maps,
    /// lists, nested types) whatever schema structure produced it.
    #[test]
    fn every_integer_has_both_bounds() {
        /// Every integer's path, with whether it has both bounds.
        fn walk(value: &serde_json::Value, path: &str, integers: &mut Vec<(String, bool)>) {
            match value {
                serde_json::Value::Object(fields) => {
                    let bounded = ["minimum", "maximum"]
                        .iter()
                        .all(|bound| fields.get(*bound).is_some_and(serde_json::Value::is_number));
                    if fields.get("type").and_then(serde_json::Value::as_str) == Some("integer") {
                        integers.push((path.to_owned(), bounded));
                    }
                    for (key, child) in fields {
                        walk(child, &format!("{path}.{key}"), integers);
                    }
                }
                serde_json::Value::Array(items) => {
                    for (index, item) in items.iter().enumerate() {
                        walk(item, &format!("{path}[{index}]"), integers);
                    }
                }
                _ => {}
            }
        }
        let mut integers = Vec::new();
        for crd in all() {
            let schema = serde_json::to_value(root_schema(&crd)).expect("schema as JSON");
            walk(&schema, &crd.spec.names.kind, &mut integers);
        }
        // Both CRDs have integers (GPUNode's status counts, ClusterPolicy's probes): none found is a broken walk.
        assert!(integers.len() > 2, "integers found: {integers:?}");
        let unbounded: Vec<&str> = integers
            .iter()
            .filter(|(_, bounded)| !bounded)
            .map(|(path, _)| path.as_str())
            .collect();
        assert!(
            unbounded.is_empty(),
            "integers without minimum and maximum: {unbounded:#?}"
        );
    }

    #[test]
    fn integer_bounds_are_those_of_the_rust_type() {
        let crds = all();
        let bounds = |schema: &JSONSchemaProps| (schema.minimum, schema.maximum);
        let gpu_node_status = property(root_schema(&crds[1]), &["status"]);
        // i32
        assert_eq!(
            bounds(property(gpu_node_status, &["gpuCount"])),
            (Some(-2_147_483_648.0), Some(2_147_483_647.0))
        );
        let device_plugin = property(gpu_node_status, &["devicePlugin"]);
        // Vec<u32>
        let Some(JSONSchemaPropsOrArray::Schema(unhealthy)) =
            property(device_plugin, &["unhealthyGpus"]).items.as_ref()
        else {
            panic!("unhealthyGpus is a list of one schema");
        };
        assert_eq!(bounds(unhealthy), (Some(0.0), Some(4_294_967_295.0)));
        // u64 in a list of objects
        let Some(JSONSchemaPropsOrArray::Schema(device)) =
            property(gpu_node_status, &["dra", "devices"])
                .items
                .as_ref()
        else {
            panic!("dra.devices is a list of one schema");
        };
        assert_eq!(
            bounds(property(device, &["memoryMiB"])),
            (Some(0.0), Some(INT64_MAXIMUM))
        );
        // A bound the field sets itself is kept where it is tighter.
        let probe = property(
            root_schema(&crds[0]),
            &["spec", "driver", "livenessProbe", "periodSeconds"],
        );
        assert_eq!(bounds(probe), (Some(1.0), Some(2_147_483_647.0)));
    }

    #[test]
    fn the_64_bit_maximum_survives_the_api_servers_conversion_to_int64() {
        // Exactly an integer the API server's int64 holds, and the next float up is 2^63, which it does not.
        assert_eq!(INT64_MAXIMUM as i64 as f64, INT64_MAXIMUM);
        assert!(INT64_MAXIMUM as i128 <= i128::from(i64::MAX));
        assert!(f64::from_bits(INT64_MAXIMUM.to_bits() + 1) as i128 > i128::from(i64::MAX));
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
                rules.is_some_and(|rules| rules.iter().any(|r| r.rule.contains(IMAGE_RULE))),
                "spec.{section} lacks the image rule"
            );
        }
        let init_container = property(spec, &["operator", "initContainer"]);
        assert!(init_container.x_kubernetes_validations.is_some());
    }

    /// Every schema rule of the ClusterPolicy with the path it sits at, as `path: rule`.
    fn cluster_policy_rules() -> Vec<String> {
        fn walk(schema: &JSONSchemaProps, path: &str, rules: &mut Vec<String>) {
            for rule in schema.x_kubernetes_validations.iter().flatten() {
                rules.push(format!("{path}: {}", rule.rule));
            }
            for (name, child) in schema.properties.iter().flatten() {
                walk(child, &format!("{path}.{name}"), rules);
            }
        }
        let crds = all();
        let mut rules = Vec::new();
        walk(
            property(root_schema(&crds[0]), &["spec"]),
            "spec",
            &mut rules,
        );
        rules
    }

    /// Our CEL may only refuse what NVIDIA's operator fails on too; everything stricter is a status warning.
    /// Each rule kept is listed here with what NVIDIA does with the same input, and the end-to-end test
    /// `cel_rules_reject_bad_input_with_their_message` (tests/tests/foundation.rs) shows each refusing it on a
    /// real API server. A new rule fails this test until it is justified here.
    #[test]
    fn every_cel_rule_refuses_only_what_nvidia_fails_on() {
        // (where, what NVIDIA's operator does with the input the rule refuses)
        let kept = [
            (
                "spec.daemonsets: self.updateStrategy == 'OnDelete'",
                "object_controls.go applyUpdateStrategyConfig: \"failed to apply rolling update config\" for a value that is neither N% nor an integer; a negative one yields a DaemonSet the API server refuses",
            ),
            (
                "spec.daemonsets.updateStrategy: ",
                "NVIDIA's CRD: enum [RollingUpdate, OnDelete]",
            ),
            (
                "spec.driver.kernelModuleType: ",
                "NVIDIA's CRD: enum [auto, open, proprietary]",
            ),
            (
                "spec.driver.upgradePolicy: ",
                "upgrade_controller.go: intstr.GetScaledValueFromIntOrPercent errors on a non-percentage string when autoUpgrade is true",
            ),
            (
                "spec.mig.strategy: ",
                "NVIDIA's CRD: enum [none, single, mixed]",
            ),
            (
                "spec.migManager.config.default: ",
                "NVIDIA's CRD: enum [all-disabled, \"\"]",
            ),
            // Ours: NVIDIA's ClusterPolicy has no watchdog section, so no policy written for it carries one.
            (
                "spec.watchdog.",
                "no counterpart: the section is this operator's own",
            ),
            (
                "spec.draDriver.",
                "no counterpart: the section is this operator's own",
            ),
        ];
        let image_sections = [
            "spec.driver",
            "spec.driver.manager",
            "spec.toolkit",
            "spec.devicePlugin",
            "spec.dcgmExporter",
            "spec.dcgm",
            "spec.gfd",
            "spec.migManager",
            "spec.nodeStatusExporter",
            "spec.watchdog",
            "spec.draDriver",
            "spec.validator",
            "spec.operator.initContainer",
        ];
        let unjustified: Vec<String> = cluster_policy_rules()
            .into_iter()
            .filter(|rule| {
                let image_rule = rule.contains(IMAGE_RULE)
                    && image_sections
                        .iter()
                        .any(|section| rule.starts_with(&format!("{section}: ")));
                // The image rule: clusterpolicy_types.go imagePath returns "invalid image specification".
                !image_rule && !kept.iter().any(|(prefix, _)| rule.starts_with(prefix))
            })
            .collect();
        assert!(
            unjustified.is_empty(),
            "rules NVIDIA's operator has no counterpart for (make them status warnings): {unjustified:#?}"
        );
        for (prefix, _) in kept {
            assert!(
                cluster_policy_rules()
                    .iter()
                    .any(|rule| rule.starts_with(prefix)),
                "no rule at {prefix}"
            );
        }
    }

    #[test]
    fn rules_nvidia_ignores_are_gone() {
        let rules = cluster_policy_rules().join("\n");
        // devicePlugin.config.default without a name: NVIDIA ignores the default (the AKS guide's removal patch).
        assert!(!rules.contains("spec.devicePlugin.config:"), "{rules}");
        // imagePullPolicy: NVIDIA maps any other value to IfNotPresent (clusterpolicy_types.go ImagePullPolicy).
        assert!(!rules.contains("imagePullPolicy"), "{rules}");
        // operator.defaultRuntime: deprecated and unread in NVIDIA's operator.
        assert!(!rules.contains("defaultRuntime"), "{rules}");
    }

    #[test]
    fn image_rule_skips_disabled_sections() {
        let rules = cluster_policy_rules();
        let device_plugin = rules
            .iter()
            .find(|rule| rule.starts_with("spec.devicePlugin: "))
            .expect("device plugin image rule");
        assert!(
            device_plugin.contains(IMAGE_RULE_DISABLED),
            "{device_plugin}"
        );
        let validator = rules
            .iter()
            .find(|rule| rule.starts_with("spec.validator: "))
            .expect("validator image rule");
        assert!(!validator.contains(IMAGE_RULE_DISABLED), "{validator}");
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
