//! How much GPU memory a pod may use on a GPU: pure, from what the pod holds there.
//!
//! - A time-slicing or MPS replica (a device ID `GPU-<uuid>::<n>`): the GPU's memory divided by the number of
//!   replicas the device plugin advertises, times the replicas the pod holds (rule `replica-share`, the default;
//!   rule `none` gives no budget from replicas).
//! - A DRA claim on a shared GPU: the memory the claim consumed.
//! - The pod's `nvidia.com/gpu-memory-limit` annotation: lowers either, never raises; on its own (rule `none`) it
//!   is the budget.
//! - A whole GPU or a MIG device: no budget. Nobody shares the first; MIG isolates memory in hardware.

use std::fmt;

use crd::labels::GPU_MEMORY_LIMIT_ANNOTATION;

use crate::accounting::MIB;

/// Where time-sliced GPUs' budgets come from (`--default-budget`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DefaultBudget {
    /// The GPU's memory divided by its replicas.
    #[default]
    ReplicaShare,
    /// None: only DRA claims and the annotation set budgets.
    None,
}

/// What a pod holds on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Holding {
    /// Replicas of the GPU the pod holds (time-slicing or MPS).
    pub replicas: u32,
    /// Replicas the device plugin advertises for the GPU.
    pub replicas_advertised: u32,
    /// Memory consumed by the pod's DRA claims on the GPU, in bytes.
    pub claimed_bytes: Option<u64>,
    /// Whether the pod holds the whole GPU or a MIG device of it.
    pub exclusive: bool,
}

impl Holding {
    /// Whether the pod shares this GPU with others (a replica or a DRA share).
    #[must_use]
    pub fn shared(&self) -> bool {
        self.replicas > 0 || self.claimed_bytes.is_some()
    }
}

/// Which rule set a budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// A share of a time-sliced (or MPS) GPU.
    ReplicaShare,
    /// A DRA claim's consumed memory.
    DraClaim,
    /// The pod's annotation.
    Annotation,
}

impl Source {
    /// The `source` label.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::ReplicaShare => "replica-share",
            Self::DraClaim => "dra-claim",
            Self::Annotation => "annotation",
        }
    }
}

/// A pod's budget on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// Bytes the pod's processes may use on the GPU together.
    pub bytes: u64,
    /// The rule that set it.
    pub source: Source,
    /// How it was reckoned, for events: "1 of 4 replicas of a 40960 MiB GPU".
    pub reckoning: String,
}

/// The budget of a pod that holds `holding` on a GPU of `gpu_bytes`, with its annotation's limit.
#[must_use]
pub fn budget(
    gpu_bytes: u64,
    holding: Holding,
    annotation: Option<u64>,
    rule: DefaultBudget,
) -> Option<Budget> {
    if !holding.shared() {
        return None;
    }
    let replica_share = (rule == DefaultBudget::ReplicaShare
        && holding.replicas > 0
        && holding.replicas_advertised > 0)
        .then(|| Budget {
            bytes: gpu_bytes / u64::from(holding.replicas_advertised) * u64::from(holding.replicas),
            source: Source::ReplicaShare,
            reckoning: format!(
                "{} of {} replicas of a {} MiB GPU",
                holding.replicas,
                holding.replicas_advertised,
                gpu_bytes / MIB
            ),
        });
    let claim = holding.claimed_bytes.map(|bytes| Budget {
        bytes,
        source: Source::DraClaim,
        reckoning: format!("{} MiB consumed by its DRA claims", bytes / MIB),
    });
    let base = match (replica_share, claim) {
        (Some(share), Some(claim)) => Some(Budget {
            bytes: share.bytes + claim.bytes,
            source: Source::DraClaim,
            reckoning: format!("{} and {}", share.reckoning, claim.reckoning),
        }),
        (share, claim) => share.or(claim),
    };
    match (base, annotation) {
        (Some(base), Some(limit)) if limit < base.bytes => Some(annotated(limit)),
        (None, Some(limit)) => Some(annotated(limit)),
        (base, _) => base,
    }
}

fn annotated(limit: u64) -> Budget {
    Budget {
        bytes: limit,
        source: Source::Annotation,
        reckoning: format!("its annotation {GPU_MEMORY_LIMIT_ANNOTATION}"),
    }
}

