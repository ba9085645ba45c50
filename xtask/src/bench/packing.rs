//! MIG on demand, packing: `dra_driver::packing` replays the same traces of MIG claims against the scheduler's
//! first fit over our device order and NVIDIA's, on 100 simulated H100-80GB (12 nodes of 8 and one of 4), for a
//! few seeds. Pure computation on the devices and counters the driver publishes: no cluster, a few seconds.

use std::collections::BTreeMap;

use anyhow::Context as _;
use dra_driver::packing::{self, Order, Outcome, Setup, TraceSpec};
use serde::{Deserialize, Serialize};

use super::report::Environment;
use super::say;

const MODEL: &str = "h100-80gb";
const GPUS: u32 = 100;
const GPUS_PER_NODE: u32 = 8;
/// The claims' profiles and their weights (percent).
const MIX: [(&str, u32); 5] = [
    ("1g.10gb", 40),
    ("2g.20gb", 25),
    ("3g.40gb", 20),
    ("4g.40gb", 10),
    ("7g.80gb", 5),
];
/// Pods asking to run at once, on average: 300 pods of 2.25 compute slices each on average are 675 of the 700
/// compute slices, which keeps the GPUs about 88 % busy with a few percent of the pods refused.
const MEAN_LIFETIME: u32 = 300;
const ARRIVALS: u32 = 20 * MEAN_LIFETIME;
const WARMUP: u32 = 2 * MEAN_LIFETIME;
const SEEDS: [u64; 5] = [1, 2, 3, 4, 5];

/// One order's figures on one trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    pub placed: u32,
    pub refused: u32,
    pub refused_fragmented: u32,
    pub gpus_used_max: u32,
    pub gpus_used_mean: f64,
    /// Compute slices held over all compute slices, mean.
    pub busy_mean: f64,
    /// Per profile, the GPUs that could take one more instance of it, mean.
    pub can_take_mean: BTreeMap<String, f64>,
}

impl From<Outcome> for Figures {
    fn from(outcome: Outcome) -> Self {
        Self {
            placed: outcome.placed,
            refused: outcome.refused,
            refused_fragmented: outcome.refused_fragmented,
            gpus_used_max: outcome.gpus_used_max,
            gpus_used_mean: outcome.gpus_used_mean,
            busy_mean: outcome.busy_mean,
            can_take_mean: outcome.can_take_mean,
        }
    }
}

/// Both orders on the trace of one seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub seed: u64,
    pub ours: Figures,
    pub nvidia: Figures,
}

impl Run {
    pub fn of(&self, order: Order) -> &Figures {
        match order {
            Order::Ours => &self.ours,
            Order::Nvidia => &self.nvidia,
        }
    }
}

/// What `cargo xtask bench` records of the packing replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PackingBench {
    /// The commit and date of the run (`--packing-only` keeps the other results of bench.json).
    pub commit: String,
    pub date: String,
    pub model: String,
    pub gpus: u32,
    pub gpus_per_node: u32,
    /// Profile and weight (percent) of the claims.
    pub mix: Vec<(String, u32)>,
    pub arrivals: u32,
    pub mean_lifetime: u32,
    pub warmup: u32,
    pub runs: Vec<Run>,
}

/// The median, least and most of a figure over seeds or runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// The median, least and most of `values`; all zero when there are none.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut values: Vec<f64> = values.into_iter().collect();
        values.sort_by(f64::total_cmp);
        let median = match values.len() {
            0 => 0.0,
            n if n % 2 == 1 => values[n / 2],
            n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
        };
        Self {
            median,
            min: values.first().copied().unwrap_or_default(),
            max: values.last().copied().unwrap_or_default(),
        }
    }
}

impl PackingBench {
    /// A figure of one order over the runs.
    pub fn spread(&self, order: Order, figure: impl Fn(&Figures) -> f64) -> Spread {
        Spread::of(self.runs.iter().map(|run| figure(run.of(order))))
    }

    /// Seeds on which ours refused fewer pods than NVIDIA's order, and on which it refused more.
    pub fn ours_fewer_more(&self) -> (usize, usize) {
        let fewer = self
            .runs
            .iter()
            .filter(|run| run.ours.refused < run.nvidia.refused)
            .count();
        let more = self
            .runs
            .iter()
            .filter(|run| run.ours.refused > run.nvidia.refused)
            .count();
        (fewer, more)
    }
}

