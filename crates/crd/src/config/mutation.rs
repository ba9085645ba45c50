//! Property-test input for the config parsers: real files with random edits, the way a coverage-blind fuzzer
//! mutates a corpus. The seeds are NVIDIA's own files (`tests/fixtures/nvidia/`), so the edits land in every part
//! of the format users write, and the fragments are what breaks parsers: huge and negative numbers, YAML
//! indicators, anchors and aliases, quotes, non-ASCII characters. Also the one way the generators build objects.

use proptest::prelude::*;
use proptest::sample::{Index, select};
use serde_json::{Map, Value};

/// Text that parsers trip over, inserted at random places.
const FRAGMENTS: [&str; 28] = [
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "18446744073709551616",
    "-1",
    "0",
    "1e400",
    "0x",
    ": ",
    "\n",
    "\n  - ",
    "\n    ",
    "[",
    "]",
    "{",
    "}",
    "&a ",
    "*a",
    "'",
    "\"",
    "#",
    "*",
    "all",
    "null",
    "~",
    "ü",
    "\u{200b}",
    "\t",
];

/// One edit at a position chosen in proportion to the text's length.
#[derive(Debug, Clone)]
enum Edit {
    /// Remove up to this many bytes (cut back to character boundaries).
    Delete(Index, usize),
    /// Insert text.
    Insert(Index, String),
}

/// A fragment that breaks parsers, or a short run of arbitrary printable characters.
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        select(FRAGMENTS.to_vec()).prop_map(str::to_owned),
        "\\PC{0,8}",
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), 1_usize..24).prop_map(|(at, length)| Edit::Delete(at, length)),
        (any::<Index>(), fragment()).prop_map(|(at, text)| Edit::Insert(at, text)),
    ]
}

/// The largest character boundary of `text` at or before `at`.
fn boundary(text: &str, at: usize) -> usize {
    (0..=at.min(text.len()))
        .rev()
        .find(|&index| text.is_char_boundary(index))
        .unwrap_or(0)
}

/// One of `seeds` with one to eight random edits.
pub(crate) fn mutated(seeds: Vec<&'static str>) -> impl Strategy<Value = String> {
    (select(seeds), prop::collection::vec(edit(), 1..8)).prop_map(|(seed, edits)| {
        let mut text = seed.to_owned();
        for edit in edits {
            match edit {
                Edit::Delete(at, length) => {
                    let start = boundary(&text, at.index(text.len() + 1));
                    let end = boundary(&text, start + length);
                    text.replace_range(start..end, "");
                }
                Edit::Insert(at, fragment) => {
                    let position = boundary(&text, at.index(text.len() + 1));
                    text.insert_str(position, &fragment);
                }
            }
        }
        text
    })
}

/// A JSON object of the fields that are present, for generators whose every field is optional.
pub(crate) fn object<const N: usize>(fields: [(&str, Option<Value>); N]) -> Value {
    Value::Object(
        fields
            .into_iter()
            .filter_map(|(key, value)| Some((key.to_owned(), value?)))
            .collect::<Map<String, Value>>(),
    )
}

/// A count as a file may write it: mostly from `small` (around the bounds), sometimes the extremes that were once
/// expanded before being checked (`u32::MAX` and beyond), sometimes any integer at all.
pub(crate) fn count_around(small: std::ops::RangeInclusive<i64>) -> impl Strategy<Value = i64> {
    prop_oneof![
        6 => small,
        1 => select(vec![i64::from(u32::MAX), i64::from(u32::MAX) + 1, i64::MAX, i64::MIN]),
        1 => any::<i64>(),
    ]
}
