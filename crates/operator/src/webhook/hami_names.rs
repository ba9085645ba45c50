//! The resource names HAMi's pods ask with, HAMi's defaults or a cluster's own (its chart's values), each checked
//! to be an extended resource name and all different.

/// HAMi's whole-GPU count (its chart's default `resourceName`).
pub const GPU: &str = "nvidia.com/gpu";
/// HAMi's memory per GPU, in MiB (`resourceMem`).
pub const GPUMEM: &str = "nvidia.com/gpumem";
/// HAMi's memory per GPU, in percent of the GPU's (`resourceMemPercentage`).
pub const GPUMEM_PERCENTAGE: &str = "nvidia.com/gpumem-percentage";
/// HAMi's share of the SMs per GPU, in percent (`resourceCores`).
pub const GPUCORES: &str = "nvidia.com/gpucores";
/// HAMi's task priority, which has no DRA counterpart (`resourcePriority`).
pub const PRIORITY: &str = "nvidia.com/priority";

/// The resource names HAMi's pods ask with. HAMi's chart lets a cluster rename them (its values `resourceName`,
/// `resourceMem`, `resourceMemPercentage`, `resourceCores` and `resourcePriority`), and its pods then use the
/// cluster's names; this chart takes the same values, and the webhook reads pods by them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceNames {
    pub gpu: String,
    pub memory: String,
    pub memory_percentage: String,
    pub cores: String,
    pub priority: String,
}

impl Default for ResourceNames {
    /// HAMi's defaults.
    fn default() -> Self {
        Self {
            gpu: GPU.into(),
            memory: GPUMEM.into(),
            memory_percentage: GPUMEM_PERCENTAGE.into(),
            cores: GPUCORES.into(),
            priority: PRIORITY.into(),
        }
    }
}

/// A resource name the webhook cannot read pods by.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum NamesError {
    #[error(
        "HAMi's {value} {name:?} is not an extended resource name: write <domain>/<name> with lowercase letters, \
         digits, '-' and '.' in the domain and letters, digits, '-', '_' and '.' in the name, e.g. nvidia.com/gpumem"
    )]
    Invalid { value: &'static str, name: String },
    #[error("HAMi's {first} and {second} are both {name:?}: each names a different request")]
    Duplicate {
        first: &'static str,
        second: &'static str,
        name: String,
    },
}

impl ResourceNames {
    /// The names, each checked to be an extended resource name (which also keeps them safe to quote in the
    /// webhook's CEL match conditions) and all different.
    ///
    /// # Errors
    /// The first name that is not a resource name, or two values with the same name.
    pub fn new(
        gpu: &str,
        memory: &str,
        memory_percentage: &str,
        cores: &str,
        priority: &str,
    ) -> Result<Self, NamesError> {
        let names = Self {
            gpu: gpu.trim().into(),
            memory: memory.trim().into(),
            memory_percentage: memory_percentage.trim().into(),
            cores: cores.trim().into(),
            priority: priority.trim().into(),
        };
        let labelled = names.labelled();
        for (value, name) in labelled {
            if !is_extended_resource_name(name) {
                return Err(NamesError::Invalid {
                    value,
                    name: name.into(),
                });
            }
        }
        for (i, (first, name)) in labelled.iter().enumerate() {
            if let Some((second, _)) = labelled[i + 1..].iter().find(|(_, other)| other == name) {
                return Err(NamesError::Duplicate {
                    first,
                    second,
                    name: (*name).into(),
                });
            }
        }
        Ok(names)
    }

    /// Each name with the HAMi chart value that sets it.
    fn labelled(&self) -> [(&'static str, &str); 5] {
        [
            ("resourceName", &self.gpu),
            ("resourceMem", &self.memory),
            ("resourceMemPercentage", &self.memory_percentage),
            ("resourceCores", &self.cores),
            ("resourcePriority", &self.priority),
        ]
    }

    /// The names that ask for a share of a GPU.
    #[must_use]
    pub fn shares(&self) -> [&str; 3] {
        [&self.memory, &self.memory_percentage, &self.cores]
    }

    /// Whether the whole-GPU name is not HAMi's default `nvidia.com/gpu`, which the device plugin advertises.
    #[must_use]
    pub fn gpu_is_renamed(&self) -> bool {
        self.gpu != GPU
    }

    /// The names whose containers the webhook converts whatever the pod's annotations: the shares, and the
    /// whole-GPU name where it is renamed.
    #[must_use]
    pub fn converted_without_selection(&self) -> Vec<&str> {
        let mut names = self.shares().to_vec();
        if self.gpu_is_renamed() {
            names.push(&self.gpu);
        }
        names
    }

    /// The names that charge GPU quota: the count and the shares.
    #[must_use]
    pub fn quota_charged(&self) -> [&str; 4] {
        [
            &self.gpu,
            &self.memory,
            &self.memory_percentage,
            &self.cores,
        ]
    }

    /// Every name, which a converted container no longer asks for.
    pub(super) fn all(&self) -> [&str; 5] {
        self.labelled().map(|(_, name)| name)
    }
}

/// `<domain>/<name>` as Kubernetes accepts an extended resource: a DNS subdomain, and a name of at most 63
/// characters that starts and ends with a letter or digit.
fn is_extended_resource_name(name: &str) -> bool {
    let Some((domain, rest)) = name.split_once('/') else {
        return false;
    };
    let edge = |text: &str| {
        text.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
            && text
                .chars()
                .last()
                .is_some_and(|c| c.is_ascii_alphanumeric())
    };
    let domain_ok = domain.len() <= 253
        && domain.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && edge(label)
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        });
    let rest_ok = !rest.is_empty()
        && rest.len() <= 63
        && edge(rest)
        && rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    domain_ok && rest_ok
}

#[cfg(test)]
impl ResourceNames {
    /// A cluster's renamed HAMi resources, as its HAMi values would set them: the webhook tests' one example.
    pub(crate) fn renamed_example() -> Self {
        ResourceNames::new(
            "example.com/vgpu",
            "example.com/vgpu-memory",
            "example.com/vgpu-memory-percentage",
            "example.com/vgpu-cores",
            "example.com/vgpu-priority",
        )
        .expect("distinct extended resource names")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renamed_resource_name_must_be_a_resource_name_and_unique() {
        assert_eq!(
            ResourceNames::new("nvidia.com/gpu", "gpumem", "a.b/c", "a.b/d", "a.b/e"),
            Err(NamesError::Invalid {
                value: "resourceMem",
                name: "gpumem".into()
            })
        );
        // A quote would end the CEL string of the webhook's match condition.
        assert!(
            ResourceNames::new("nvidia.com/gpu", "x.io/a'", "a.b/c", "a.b/d", "a.b/e").is_err()
        );
        assert!(ResourceNames::new("nvidia.com/gpu", "X.io/a", "a.b/c", "a.b/d", "a.b/e").is_err());
        assert_eq!(
            ResourceNames::new("a.b/gpu", "a.b/mem", "a.b/mem", "a.b/cores", "a.b/prio"),
            Err(NamesError::Duplicate {
                first: "resourceMem",
                second: "resourceMemPercentage",
                name: "a.b/mem".into()
            })
        );
        assert_eq!(
            ResourceNames::new(GPU, GPUMEM, GPUMEM_PERCENTAGE, GPUCORES, PRIORITY),
            Ok(ResourceNames::default())
        );
    }
}
