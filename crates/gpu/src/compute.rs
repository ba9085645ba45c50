//! Compute-instance facts the MIG catalog does not hold: which compute-instance sizes a GPU instance of `G` slices
//! accepts, and the NVML constant that names each size.
//!
//! The planner checks `<C>c.<G>g...` names against these before it plans anything, the simulator enforces them, and
//! the NVML backend turns a size into the constant NVML asks for: one table, so the three cannot disagree.

/// Compute-instance sizes (in compute slices) a GPU instance with `gpu_instance_slices` accepts, smallest first.
///
/// From NVIDIA's MIG user guide for the A100/H100 layout (7 slices: 1, 2, 3, 4 or 7; a `4g` holds 1, 2 or 4; a `3g`
/// 1, 2 or 3) and the A30 (4 slices, same rule for `4g`, `2g`, `1g`).
#[must_use]
pub fn compute_slices_for(gpu_instance_slices: u32) -> &'static [u32] {
    match gpu_instance_slices {
        1 => &[1],
        2 => &[1, 2],
        3 => &[1, 2, 3],
        4 => &[1, 2, 4],
        7 => &[1, 2, 3, 4, 7],
        _ => &[],
    }
}

/// How many compute instances of `compute_slices` fit in a GPU instance of `gpu_instance_slices` (0 when the size is
/// not accepted there).
#[must_use]
pub fn max_compute_instances(gpu_instance_slices: u32, compute_slices: u32) -> u32 {
    if compute_slices_for(gpu_instance_slices).contains(&compute_slices) {
        gpu_instance_slices / compute_slices
    } else {
        0
    }
}

/// The NVML compute-instance profile constant (`NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE`) for a size.
#[must_use]
pub fn compute_profile_index(compute_slices: u32) -> Option<u32> {
    match compute_slices {
        1 => Some(0),
        2 => Some(1),
        3 => Some(2),
        4 => Some(3),
        7 => Some(4),
        8 => Some(5),
        6 => Some(6),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_the_mig_user_guide() {
        assert_eq!(compute_slices_for(4), &[1, 2, 4]);
        assert_eq!(max_compute_instances(7, 2), 3);
        assert_eq!(max_compute_instances(3, 2), 1);
        assert_eq!(max_compute_instances(4, 3), 0);
        assert_eq!(max_compute_instances(1, 2), 0);
    }

    #[test]
    fn every_accepted_size_has_an_nvml_constant() {
        for slices in [1, 2, 3, 4, 7] {
            for size in compute_slices_for(slices) {
                assert!(compute_profile_index(*size).is_some(), "{size}");
            }
        }
        assert_eq!(compute_profile_index(7), Some(4));
        assert_eq!(compute_profile_index(5), None);
    }
}
