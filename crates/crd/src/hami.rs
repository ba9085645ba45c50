//! How the values of a HAMi share request read (pure): the admission webhook, which turns HAMi's pods into DRA
//! claims, and the planner behind `gpu-dra-driver plan` both read them here, so that they cannot disagree.
//!
//! HAMi reads each resource's integer value (its `pkg/device/nvidia/device.go`): `gpumem` in MiB,
//! `gpumem-percentage` and `gpucores` in percent, 0 for "not given". What HAMi tolerates is tolerated here, with a
//! note saying what was made of it:
//! - `gpumem` and `gpumem-percentage` together: `gpumem` is used;
//! - a `gpumem-percentage` over 100 is taken as 100.
//!
//! The API server writes quantities back in canonical form, so a pod's `3000` arrives as `3k`: a decimal suffix is
//! part of the number of MiB. A binary suffix (`8Gi`) names bytes, which HAMi would read as 8589934592 MiB; it is
//! taken here as the bytes it says.
//!
//! Which GPUs a request may take ([`Selection`], HAMi's `use-gputype`, `nouse-gputype`, `use-gpuuuid` and
//! `nouse-gpuuuid`) is read and matched here too, with the CEL selectors that mean the same to the scheduler.

use std::collections::BTreeMap;

use crate::dra::{ATTRIBUTE_PRODUCT_NAME, CORES_TOTAL, attribute_expression};
use crate::quantity::parse_bytes;

/// Bytes in a MiB, HAMi's unit of memory.
pub const MIB: u64 = 1 << 20;

/// What `gpumem` takes.
pub const EXPECT_MEMORY: &str =
    "MiB as a whole number (3000), or a quantity with a binary suffix (8Gi, 3000Mi)";
/// What `gpumem-percentage` takes.
pub const EXPECT_PERCENTAGE: &str = "a whole percentage of the GPU's memory, 1 to 100";
/// What `gpucores` takes.
pub const EXPECT_CORES: &str = "a whole percentage of the SMs, 0 to 100";

/// A value that is not what its resource takes; the caller names the resource and where it was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("expected {expected}")]
pub struct ValueError {
    /// What the resource takes.
    pub expected: &'static str,
}

/// The memory asked of each GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// All of it (HAMi's `defaultMemory: 0`).
    Whole,
    /// Bytes.
    Bytes(u64),
    /// Percent of the GPU's memory, 1 to 100.
    Percent(u8),
}

/// `gpumem`: bytes, whole MiB (a binary quantity is rounded up to the next), or `None` for 0 (not given).
///
/// # Errors
/// When the value is no quantity, or its bytes do not fit 64 bits (which would wrap to a small request).
pub fn memory_bytes(text: &str) -> Result<Option<u64>, ValueError> {
    let error = ValueError {
        expected: EXPECT_MEMORY,
    };
    let text = text.trim();
    let value = parse_bytes(text).map_err(|_| error)?;
    if value == 0 {
        return Ok(None);
    }
    if text.ends_with('i') {
        return value.div_ceil(MIB).checked_mul(MIB).map(Some).ok_or(error);
    }
    value.checked_mul(MIB).map(Some).ok_or(error)
}

/// `gpumem-percentage`: the percentage as written, or `None` for 0 (not given); [`memory`] takes it to 100 at most.
///
/// # Errors
/// When the value is no whole number.
pub fn percentage(text: &str) -> Result<Option<u64>, ValueError> {
    whole_number(text, EXPECT_PERCENTAGE).map(|percent| percent.filter(|p| *p > 0))
}

/// `gpucores`: percent of the SMs. 0 reserves no SMs, as HAMi reads it.
///
/// # Errors
/// When the value is no whole number from 0 to 100.
pub fn cores(text: &str) -> Result<u64, ValueError> {
    whole_number(text, EXPECT_CORES)?
        .filter(|cores| *cores <= CORES_TOTAL)
        .ok_or(ValueError {
            expected: EXPECT_CORES,
        })
}

/// The integer value of a quantity (`50`, or the canonical `3k`).
fn whole_number(text: &str, expected: &'static str) -> Result<Option<u64>, ValueError> {
    let text = text.trim();
    if text.ends_with('i') || text.contains('.') {
        return Err(ValueError { expected });
    }
    parse_bytes(text)
        .map(Some)
        .map_err(|_| ValueError { expected })
}

