//! Serde for the mig-parted fields whose YAML shape is not a plain struct: `devices`, `device-filter` ids and
//! `mig-devices`. Checks that concern one field alone happen here, so their errors carry the field's path.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use super::{DeviceSelector, PciDeviceId};
use crate::mig::{MAX_MIG_DEVICES_PER_GPU, MigProfileName};

impl Serialize for DeviceSelector {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::All => serializer.serialize_str("all"),
            Self::Indices(indices) => indices.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for DeviceSelector {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DeviceSelectorVisitor)
    }
}

/// Reads `all` or a list of distinct, non-negative GPU indices.
struct DeviceSelectorVisitor;

impl<'de> Visitor<'de> for DeviceSelectorVisitor {
    type Value = DeviceSelector;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("\"all\" or a list of GPU indices")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Self::Value, E> {
        if value == "all" {
            Ok(DeviceSelector::All)
        } else {
            Err(E::custom(format!(
                "expected \"all\" or a list of GPU indices, found \"{value}\""
            )))
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut indices: Vec<u32> = Vec::new();
        while let Some(index) = seq.next_element::<i64>()? {
            let index = u32::try_from(index).map_err(|_| {
                de::Error::custom(format!(
                    "{index} is not a GPU index (indices start at 0, as nvidia-smi numbers GPUs)"
                ))
            })?;
            if indices.contains(&index) {
                return Err(de::Error::custom(format!(
                    "GPU index {index} is listed twice; list each GPU once"
                )));
            }
            indices.push(index);
        }
        if indices.is_empty() {
            return Err(de::Error::custom(
                "the list is empty: list at least one GPU index, or use \"all\"",
            ));
        }
        Ok(DeviceSelector::Indices(indices))
    }
}

impl Serialize for PciDeviceId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PciDeviceId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(PciDeviceIdVisitor)
    }
}

/// The advice every malformed id gets.
const PCI_ID_FORMAT: &str = "expected 0x followed by 8 hex digits, e.g. 0x20B010DE";

/// Reads `"0x20B010DE"`, and also the number YAML makes of an unquoted `0x20B010DE`.
struct PciDeviceIdVisitor;

impl Visitor<'_> for PciDeviceIdVisitor {
    type Value = PciDeviceId;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a PCI device id such as \"0x20B010DE\"")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Self::Value, E> {
        value
            .strip_prefix("0x")
            .or_else(|| value.strip_prefix("0X"))
            .filter(|hex| hex.len() == 8 && hex.bytes().all(|byte| byte.is_ascii_hexdigit()))
            .and_then(|hex| u32::from_str_radix(hex, 16).ok())
            .map(PciDeviceId)
            .ok_or_else(|| {
                E::custom(format!(
                    "\"{value}\" is not a PCI device id ({PCI_ID_FORMAT})"
                ))
            })
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
        u32::try_from(value)
            .map(PciDeviceId)
            .map_err(|_| E::custom(format!("{value} is not a PCI device id ({PCI_ID_FORMAT})")))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Self::Value, E> {
        Err(E::custom(format!(
            "{value} is not a PCI device id ({PCI_ID_FORMAT})"
        )))
    }
}

/// `deserialize_with` for `mig-devices`: a missing or null field is `None`; a mapping is parsed with every key
/// checked against the profile-name grammar and every count checked to be from 1 to [`MAX_MIG_DEVICES_PER_GPU`].
pub(super) fn profile_counts<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<BTreeMap<MigProfileName, u32>>, D::Error> {
    deserializer.deserialize_option(ProfileCountsVisitor)
}

/// The visitor of [`profile_counts`].
struct ProfileCountsVisitor;

impl<'de> Visitor<'de> for ProfileCountsVisitor {
    type Value = Option<BTreeMap<MigProfileName, u32>>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a mapping of MIG profile to count")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        // Raw keys as written, so that two spellings of one profile can both be quoted.
        let mut written: BTreeMap<MigProfileName, String> = BTreeMap::new();
        let mut counts = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            let count: i64 = map.next_value()?;
            let profile: MigProfileName = key.parse().map_err(de::Error::custom)?;
            if count < 1 {
                return Err(de::Error::custom(format!(
                    "\"{key}\": {count} is not a valid count, use at least 1 or remove the profile"
                )));
            }
            let count = u32::try_from(count)
                .ok()
                .filter(|count| *count <= MAX_MIG_DEVICES_PER_GPU)
                .ok_or_else(|| {
                    de::Error::custom(format!(
                        "\"{key}\": {count} is more MIG devices than a GPU holds, use at most \
                         {MAX_MIG_DEVICES_PER_GPU}"
                    ))
                })?;
            match written.entry(profile) {
                Entry::Occupied(first) => {
                    return Err(de::Error::custom(format!(
                        "\"{}\" and \"{key}\" are the same profile; list it once",
                        first.get()
                    )));
                }
                Entry::Vacant(slot) => {
                    slot.insert(key);
                }
            }
            counts.insert(profile, count);
        }
        Ok(Some(counts))
    }
}
