//! Which containers of a HAMi pod share one claim (pure).
//!
//! A claim is the pod's for its whole life, so each converted container having its own would hold an init
//! container's GPU share beside the main containers' until the pod ends. Kubernetes counts a pod's request as
//! max(largest init container, sum of the other containers), because a regular init container runs alone, before
//! the next one and before the main containers start. The same holds here: a regular init container joins a claim
//! of a container that never runs beside it (a main container, or another regular init container), which then holds
//! the larger of the two asks. Sidecars (init containers with `restartPolicy: Always`) run beside everything after
//! them, so they keep a claim of their own and no init container joins theirs; main containers run together, so
//! each keeps its own.
//!
//! Asks join only where one holds the other's: the same number of GPUs, both shares or both whole GPUs, and memory
//! of one kind (MiB with MiB, a percentage with a percentage; the whole memory holds either). An init container asking
//! 2000 MiB and a main container asking 3000 MiB share one claim of 3000 MiB; one asking MiB beside one asking a
//! percentage keeps its own, since which is larger depends on the GPU the scheduler picks.

use std::cmp::Reverse;

use crd::hami::Memory;

/// What one container asks HAMi for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Ask {
    pub(super) count: u32,
    /// A share (memory, percentage or cores given), or whole GPUs.
    pub(super) share: bool,
    pub(super) memory: Memory,
    pub(super) cores: Option<u64>,
}

impl Ask {
    /// One ask that holds both, or `None` when neither can stand for the other.
    fn holding(&self, other: &Ask) -> Option<Ask> {
        if self.count != other.count || self.share != other.share {
            return None;
        }
        let memory = match (self.memory, other.memory) {
            (Memory::Whole, _) | (_, Memory::Whole) => Memory::Whole,
            (Memory::Bytes(a), Memory::Bytes(b)) => Memory::Bytes(a.max(b)),
            (Memory::Percent(a), Memory::Percent(b)) => Memory::Percent(a.max(b)),
            _ => return None,
        };
        Some(Ask {
            count: self.count,
            share: self.share,
            memory,
            cores: self.cores.max(other.cores),
        })
    }

    /// How much memory it holds, to compare asks of one kind.
    fn memory_rank(&self) -> u64 {
        match self.memory {
            Memory::Whole => u64::MAX,
            Memory::Bytes(bytes) => bytes,
            Memory::Percent(percent) => u64::from(percent),
        }
    }
}

/// When a container runs, as the claims it may share depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Runs {
    /// A regular init container: alone, to completion, before the next container starts.
    Init,
    /// An init container with `restartPolicy: Always`: from its start to the pod's end, beside the rest.
    Sidecar,
    /// A main container: beside the other main containers and the sidecars.
    Main,
}

/// One claim and the containers that use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Shared {
    /// The container the claim is named after: a main container where one uses it, else the first.
    pub(super) lead: usize,
    /// Every container using it, in the pod's order (indices of the asks given).
    pub(super) members: Vec<usize>,
    /// What the claim holds: the largest of its members' asks.
    pub(super) ask: Ask,
    /// Whether regular init containers may join it (none of its members runs beside them).
    open_to_init: bool,
}

