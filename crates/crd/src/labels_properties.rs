//! Property tests of the parsers of what nodes and users write in labels and label-like names: MIG profile names
//! (`nvidia.com/mig.config` values name configs of them, feature discovery writes `nvidia.com/mig-<profile>.*`),
//! config names that must be label values, resource names, the feature-discovery label keys, and the GPU sets of
//! the DRA partition labels. Any text is parsed or refused without a panic, and what is parsed writes back as
//! itself.

use proptest::prelude::*;

use super::{NVIDIA_PREFIX, written_by_feature_discovery};
use crate::config::device_plugin::{ResourceName, mig_resource_name};
use crate::config::label_value_problem;
use crate::dra::{GpuSet, MAX_GPU_INDEX};
use crate::mig::{GpuInstanceProfileName, MigProfileName};

/// Cases per property, about a millisecond each (most of it generating the text).
const CASES: u32 = 512;

/// Text shaped like a profile name, with parts that are out of range, empty or misplaced now and then.
fn profile_like() -> impl Strategy<Value = String> {
    "([0-9]{0,4}c\\.)?[0-9]{0,4}g\\.[0-9]{0,6}gb(\\+me|\\+me\\.all|\\+gfx|-me|\\+x)?"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// A profile name that parses writes out in canonical form, which parses to the same name and writes out the
    /// same again.
    #[test]
    fn profile_names_parse_or_are_refused_and_round_trip(
        text in prop_oneof![profile_like(), "\\PC{0,24}"],
    ) {
        if let Ok(name) = text.parse::<MigProfileName>() {
            let canonical = name.to_string();
            prop_assert_eq!(canonical.parse::<MigProfileName>(), Ok(name));
            prop_assert!(name.compute_slices >= 1 && name.compute_slices <= name.gpu_instance.slices);
            // Its mixed-strategy resource name is always a valid resource name, as `mig_resource_name` claims.
            let resource = mig_resource_name(&name);
            prop_assert_eq!(resource.as_str().parse::<ResourceName>(), Ok(resource.clone()));
        }
        if let Ok(name) = text.parse::<GpuInstanceProfileName>() {
            prop_assert_eq!(name.to_string().parse::<GpuInstanceProfileName>(), Ok(name));
        }
    }

    /// Names built from parts parse to those parts exactly when each part is in range.
    #[test]
    fn built_profile_names_parse_to_their_parts(
        compute in prop::option::of(0_u32..300),
        slices in 0_u32..300,
        memory in 0_u32..70_000,
    ) {
        let text = match compute {
            Some(compute) => format!("{compute}c.{slices}g.{memory}gb"),
            None => format!("{slices}g.{memory}gb"),
        };
        let in_range = (1..=255).contains(&slices)
            && (1..=65_535).contains(&memory)
            && compute.is_none_or(|compute| (1..=slices).contains(&compute));
        match text.parse::<MigProfileName>() {
            Ok(name) => {
                prop_assert!(in_range, "{}", text);
                prop_assert_eq!(u32::from(name.gpu_instance.slices), slices);
                prop_assert_eq!(u32::from(name.gpu_instance.memory_gb), memory);
                prop_assert_eq!(u32::from(name.compute_slices), compute.unwrap_or(slices));
            }
            Err(error) => prop_assert!(!in_range, "{}: {}", text, error),
        }
    }

    /// A resource name that parses is `nvidia.com/<name>`, at most 63 characters, and parses back as itself; so
    /// is its `.shared` form when that fits.
    #[test]
    fn resource_names_are_bounded_and_round_trip(text in prop_oneof!["[a-z0-9.-]{0,70}", "\\PC{0,70}"]) {
        if let Ok(name) = text.parse::<ResourceName>() {
            prop_assert!(name.as_str().starts_with(NVIDIA_PREFIX) && name.as_str().len() <= 63);
            prop_assert_eq!(name.as_str().parse::<ResourceName>(), Ok(name.clone()));
            if let Ok(shared) = name.shared() {
                prop_assert_eq!(shared.as_str(), format!("{name}.shared"));
            }
        }
    }

    /// A config name is accepted as a label value exactly when Kubernetes would accept it.
    #[test]
    fn label_values_follow_the_kubernetes_grammar(text in prop_oneof!["[a-zA-Z0-9._-]{0,70}", "\\PC{0,70}"]) {
        let bytes = text.as_bytes();
        let valid = (1..=63).contains(&bytes.len())
            && bytes.iter().all(|byte| byte.is_ascii_alphanumeric() || b"-_.".contains(byte))
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric();
        prop_assert_eq!(label_value_problem(&text).is_none(), valid, "{:?}", text);
    }

    /// Feature discovery's label keys are all `nvidia.com/`; any other text is not one.
    #[test]
    fn feature_discovery_keys_are_nvidia_keys(text in prop_oneof!["nvidia\\.com/\\PC{0,30}", "\\PC{0,40}"]) {
        if written_by_feature_discovery(&text) {
            prop_assert!(text.starts_with(NVIDIA_PREFIX));
        }
    }

    /// A GPU set label is `all`, `none` or indices and ranges within the bound, however wide the range written;
    /// what parses prints as a set that parses back to itself.
    #[test]
    fn gpu_sets_are_bounded_and_round_trip(
        text in prop_oneof![
            "(all|none|[0-9]{1,4}(-[0-9]{1,10})?(, ?[0-9]{1,4}(-[0-9]{1,10})?){0,3})",
            "\\PC{0,20}",
        ],
    ) {
        if let Ok(set) = text.parse::<GpuSet>() {
            if let GpuSet::Indices(indices) = &set {
                prop_assert!(indices.iter().all(|index| *index <= MAX_GPU_INDEX));
            }
            prop_assert_eq!(set.to_string().parse::<GpuSet>(), Ok(set.clone()));
        }
    }
}
