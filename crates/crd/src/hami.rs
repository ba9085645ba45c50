//! How the values of a HAMi share request read (pure): the admission webhook, which turns HAMi's pods into DRA
//! claims, and the planner behind `gpu-node-agent dra-plan` both read them here, so that they cannot disagree.
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

use crate::dra::CORES_TOTAL;
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

#[cfg(test)]
mod tests {
    use super::*;

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