/// Groups the asks (in the pod's order: init containers, then main containers) into claims, in the order of
/// their first member.
pub(super) fn claims(asks: &[(Runs, Ask)]) -> Vec<Shared> {
    let mut claims: Vec<Shared> = asks
        .iter()
        .enumerate()
        .filter(|(_, (runs, _))| *runs != Runs::Init)
        .map(|(index, (runs, ask))| Shared {
            lead: index,
            members: vec![index],
            ask: ask.clone(),
            open_to_init: *runs == Runs::Main,
        })
        .collect();
    for (index, (_, ask)) in asks
        .iter()
        .enumerate()
        .filter(|(_, (runs, _))| *runs == Runs::Init)
    {
        // The claim it costs least to join: one that already holds the ask, else the largest, which grows least.
        let best = claims
            .iter()
            .enumerate()
            .filter(|(_, claim)| claim.open_to_init)
            .filter_map(|(position, claim)| {
                let held = claim.ask.holding(ask)?;
                let grows = held != claim.ask;
                Some(((grows, Reverse(claim.ask.memory_rank()), position), held))
            })
            .min_by_key(|(key, _)| *key);
        match best {
            Some(((_, _, position), held)) => {
                let claim = &mut claims[position];
                claim.ask = held;
                claim.members.push(index);
                claim.members.sort_unstable();
            }
            None => claims.push(Shared {
                lead: index,
                members: vec![index],
                ask: ask.clone(),
                open_to_init: true,
            }),
        }
    }
    claims.sort_by_key(|claim| claim.members[0]);
    claims
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn share(mib: u64) -> Ask {
        Ask {
            count: 1,
            share: true,
            memory: Memory::Bytes(mib * MIB),
            cores: None,
        }
    }

    fn percent(percent: u8) -> Ask {
        Ask {
            memory: Memory::Percent(percent),
            ..share(0)
        }
    }

    /// (lead, members, MiB or percent held) of each claim.
    fn summary(asks: &[(Runs, Ask)]) -> Vec<(usize, Vec<usize>, u64)> {
        claims(asks)
            .into_iter()
            .map(|claim| {
                let held = match claim.ask.memory {
                    Memory::Bytes(bytes) => bytes / MIB,
                    other => Ask {
                        memory: other,
                        ..share(0)
                    }
                    .memory_rank(),
                };
                (claim.lead, claim.members, held)
            })
            .collect()
    }

    #[test]
    fn an_init_container_shares_the_main_containers_claim_which_holds_the_larger_ask() {
        // The pod: init 2000 MiB, main 3000 MiB: 3000 held, not 5000.
        assert_eq!(
            summary(&[(Runs::Init, share(2000)), (Runs::Main, share(3000))]),
            [(1, vec![0, 1], 3000)]
        );
        // An init container larger than the main container: the claim grows to it, max(init, main).
        assert_eq!(
            summary(&[(Runs::Init, share(5000)), (Runs::Main, share(3000))]),
            [(1, vec![0, 1], 5000)]
        );
    }

    #[test]
    fn an_init_container_joins_the_claim_that_already_holds_it_else_the_largest() {
        let asks = [
            (Runs::Init, share(2000)),
            (Runs::Main, share(1000)),
            (Runs::Main, share(4000)),
            (Runs::Main, share(2500)),
        ];
        // 2500 holds 2000 already and so does 4000; the one that grows least and is largest: 4000.
        assert_eq!(
            summary(&asks),
            [
                (2, vec![0, 2], 4000),
                (1, vec![1], 1000),
                (3, vec![3], 2500)
            ]
        );
        let asks = [
            (Runs::Init, share(6000)),
            (Runs::Main, share(1000)),
            (Runs::Main, share(4000)),
        ];
        // None holds 6000: the largest grows, 1000 + 6000 held rather than 6000 + 4000.
        assert_eq!(summary(&asks), [(2, vec![0, 2], 6000), (1, vec![1], 1000)]);
    }

    #[test]
    fn regular_init_containers_share_with_one_another_and_never_with_a_sidecar() {
        let asks = [
            (Runs::Sidecar, share(1000)),
            (Runs::Init, share(2000)),
            (Runs::Init, share(1500)),
        ];
        // The sidecar runs beside both; the two init containers run one after the other.
        assert_eq!(summary(&asks), [(0, vec![0], 1000), (1, vec![1, 2], 2000)]);
    }

    #[test]
    fn main_containers_keep_a_claim_each() {
        let asks = [(Runs::Main, share(1000)), (Runs::Main, share(1000))];
        assert_eq!(summary(&asks), [(0, vec![0], 1000), (1, vec![1], 1000)]);
    }

    #[test]
    fn asks_that_cannot_hold_one_another_keep_their_own_claims() {
        let two_gpus = Ask {
            count: 2,
            ..share(1000)
        };
        let whole_gpu = Ask {
            share: false,
            memory: Memory::Whole,
            ..share(0)
        };
        for (init, main) in [
            (two_gpus, share(1000)),
            (whole_gpu, share(1000)),
            (percent(50), share(1000)),
            (share(1000), percent(50)),
        ] {
            assert_eq!(
                claims(&[(Runs::Init, init.clone()), (Runs::Main, main.clone())]).len(),
                2,
                "{init:?} and {main:?}"
            );
        }
    }

    #[test]
    fn the_whole_memory_holds_any_share_and_cores_take_the_larger() {
        let whole = Ask {
            memory: Memory::Whole,
            cores: Some(10),
            ..share(0)
        };
        let asks = [
            (
                Runs::Init,
                Ask {
                    cores: Some(30),
                    ..percent(20)
                },
            ),
            (Runs::Main, whole),
        ];
        let claims = claims(&asks);
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0].ask.memory, Memory::Whole);
        assert_eq!(claims[0].ask.cores, Some(30));
        assert_eq!(
            summary(&[(Runs::Init, percent(20)), (Runs::Main, percent(50))]),
            [(1, vec![0, 1], 50)]
        );
    }
}