/// The memory of a request from its `gpumem` ([`memory_bytes`]) and `gpumem-percentage` ([`percentage`]), with a
/// note for each value HAMi tolerates but that does not mean what it says; `names` are the two resources' names as
/// the request wrote them (a cluster may rename HAMi's resources).
pub fn memory(bytes: Option<u64>, percent: Option<u64>, names: [&str; 2]) -> (Memory, Vec<String>) {
    let [memory_name, percentage_name] = names;
    let mut notes = Vec::new();
    if bytes.is_some() && percent.is_some() {
        notes.push(format!(
            "{memory_name} and {percentage_name} are both set; {memory_name} is used, as HAMi does"
        ));
    }
    let memory = match (bytes, percent) {
        (Some(bytes), _) => Memory::Bytes(bytes),
        (None, Some(percent)) => {
            if percent > 100 {
                notes.push(format!(
                    "{percentage_name} {percent} is over 100 and taken as 100, as HAMi does"
                ));
            }
            Memory::Percent(u8::try_from(percent.min(100)).unwrap_or(100))
        }
        (None, None) => Memory::Whole,
    };
    (memory, notes)
}

/// HAMi's annotation of the GPU models a pod may use: comma-separated, matched as substrings of the product name.
pub const USE_GPUTYPE: &str = "nvidia.com/use-gputype";
/// HAMi's annotation of the GPU models a pod must not use.
pub const NOUSE_GPUTYPE: &str = "nvidia.com/nouse-gputype";
/// HAMi's annotation of the GPU UUIDs a pod may use.
pub const USE_GPUUUID: &str = "nvidia.com/use-gpuuuid";
/// HAMi's annotation of the GPU UUIDs a pod must not use.
pub const NOUSE_GPUUUID: &str = "nvidia.com/nouse-gpuuuid";

/// One of HAMi's lists of which GPUs a request may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectionList {
    /// Models, any of which the product name must contain (`use-gputype`).
    UseTypes,
    /// Models the product name must contain none of (`nouse-gputype`).
    NouseTypes,
    /// UUIDs, one of which the GPU's must be (`use-gpuuuid`).
    UseUuids,
    /// UUIDs the GPU's must be none of (`nouse-gpuuuid`).
    NouseUuids,
}

impl SelectionList {
    /// Every list, in the order of HAMi's annotations.
    pub const ALL: [SelectionList; 4] = [
        SelectionList::UseTypes,
        SelectionList::NouseTypes,
        SelectionList::UseUuids,
        SelectionList::NouseUuids,
    ];

    /// HAMi's pod annotation of the list.
    #[must_use]
    pub fn annotation(self) -> &'static str {
        match self {
            SelectionList::UseTypes => USE_GPUTYPE,
            SelectionList::NouseTypes => NOUSE_GPUTYPE,
            SelectionList::UseUuids => USE_GPUUUID,
            SelectionList::NouseUuids => NOUSE_GPUUUID,
        }
    }

    /// What its items are, for messages: `models` or `UUIDs`.
    #[must_use]
    pub fn items(self) -> &'static str {
        match self {
            SelectionList::UseTypes | SelectionList::NouseTypes => "models",
            SelectionList::UseUuids | SelectionList::NouseUuids => "UUIDs",
        }
    }
}

/// What a selection list takes.
pub const EXPECT_SELECTION: &str =
    "comma-separated GPU models or UUIDs (letters, digits, spaces, '.', '_', '-')";

/// A selection value that no GPU model or UUID has; the caller names where it was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a list of GPU {}: write {EXPECT_SELECTION}", .list.items())]
pub struct SelectionError {
    /// The list.
    pub list: SelectionList,
    /// The value as written.
    pub value: String,
}

/// Which GPUs a request may take: HAMi's four lists, types lowercased (they match in any case), UUIDs exact.
///
/// Items hold only letters, digits, spaces, `.`, `_` and `-`, which every GPU product name and UUID is made of;
/// that also keeps them safe inside the CEL string literals of [`Selection::cel_selectors`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// The product name contains one of these (lowercase).
    pub use_types: Vec<String>,
    /// The product name contains none of these (lowercase).
    pub nouse_types: Vec<String>,
    /// The UUID is one of these.
    pub use_uuids: Vec<String>,
    /// The UUID is none of these.
    pub nouse_uuids: Vec<String>,
}

