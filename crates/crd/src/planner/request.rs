//! The planner's requests in HAMi's terms (`gpumem=3000,gpucores=30`): their grammar and its errors.

use std::str::FromStr;

use crate::hami::{self, Memory, Selection, SelectionList};

/// One request, in the terms HAMi users write (the webhook turns HAMi pods into the same thing).
///
/// Parsed from comma-separated `key=value` pairs ([`FromStr`]):
///
/// | key (HAMi's name also accepted)    | value                                                               |
/// |------------------------------------|---------------------------------------------------------------------|
/// | `count` (`gpu`)                    | devices, on one node; default 1                                     |
/// | `gpumem`                           | memory per device: MiB (as HAMi), or bytes with a binary suffix (`8Gi`) |
/// | `gpumem-percentage`                | memory per device as a percentage of that device's memory, 1–100    |
/// | `gpucores`                         | percent of the GPU's SMs, 0–100                                     |
/// | `type` (`use-gputype`)             | productName contains this, any case; a list, any may match          |
/// | `nouse-type` (`nouse-gputype`)     | productName contains none of these, any case                        |
/// | `uuid` (`use-gpuuuid`)             | the device's uuid is one of these                                   |
/// | `nouse-uuid` (`nouse-gpuuuid`)     | the device's uuid is none of these                                  |
/// | `class`                            | `shared` (default), `gpu` (a whole GPU) or `mig`; or the class name |
/// | `profile`                          | the MIG profile, e.g. `1g.5gb` (class `mig` only)                   |
///
/// Keys may carry HAMi's `nvidia.com/` prefix. A list key takes several values by repeating it
/// (`type=A100,type=V100`) or, as in HAMi's annotations, by bare words after it (`type=A100,V100`).
/// `gpumem-percentage` and `gpucores` apply to class `shared` only; `gpumem` on a whole GPU or MIG device asks
/// for a device with at least that much memory. The values read as the webhook reads a HAMi pod's
/// ([`crate::hami`]): what HAMi tolerates (both memories, a percentage over 100) is kept with a note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// How the request is shown: the text it was parsed from.
    pub label: String,
    /// Devices wanted, all on one node.
    pub count: u32,
    /// Memory per device; [`Memory::Whole`] takes the capacity's default (all of a shared GPU's memory).
    pub memory: Memory,
    /// Percent of the SMs per device; none takes the capacity's default (0 on shared GPUs).
    pub cores: Option<u64>,
    /// Which GPUs it may take: HAMi's type and UUID lists, read and matched as the webhook does.
    pub selection: Selection,
    /// Which kind of device.
    pub class: Class,
    /// The MIG profile (class [`Class::Mig`]).
    pub profile: Option<String>,
    /// What was made of values HAMi tolerates but that do not mean what they say (see [`crate::hami::memory`]).
    pub notes: Vec<String>,
}

/// Which kind of device a request takes (the DeviceClass it names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Class {
    /// A share of a GPU that allows multiple allocations (`shared.gpu.nvidia.com`).
    #[default]
    Shared,
    /// A whole GPU (`gpu.nvidia.com`).
    WholeGpu,
    /// A MIG device (`mig.nvidia.com`).
    Mig,
}

impl Class {
    pub(super) fn noun(self) -> &'static str {
        match self {
            Class::Shared => "shared GPU",
            Class::WholeGpu => "GPU",
            Class::Mig => "MIG device",
        }
    }

    fn keyword(self) -> &'static str {
        match self {
            Class::Shared => "shared",
            Class::WholeGpu => "gpu",
            Class::Mig => "mig",
        }
    }
}

/// Why a request's text is not a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Nothing was written.
    #[error("the request is empty; write key=value pairs such as gpumem=3000,gpucores=30")]
    Empty,
    /// A word that is neither `key=value` nor a further value of a list key.
    #[error(
        "{token:?} is not key=value; write e.g. gpumem=3000 (bare words only continue a type, nouse-type, uuid or nouse-uuid list)"
    )]
    NotKeyValue {
        /// The word.
        token: String,
    },
    /// An unknown key.
    #[error(
        "unknown key {key:?}; use count, gpumem, gpumem-percentage, gpucores, type, nouse-type, uuid, nouse-uuid, class or profile"
    )]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// A key with a value it does not take.
    #[error("{key}={value:?}: expected {expected}")]
    BadValue {
        /// The key.
        key: &'static str,
        /// The value.
        value: String,
        /// What the key takes.
        expected: &'static str,
    },
    /// A single-valued key written twice.
    #[error("{key} is given twice; keep one")]
    Duplicate {
        /// The key.
        key: &'static str,
    },
    /// A key that the request's class does not take.
    #[error("{key} does not apply to class={class}; {fix}")]
    NotForClass {
        /// The key.
        key: &'static str,
        /// The request's class keyword.
        class: &'static str,
        /// What to write instead.
        fix: &'static str,
    },
}

const EXPECT_COUNT: &str = "a whole number of devices, 1 or more";
const EXPECT_CLASS: &str = "shared, gpu or mig";
const EXPECT_TEXT: &str = "a non-empty value";