/// Why an annotation's value is not a memory size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "annotation {GPU_MEMORY_LIMIT_ANNOTATION}: {value:?} is not a memory size; write a quantity such as 8Gi or 8192Mi (it is ignored until then)"
)]
pub struct AnnotationError {
    /// The value.
    pub value: String,
}

/// The annotation's value as bytes ([`crd::quantity::parse_bytes`]).
///
/// # Errors
/// When the value is not a quantity.
pub fn parse_quantity(value: &str) -> Result<u64, AnnotationError> {
    crd::quantity::parse_bytes(value).map_err(|_| AnnotationError {
        value: value.to_owned(),
    })
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU: u64 = 40_960 * MIB;

    fn replicas(held: u32, of: u32) -> Holding {
        Holding {
            replicas: held,
            replicas_advertised: of,
            ..Holding::default()
        }
    }

    #[test]
    fn a_replica_gets_its_share_of_the_gpu() {
        let one = budget(GPU, replicas(1, 4), None, DefaultBudget::ReplicaShare).unwrap();
        assert_eq!(one.bytes, 10_240 * MIB);
        assert_eq!(one.source, Source::ReplicaShare);
        assert_eq!(one.reckoning, "1 of 4 replicas of a 40960 MiB GPU");
        let two = budget(GPU, replicas(2, 4), None, DefaultBudget::ReplicaShare).unwrap();
        assert_eq!(two.bytes, 20_480 * MIB);
        assert_eq!(budget(GPU, replicas(1, 4), None, DefaultBudget::None), None);
    }

    #[test]
    fn the_annotation_only_lowers() {
        let lowered = budget(
            GPU,
            replicas(1, 4),
            Some(4096 * MIB),
            DefaultBudget::ReplicaShare,
        );
        assert_eq!(
            lowered.map(|b| (b.bytes, b.source)),
            Some((4096 * MIB, Source::Annotation))
        );
        let raised = budget(
            GPU,
            replicas(1, 4),
            Some(30_000 * MIB),
            DefaultBudget::ReplicaShare,
        );
        assert_eq!(
            raised.map(|b| (b.bytes, b.source)),
            Some((10_240 * MIB, Source::ReplicaShare))
        );
        // Under rule `none`, it is the only budget.
        let alone = budget(
            GPU,
            replicas(1, 4),
            Some(8 * 1024 * MIB),
            DefaultBudget::None,
        );
        assert_eq!(alone.map(|b| b.bytes), Some(8 * 1024 * MIB));
    }

    #[test]
    fn whole_gpus_and_mig_devices_have_no_budget_whatever_the_annotation() {
        let whole = Holding {
            exclusive: true,
            ..Holding::default()
        };
        assert_eq!(
            budget(GPU, whole, Some(MIB), DefaultBudget::ReplicaShare),
            None
        );
        assert_eq!(
            budget(
                GPU,
                Holding::default(),
                Some(MIB),
                DefaultBudget::ReplicaShare
            ),
            None
        );
    }

    #[test]
    fn a_dra_share_is_its_claims_consumed_memory() {
        let claim = Holding {
            claimed_bytes: Some(3000 * MIB),
            ..Holding::default()
        };
        let budget_of = budget(GPU, claim, None, DefaultBudget::None).unwrap();
        assert_eq!(
            (budget_of.bytes, budget_of.source),
            (3000 * MIB, Source::DraClaim)
        );
        assert_eq!(budget_of.reckoning, "3000 MiB consumed by its DRA claims");
        let lowered = budget(GPU, claim, Some(1000 * MIB), DefaultBudget::ReplicaShare).unwrap();
        assert_eq!(lowered.bytes, 1000 * MIB);
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("8Gi"), Ok(8 << 30));
        assert_eq!(parse_quantity("8192Mi"), Ok(8 << 30));
        assert_eq!(parse_quantity("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_quantity("4G"), Ok(4_000_000_000));
        assert_eq!(parse_quantity(" 1048576 "), Ok(1 << 20));
        for bad in ["", "Gi", "8GB", "-1Gi", "8 Gi", "eight", "99999999999Ei"] {
            let error = parse_quantity(bad).unwrap_err();
            assert!(error.to_string().contains("8Gi"), "{error}");
        }
    }
}