impl Selection {
    /// The selection of a pod's HAMi annotations; each is a comma-separated list.
    ///
    /// # Errors
    /// When an annotation lists nothing, or an item holds a character no GPU model or UUID has.
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
    ) -> Result<Self, SelectionError> {
        let mut selection = Selection::default();
        for list in SelectionList::ALL {
            let Some(value) = annotations.get(list.annotation()) else {
                continue;
            };
            let invalid = || SelectionError {
                list,
                value: value.clone(),
            };
            let mut any = false;
            for item in value
                .split(',')
                .map(str::trim)
                .filter(|item| !item.is_empty())
            {
                selection.add(list, item).map_err(|_| invalid())?;
                any = true;
            }
            if !any {
                return Err(invalid());
            }
        }
        Ok(selection)
    }

    /// Adds one item to `list`.
    ///
    /// # Errors
    /// When the item is empty or holds a character no GPU model or UUID has.
    pub fn add(&mut self, list: SelectionList, item: &str) -> Result<(), SelectionError> {
        let item = item.trim();
        let allowed = |c: char| c.is_ascii_alphanumeric() || " ._-".contains(c);
        if item.is_empty() || !item.chars().all(allowed) {
            return Err(SelectionError {
                list,
                value: item.to_owned(),
            });
        }
        match list {
            SelectionList::UseTypes => self.use_types.push(item.to_ascii_lowercase()),
            SelectionList::NouseTypes => self.nouse_types.push(item.to_ascii_lowercase()),
            SelectionList::UseUuids => self.use_uuids.push(item.to_owned()),
            SelectionList::NouseUuids => self.nouse_uuids.push(item.to_owned()),
        }
        Ok(())
    }

    /// Whether it selects nothing out: every GPU is admitted.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// Whether a GPU of `product_name` and `uuid` may be taken: its product name contains a wanted model and no
    /// unwanted one (any case, as HAMi's `CheckType`), its UUID is wanted (when any is named) and not unwanted.
    #[must_use]
    pub fn admits(&self, product_name: &str, uuid: Option<&str>) -> bool {
        let product = product_name.to_ascii_lowercase();
        let named = |types: &[String]| types.iter().any(|t| product.contains(t.as_str()));
        let listed = |uuids: &[String]| uuid.is_some_and(|uuid| uuids.iter().any(|u| u == uuid));
        (self.use_types.is_empty() || named(&self.use_types))
            && !named(&self.nouse_types)
            && (self.use_uuids.is_empty() || listed(&self.use_uuids))
            && !listed(&self.nouse_uuids)
    }

    /// The CEL selectors of DRA devices with the same meaning as [`Selection::admits`], one per list given. A GPU's
    /// UUID is the device attribute `uuid_attribute`: `uuid` on whole GPUs, `parentUUID` on MIG devices.
    #[must_use]
    pub fn cel_selectors(&self, uuid_attribute: &str) -> Vec<String> {
        let product = format!(
            "{}.lowerAscii()",
            attribute_expression(ATTRIBUTE_PRODUCT_NAME)
        );
        let uuid = attribute_expression(uuid_attribute);
        let contains_any = |types: &[String]| {
            types
                .iter()
                .map(|t| format!("{product}.contains(\"{t}\")"))
                .collect::<Vec<_>>()
                .join(" || ")
        };
        let quoted = |uuids: &[String]| {
            uuids
                .iter()
                .map(|u| format!("\"{u}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut selectors = Vec::new();
        if !self.use_types.is_empty() {
            selectors.push(contains_any(&self.use_types));
        }
        if !self.nouse_types.is_empty() {
            selectors.push(format!("!({})", contains_any(&self.nouse_types)));
        }
        if !self.use_uuids.is_empty() {
            selectors.push(format!("{uuid} in [{}]", quoted(&self.use_uuids)));
        }
        if !self.nouse_uuids.is_empty() {
            selectors.push(format!("!({uuid} in [{}])", quoted(&self.nouse_uuids)));
        }
        selectors
    }

    /// The lists, for messages: `productName contains "a100" (any case), uuid is not "GPU-1"`.
    #[must_use]
    pub fn describe(&self) -> String {
        let quoted = |values: &[String]| {
            values
                .iter()
                .map(|v| format!("{v:?}"))
                .collect::<Vec<_>>()
                .join(" or ")
        };
        let mut parts = Vec::new();
        if !self.use_types.is_empty() {
            parts.push(format!(
                "productName contains {} (any case)",
                quoted(&self.use_types)
            ));
        }
        if !self.nouse_types.is_empty() {
            parts.push(format!(
                "productName contains no {} (any case)",
                quoted(&self.nouse_types)
            ));
        }
        if !self.use_uuids.is_empty() {
            parts.push(format!("uuid is {}", quoted(&self.use_uuids)));
        }
        if !self.nouse_uuids.is_empty() {
            parts.push(format!("uuid is not {}", quoted(&self.nouse_uuids)));
        }
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::ATTRIBUTE_UUID;

    #[test]
    fn a_selection_reads_hamis_annotations_and_matches_as_hami_does() {
        let annotations = BTreeMap::from([
            (USE_GPUTYPE.to_owned(), "A100, V100,".to_owned()),
            (NOUSE_GPUUUID.to_owned(), "GPU-b".to_owned()),
        ]);
        let selection = Selection::from_annotations(&annotations).unwrap();
        assert_eq!(selection.use_types, ["a100", "v100"]);
        assert_eq!(selection.nouse_uuids, ["GPU-b"]);
        assert!(selection.admits("NVIDIA A100-SXM4-40GB", Some("GPU-a")));
        assert!(selection.admits("Tesla v100-PCIE-16GB", None));
        assert!(!selection.admits("NVIDIA A100-SXM4-40GB", Some("GPU-b")));
        assert!(!selection.admits("NVIDIA H100 80GB HBM3", Some("GPU-a")));
        assert_eq!(
            selection.cel_selectors(ATTRIBUTE_UUID),
            [
                "device.attributes[\"gpu.nvidia.com\"].productName.lowerAscii().contains(\"a100\") || \
                 device.attributes[\"gpu.nvidia.com\"].productName.lowerAscii().contains(\"v100\")",
                "!(device.attributes[\"gpu.nvidia.com\"].uuid in [\"GPU-b\"])"
            ]
        );
        assert_eq!(
            selection.describe(),
            "productName contains \"a100\" or \"v100\" (any case), uuid is not \"GPU-b\""
        );
        assert!(Selection::default().admits("anything", None));
    }

    #[test]
    fn a_selection_refuses_what_no_gpu_model_or_uuid_holds() {
        for value in ["", " , ", "A100\")", "a100 || true"] {
            let annotations = BTreeMap::from([(USE_GPUTYPE.to_owned(), value.to_owned())]);
            assert_eq!(
                Selection::from_annotations(&annotations),
                Err(SelectionError {
                    list: SelectionList::UseTypes,
                    value: value.to_owned()
                }),
                "{value:?}"
            );
        }
        let error = Selection::default()
            .add(SelectionList::NouseUuids, "GPU-1\"")
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("\"GPU-1\\\"\" is not a list of GPU UUIDs: write {EXPECT_SELECTION}")
        );
    }

    #[test]
    fn memory_is_mib_unless_a_binary_suffix_names_bytes() {
        assert_eq!(memory_bytes("3000"), Ok(Some(3000 * MIB)));
        // The API server's canonical form of 3000.
        assert_eq!(memory_bytes("3k"), Ok(Some(3000 * MIB)));
        assert_eq!(memory_bytes("8Gi"), Ok(Some(8 << 30)));
        assert_eq!(memory_bytes("3000Mi"), Ok(Some(3000 * MIB)));
        assert_eq!(memory_bytes("1536Ki"), Ok(Some(2 * MIB)));
        assert_eq!(memory_bytes("0"), Ok(None));
        for bad in ["lots", "-1", "", "8GB"] {
            assert_eq!(
                memory_bytes(bad),
                Err(ValueError {
                    expected: EXPECT_MEMORY
                }),
                "{bad}"
            );
        }
        // MiB whose bytes do not fit 64 bits would wrap to a small request.
        assert!(memory_bytes(&u64::MAX.to_string()).is_err());
    }

    #[test]
    fn percentages_and_cores_are_whole_numbers() {
        assert_eq!(percentage("50"), Ok(Some(50)));
        assert_eq!(percentage("0"), Ok(None));
        assert_eq!(percentage("150"), Ok(Some(150)));
        assert!(percentage("5Gi").is_err());
        assert!(percentage("12.5").is_err());
        assert_eq!(cores("30"), Ok(30));
        assert_eq!(cores("0"), Ok(0));
        assert_eq!(
            cores("101"),
            Err(ValueError {
                expected: EXPECT_CORES
            })
        );
    }

    #[test]
    fn memory_keeps_what_hami_tolerates_and_says_so() {
        let names = ["nvidia.com/gpumem", "nvidia.com/gpumem-percentage"];
        assert_eq!(memory(None, None, names), (Memory::Whole, vec![]));
        assert_eq!(memory(None, Some(40), names), (Memory::Percent(40), vec![]));
        assert_eq!(
            memory(Some(MIB), Some(40), names),
            (
                Memory::Bytes(MIB),
                vec![
                    "nvidia.com/gpumem and nvidia.com/gpumem-percentage are both set; nvidia.com/gpumem is \
                     used, as HAMi does"
                        .to_owned()
                ]
            )
        );
        assert_eq!(
            memory(None, Some(150), names),
            (
                Memory::Percent(100),
                vec![
                    "nvidia.com/gpumem-percentage 150 is over 100 and taken as 100, as HAMi does"
                        .to_owned()
                ]
            )
        );
    }
}
