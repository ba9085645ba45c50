//! Property tests of the plan's two expansions of user input: `resources` patterns, matched in linear time with
//! the meaning of a plain wildcard match, and sharing replicas, expanded only within their bound.

use crd::config::device_plugin::{MAX_MPS_REPLICAS, MAX_REPLICAS, parse};
use node_runtime::testing::simulated;
use proptest::prelude::*;

use super::tests::planned;
use super::*;

/// Cases of the pattern property, microseconds each.
const PATTERN_CASES: u32 = 2048;
/// Cases of the replica property, each of which opens a simulated node (a file in a temporary folder).
const REPLICA_CASES: u32 = 48;

/// Whether `pattern` (`*` any run, anything else itself) matches all of `subject`, by the textbook table of which
/// prefix of the pattern matches which prefix of the subject: slow, and plainly right.
fn matches_by_table(pattern: &str, subject: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let subject: Vec<char> = subject.chars().collect();
    let mut previous = vec![false; subject.len() + 1];
    previous[0] = true;
    for &symbol in &pattern {
        let mut row = vec![false; subject.len() + 1];
        for length in 0..=subject.len() {
            row[length] = if symbol == '*' {
                previous[length] || (length > 0 && row[length - 1])
            } else {
                length > 0 && subject[length - 1] == symbol && previous[length - 1]
            };
        }
        previous = row;
    }
    previous[subject.len()]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(PATTERN_CASES))]

    /// The linear matcher agrees with the table on patterns dense in stars over a small alphabet (where the
    /// choices of a greedy matcher matter), on product-name-like text, and on anything.
    #[test]
    fn patterns_match_as_the_table_says(
        (pattern, subject) in prop_oneof![
            ("[ab*]{0,14}", "[ab]{0,18}"),
            ("[A-Z0-9 *-]{0,20}", "NVIDIA [A-Z0-9-]{0,16}"),
            ("\\PC{0,12}", "\\PC{0,12}"),
        ],
    ) {
        prop_assert_eq!(
            glob_matches(&pattern, &subject),
            matches_by_table(&pattern, &subject),
            "{:?} on {:?}",
            pattern,
            subject
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(REPLICA_CASES))]

    /// Every selected device becomes exactly `replicas` devices with distinct IDs, for any count the config
    /// accepts; a count past the bound never reaches the plan.
    #[test]
    fn replicas_expand_to_exactly_their_count(
        gpus in 1_u32..=8,
        selected in 1_u32..=8,
        replicas in 2_u32..=MAX_REPLICAS + 1,
        mps in any::<bool>(),
    ) {
        let section = if mps { "mps" } else { "timeSlicing" };
        let config = format!(
            "version: v1\nsharing:\n  {section}:\n    resources:\n    - name: nvidia.com/gpu\n      devices: {}\n      \
             replicas: {replicas}\n",
            selected.min(gpus)
        );
        let most = if mps { MAX_MPS_REPLICAS } else { MAX_REPLICAS };
        let Ok(config) = parse(&config) else {
            prop_assert!(replicas > most);
            return Ok(());
        };
        prop_assert!(replicas <= most);
        let (_dir, simulator) = simulated(&format!("a100-40gb:{gpus}"), &[]);
        let plan = advertise(&planned(&simulator), &config, MigStrategy::None).unwrap();
        let shared = &plan[&"nvidia.com/gpu".parse().unwrap()];
        let replicated: Vec<&Device> = shared.devices.iter().filter(|device| device.replicas > 1).collect();
        let expected = usize::try_from(selected.min(gpus) * replicas).unwrap();
        prop_assert_eq!(replicated.len(), expected);
        prop_assert_eq!(shared.devices.len() - replicated.len(), usize::try_from(gpus - selected.min(gpus)).unwrap());
        let ids: std::collections::BTreeSet<&str> = shared.devices.iter().map(|device| device.id.as_str()).collect();
        prop_assert_eq!(ids.len(), shared.devices.len());
    }
}