impl FromStr for Request {
    type Err = RequestError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let label = text.trim();
        let mut request = Request {
            label: label.to_owned(),
            count: 1,
            memory: Memory::Whole,
            cores: None,
            selection: Selection::default(),
            class: Class::Shared,
            profile: None,
            notes: Vec::new(),
        };
        let (mut bytes, mut percent) = (None, None);
        let mut seen: Vec<&'static str> = Vec::new();
        let mut once = |key: &'static str| {
            if seen.contains(&key) {
                return Err(RequestError::Duplicate { key });
            }
            seen.push(key);
            Ok(())
        };
        // The list a bare word continues: the last list key written, as in HAMi's `use-gputype: "A100,V100"`.
        let mut list: Option<ListKey> = None;
        let add = |request: &mut Request, key: ListKey, item: &str| {
            request
                .selection
                .add(key.list(), item)
                .map_err(|error| bad(key.name(), &error.value, hami::EXPECT_SELECTION))
        };
        let mut any = false;
        for token in label.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            any = true;
            let Some((key, value)) = token.split_once('=') else {
                let Some(key) = list else {
                    return Err(RequestError::NotKeyValue {
                        token: token.to_owned(),
                    });
                };
                add(&mut request, key, token)?;
                continue;
            };
            let key = key.trim().to_ascii_lowercase();
            let key = key.strip_prefix("nvidia.com/").unwrap_or(&key);
            let value = value.trim();
            list = None;
            match key {
                "count" | "gpu" => {
                    once("count")?;
                    request.count = value
                        .parse()
                        .ok()
                        .filter(|count| *count > 0)
                        .ok_or_else(|| bad("count", value, EXPECT_COUNT))?;
                }
                "gpumem" => {
                    once("gpumem")?;
                    bytes =
                        hami::memory_bytes(value).map_err(|e| bad("gpumem", value, e.expected))?;
                }
                "gpumem-percentage" => {
                    once("gpumem-percentage")?;
                    percent = hami::percentage(value)
                        .map_err(|e| bad("gpumem-percentage", value, e.expected))?;
                }
                "gpucores" => {
                    once("gpucores")?;
                    request.cores =
                        Some(hami::cores(value).map_err(|e| bad("gpucores", value, e.expected))?);
                }
                "class" => {
                    once("class")?;
                    request.class = match value.to_ascii_lowercase().as_str() {
                        "shared" | "shared.gpu.nvidia.com" => Class::Shared,
                        "gpu" | "gpu.nvidia.com" => Class::WholeGpu,
                        "mig" | "mig.nvidia.com" => Class::Mig,
                        _ => return Err(bad("class", value, EXPECT_CLASS)),
                    };
                }
                "profile" => {
                    once("profile")?;
                    if value.is_empty() {
                        return Err(bad("profile", value, EXPECT_TEXT));
                    }
                    request.profile = Some(value.to_owned());
                }
                _ => {
                    let key = ListKey::parse(key).ok_or_else(|| RequestError::UnknownKey {
                        key: key.to_owned(),
                    })?;
                    add(&mut request, key, value)?;
                    list = Some(key);
                }
            }
        }
        if !any {
            return Err(RequestError::Empty);
        }
        (request.memory, request.notes) =
            hami::memory(bytes, percent, ["gpumem", "gpumem-percentage"]);
        request.check_class()?;
        Ok(request)
    }
}

fn bad(key: &'static str, value: &str, expected: &'static str) -> RequestError {
    RequestError::BadValue {
        key,
        value: value.to_owned(),
        expected,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListKey {
    UseTypes,
    NouseTypes,
    Uuids,
    NouseUuids,
}

impl ListKey {
    fn parse(key: &str) -> Option<Self> {
        Some(match key {
            "type" | "use-gputype" => ListKey::UseTypes,
            "nouse-type" | "nouse-gputype" => ListKey::NouseTypes,
            "uuid" | "use-gpuuuid" => ListKey::Uuids,
            "nouse-uuid" | "nouse-gpuuuid" => ListKey::NouseUuids,
            _ => return None,
        })
    }

    fn list(self) -> SelectionList {
        match self {
            ListKey::UseTypes => SelectionList::UseTypes,
            ListKey::NouseTypes => SelectionList::NouseTypes,
            ListKey::Uuids => SelectionList::UseUuids,
            ListKey::NouseUuids => SelectionList::NouseUuids,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ListKey::UseTypes => "type",
            ListKey::NouseTypes => "nouse-type",
            ListKey::Uuids => "uuid",
            ListKey::NouseUuids => "nouse-uuid",
        }
    }
}

impl Request {
    fn check_class(&self) -> Result<(), RequestError> {
        let class = self.class.keyword();
        if self.class != Class::Shared {
            if matches!(self.memory, Memory::Percent(_)) {
                return Err(RequestError::NotForClass {
                    key: "gpumem-percentage",
                    class,
                    fix: "a whole GPU or MIG device has all of its memory; use class=shared for a share",
                });
            }
            if self.cores.is_some() {
                return Err(RequestError::NotForClass {
                    key: "gpucores",
                    class,
                    fix: "a whole GPU or MIG device has all of its SMs; use class=shared for a share",
                });
            }
        }
        if self.class != Class::Mig && self.profile.is_some() {
            return Err(RequestError::NotForClass {
                key: "profile",
                class,
                fix: "add class=mig",
            });
        }
        Ok(())
    }
}
