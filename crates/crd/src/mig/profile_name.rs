//! MIG profile names: `[<C>c.]<G>g.<GB>gb[+me|+me.all|+gfx|-me]`.
//!
//! A name has two parts that different layers care about: the GPU-instance part (`<G>g.<GB>gb` plus an optional
//! attribute) is what the catalog and the placement planner know, while the compute-instance part (`<C>c`) only
//! matters when compute instances are created inside a GPU instance. Keeping them apart lets callers look the
//! GPU-instance part up in the catalog without string surgery.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The optional attribute at the end of a GPU-instance profile name.
///
/// Attributes select a different NVML profile with the same slice count (for example `1g.5gb+me` is the
/// "1 slice rev1" profile that owns the media engines), so they are part of the GPU-instance identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProfileAttribute {
    /// `+me`: the instance owns the media extensions (decoders, encoders, JPEG, OFA).
    MediaExtensions,
    /// `+me.all`: the instance owns all media extensions of the GPU.
    AllMediaExtensions,
    /// `+gfx`: the instance supports graphics APIs.
    Graphics,
    /// `-me`: the instance explicitly has no media extensions.
    NoMediaExtensions,
}

impl ProfileAttribute {
    /// Every attribute, in the order error messages list them.
    const ALL: [Self; 4] = [
        Self::MediaExtensions,
        Self::AllMediaExtensions,
        Self::Graphics,
        Self::NoMediaExtensions,
    ];

    /// The suffix as written in a profile name, separator included.
    #[must_use]
    pub const fn suffix(self) -> &'static str {
        match self {
            Self::MediaExtensions => "+me",
            Self::AllMediaExtensions => "+me.all",
            Self::Graphics => "+gfx",
            Self::NoMediaExtensions => "-me",
        }
    }
}

/// The GPU-instance part of a profile name, e.g. `1g.5gb` or `1g.10gb+me`: what the catalog indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GpuInstanceProfileName {
    /// Compute slices of the GPU instance (`<G>`).
    pub slices: u8,
    /// Memory in GB as it appears in the name (`<GB>`); a rounded label, not an exact size.
    pub memory_gb: u16,
    /// The optional attribute suffix.
    pub attribute: Option<ProfileAttribute>,
}

impl GpuInstanceProfileName {
    /// A name without attribute; `const` so that the catalog can be static data.
    #[must_use]
    pub const fn new(slices: u8, memory_gb: u16) -> Self {
        Self {
            slices,
            memory_gb,
            attribute: None,
        }
    }

    /// The same name with an attribute suffix.
    #[must_use]
    pub const fn with(self, attribute: ProfileAttribute) -> Self {
        Self {
            attribute: Some(attribute),
            ..self
        }
    }
}

impl fmt::Display for GpuInstanceProfileName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}g.{}gb", self.slices, self.memory_gb)?;
        match self.attribute {
            Some(attribute) => f.write_str(attribute.suffix()),
            None => Ok(()),
        }
    }
}

impl FromStr for GpuInstanceProfileName {
    type Err = ProfileNameError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let name: MigProfileName = text.parse()?;
        if name.has_compute_part() {
            return Err(ProfileNameError::ComputePartNotAllowed(text.to_owned()));
        }
        Ok(name.gpu_instance)
    }
}

/// A full MIG profile name: a GPU-instance profile and the compute slices of the compute instance inside it.
///
/// Parsing normalizes: `3c.3g.20gb` and `3g.20gb` are the same profile and both display as `3g.20gb`, because the
/// grammar omits `<C>` when it equals `<G>`. Canonical names therefore round-trip through `Display` unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MigProfileName {
    /// The GPU-instance part.
    pub gpu_instance: GpuInstanceProfileName,
    /// Compute slices of the compute instance (`<C>`); equal to `gpu_instance.slices` when the name omits it.
    pub compute_slices: u8,
}

impl MigProfileName {
    /// True when the compute instance uses fewer slices than its GPU instance (the name carries `<C>c.`).
    #[must_use]
    pub fn has_compute_part(&self) -> bool {
        self.compute_slices != self.gpu_instance.slices
    }
}

impl From<GpuInstanceProfileName> for MigProfileName {
    fn from(gpu_instance: GpuInstanceProfileName) -> Self {
        Self {
            gpu_instance,
            compute_slices: gpu_instance.slices,
        }
    }
}

impl fmt::Display for MigProfileName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.has_compute_part() {
            write!(f, "{}c.", self.compute_slices)?;
        }
        write!(f, "{}", self.gpu_instance)
    }
}

/// Why a string is not a MIG profile name. The texts end up in user-facing config errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileNameError {
    /// The text does not follow `[<C>c.]<G>g.<GB>gb`.
    #[error("invalid profile name \"{0}\" (expected <G>g.<GB>gb, e.g. 1g.5gb)")]
    Malformed(String),
    /// The suffix after the memory size is not one of the known attributes.
    #[error(
        "invalid profile name \"{name}\" (unknown suffix \"{suffix}\", expected one of +me, +me.all, +gfx, -me)"
    )]
    UnknownAttribute {
        /// The whole name.
        name: String,
        /// The unrecognized suffix.
        suffix: String,
    },
    /// A compute instance cannot be larger than the GPU instance that holds it.
    #[error(
        "invalid profile name \"{name}\" (the compute instance has {compute} slices but its GPU instance only {gpu})"
    )]
    ComputeLargerThanGpuInstance {
        /// The whole name.
        name: String,
        /// `<C>`.
        compute: u8,
        /// `<G>`.
        gpu: u8,
    },
    /// A GPU-instance profile was expected, but the name also names a compute instance.
    #[error("invalid GPU-instance profile name \"{0}\" (remove the <C>c. compute-instance prefix)")]
    ComputePartNotAllowed(String),
}