/// Replays the traces of every seed with both orders.
pub fn measure(environment: &Environment) -> anyhow::Result<PackingBench> {
    let model = crd::mig::model_by_simulator_name(MODEL).context("no H100-80GB in the catalog")?;
    let mix = packing::mix(model, &MIX).map_err(anyhow::Error::msg)?;
    let setup = Setup {
        model,
        gpus: GPUS,
        gpus_per_node: GPUS_PER_NODE,
    };
    let mut runs = Vec::new();
    for seed in SEEDS {
        let trace = packing::trace(&TraceSpec {
            seed,
            arrivals: ARRIVALS,
            mean_lifetime: MEAN_LIFETIME,
            warmup: WARMUP,
            mix: mix.clone(),
        });
        let ours = packing::replay(&setup, Order::Ours, &trace);
        let nvidia = packing::replay(&setup, Order::Nvidia, &trace);
        say(format!(
            "MIG packing, seed {seed}: ours refused {} ({} for fragmentation), NVIDIA's order {} ({})",
            ours.refused, ours.refused_fragmented, nvidia.refused, nvidia.refused_fragmented
        ));
        runs.push(Run {
            seed,
            ours: ours.into(),
            nvidia: nvidia.into(),
        });
    }
    Ok(PackingBench {
        commit: environment.commit.clone(),
        date: environment.date.clone(),
        model: model.product_name().to_owned(),
        gpus: GPUS,
        gpus_per_node: GPUS_PER_NODE,
        mix: MIX
            .iter()
            .map(|&(profile, weight)| (profile.to_owned(), weight))
            .collect(),
        arrivals: ARRIVALS,
        mean_lifetime: MEAN_LIFETIME,
        warmup: WARMUP,
        runs,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub fn figures(refused: u32, fragmented: u32) -> Figures {
        Figures {
            placed: 6000 - refused,
            refused,
            refused_fragmented: fragmented,
            gpus_used_max: 100,
            gpus_used_mean: 98.5,
            busy_mean: 0.885,
            can_take_mean: BTreeMap::from([
                ("4g.40gb".to_owned(), 3.0),
                ("7g.80gb".to_owned(), 1.5),
            ]),
        }
    }

    pub fn bench(pairs: &[(u32, u32)]) -> PackingBench {
        PackingBench {
            commit: "abc1234".into(),
            date: "2026-11-30T10:00:00Z".into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            gpus: 100,
            gpus_per_node: 8,
            mix: MIX
                .iter()
                .map(|&(profile, weight)| (profile.to_owned(), weight))
                .collect(),
            arrivals: 6000,
            mean_lifetime: 300,
            warmup: 600,
            runs: pairs
                .iter()
                .zip(1..)
                .map(|(&(ours, nvidia), seed)| Run {
                    seed,
                    ours: figures(ours, ours / 4),
                    nvidia: figures(nvidia, nvidia / 3),
                })
                .collect(),
        }
    }

    #[test]
    fn spreads_are_median_least_and_most_over_the_seeds() {
        let bench = bench(&[(190, 200), (180, 170), (210, 230), (200, 220)]);
        let refused = bench.spread(Order::Ours, |figures| f64::from(figures.refused));
        assert_eq!(
            refused,
            Spread {
                median: 195.0,
                min: 180.0,
                max: 210.0
            }
        );
        assert_eq!(
            bench
                .spread(Order::Nvidia, |figures| f64::from(figures.refused))
                .median,
            210.0
        );
        assert_eq!(bench.ours_fewer_more(), (3, 1));
    }

    #[test]
    fn the_bench_replays_every_seed_with_both_orders() {
        let environment = Environment {
            date: "2026-11-30T10:00:00Z".into(),
            commit: "abc1234".into(),
            cores: 2,
            memory_gib: 8.0,
            kubernetes: "v1.37.1".into(),
            nvidia: String::new(),
        };
        let bench = measure(&environment).unwrap();
        assert_eq!(bench.runs.len(), SEEDS.len());
        for run in &bench.runs {
            for order in Order::ALL {
                let figures = run.of(order);
                assert_eq!(figures.placed + figures.refused, ARRIVALS);
                assert!(
                    (0.80..=0.95).contains(&figures.busy_mean),
                    "the GPUs are kept 80 to 95 % busy: {figures:?}"
                );
                assert!(
                    figures.refused > 0,
                    "the load refuses some pods: {figures:?}"
                );
            }
        }
    }
}
