//! What the in-process kubelet test and the Allocate latency example share (included by both with `#[path]`;
//! Cargo builds no test target from a folder's `mod.rs`).

use std::time::Duration;

/// p50 and p99 of some durations, in microseconds (nearest rank on the sorted samples).
pub fn percentiles(mut samples: Vec<Duration>) -> (u128, u128) {
    samples.sort();
    let at = |fraction: f64| {
        let position = ((samples.len() - 1) as f64 * fraction).round() as usize;
        samples[position].as_micros()
    };
    (at(0.5), at(0.99))
}