/// Parses a positive decimal number followed by `unit` (`"3g"` with unit `"g"` gives 3).
fn number_with_unit<T: FromStr + Default + PartialEq>(field: &str, unit: &str) -> Option<T> {
    let digits = field.strip_suffix(unit)?;
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|value| *value != T::default())
}

impl FromStr for MigProfileName {
    type Err = ProfileNameError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let malformed = || ProfileNameError::Malformed(text.to_owned());
        // The memory field ends at the first "gb"; whatever follows is the attribute suffix.
        let memory_end = text.find("gb").ok_or_else(malformed)? + "gb".len();
        let (base, suffix) = text.split_at(memory_end);
        let attribute = if suffix.is_empty() {
            None
        } else if !suffix.starts_with(['+', '-']) {
            return Err(malformed());
        } else {
            let known = ProfileAttribute::ALL
                .into_iter()
                .find(|attribute| attribute.suffix() == suffix);
            Some(known.ok_or_else(|| ProfileNameError::UnknownAttribute {
                name: text.to_owned(),
                suffix: suffix.to_owned(),
            })?)
        };

        let fields: Vec<&str> = base.split('.').collect();
        let (compute, gpu, memory) = match fields.as_slice() {
            [gpu, memory] => (None, *gpu, *memory),
            [compute, gpu, memory] => (Some(*compute), *gpu, *memory),
            _ => return Err(malformed()),
        };
        let slices: u8 = number_with_unit(gpu, "g").ok_or_else(malformed)?;
        let memory_gb: u16 = number_with_unit(memory, "gb").ok_or_else(malformed)?;
        let compute_slices: u8 = match compute {
            Some(field) => number_with_unit(field, "c").ok_or_else(malformed)?,
            None => slices,
        };
        if compute_slices > slices {
            return Err(ProfileNameError::ComputeLargerThanGpuInstance {
                name: text.to_owned(),
                compute: compute_slices,
                gpu: slices,
            });
        }
        Ok(Self {
            gpu_instance: GpuInstanceProfileName {
                slices,
                memory_gb,
                attribute,
            },
            compute_slices,
        })
    }
}

/// Both name types travel as their canonical string in config files and status.
macro_rules! serde_as_string {
    ($type:ty) => {
        impl Serialize for $type {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

serde_as_string!(MigProfileName);
serde_as_string!(GpuInstanceProfileName);

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<MigProfileName, String> {
        text.parse::<MigProfileName>()
            .map_err(|error| error.to_string())
    }

    #[test]
    fn canonical_names_round_trip() {
        for name in [
            "1g.5gb",
            "1g.5gb+me",
            "1g.24gb+me.all",
            "2g.48gb+gfx",
            "1g.24gb-me",
            "7g.141gb",
            "1c.3g.20gb",
            "2c.7g.80gb+me",
        ] {
            assert_eq!(parse(name).unwrap().to_string(), name);
        }
    }

    #[test]
    fn parts_are_kept_apart() {
        let name = parse("1c.2g.10gb").unwrap();
        assert_eq!(name.gpu_instance, GpuInstanceProfileName::new(2, 10));
        assert_eq!(name.compute_slices, 1);
        assert!(name.has_compute_part());

        let name = parse("1g.10gb+me").unwrap();
        assert_eq!(
            name.gpu_instance,
            GpuInstanceProfileName::new(1, 10).with(ProfileAttribute::MediaExtensions)
        );
        assert_eq!(name.compute_slices, 1);
        assert!(!name.has_compute_part());
    }

    #[test]
    fn explicit_full_compute_part_normalizes() {
        let name = parse("3c.3g.20gb").unwrap();
        assert_eq!(name, parse("3g.20gb").unwrap());
        assert_eq!(name.to_string(), "3g.20gb");
    }

    #[test]
    fn malformed_names_are_rejected_with_the_grammar() {
        for bad in [
            "3gb", "", "g.5gb", "1g.gb", "1g5gb", "0g.5gb", "1g.0gb", "x1g.5gb", "1.1g.5gb",
            "1g.5GB", " 1g.5gb", "1g.5gb.x",
        ] {
            assert_eq!(
                parse(bad).unwrap_err(),
                format!("invalid profile name \"{bad}\" (expected <G>g.<GB>gb, e.g. 1g.5gb)"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn unknown_suffix_is_named() {
        assert_eq!(
            parse("1g.5gb+foo").unwrap_err(),
            "invalid profile name \"1g.5gb+foo\" (unknown suffix \"+foo\", expected one of +me, +me.all, +gfx, -me)"
        );
    }

    #[test]
    fn compute_part_cannot_exceed_gpu_instance() {
        assert_eq!(
            parse("4c.3g.20gb").unwrap_err(),
            "invalid profile name \"4c.3g.20gb\" (the compute instance has 4 slices but its GPU instance only 3)"
        );
    }

    #[test]
    fn gpu_instance_name_rejects_compute_part() {
        assert_eq!(
            "1g.5gb+me"
                .parse::<GpuInstanceProfileName>()
                .unwrap()
                .to_string(),
            "1g.5gb+me"
        );
        assert_eq!(
            "1c.2g.10gb"
                .parse::<GpuInstanceProfileName>()
                .unwrap_err()
                .to_string(),
            "invalid GPU-instance profile name \"1c.2g.10gb\" (remove the <C>c. compute-instance prefix)"
        );
    }

    #[test]
    fn serde_uses_the_canonical_string() {
        let name: MigProfileName = serde_json::from_str("\"2c.2g.10gb\"").unwrap();
        assert_eq!(serde_json::to_string(&name).unwrap(), "\"2g.10gb\"");
        assert!(serde_json::from_str::<MigProfileName>("\"3gb\"").is_err());
    }
}
