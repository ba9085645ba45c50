//! The search behind the planner: packing instances onto memory slices, and choosing which existing ones to keep.

use crd::mig::GpuInstanceProfile;

use crate::types::Placement;

/// Whether `placement` is one the profile may take (an allowed start, the profile's size).
pub(super) fn allowed(profile: &GpuInstanceProfile, placement: Placement) -> bool {
    placement.size == u32::from(profile.placement_size)
        && profile
            .placement_starts
            .iter()
            .any(|start| u32::from(*start) == placement.start)
}

/// Places every profile of `devices` (largest first, equal profiles adjacent) on slices not in `occupied`; returns
/// one placement per device, in order, or `None` when no arrangement exists.
///
/// Depth-first over every allowed start of every device, so a packing is found whenever one exists. Equal profiles
/// are placed at increasing starts only: swapping two equal instances gives the same packing, so trying both orders
/// would only repeat work.
pub(super) fn pack(devices: &[&GpuInstanceProfile], occupied: u64) -> Option<Vec<Placement>> {
    let mut placements = Vec::with_capacity(devices.len());
    place(devices, occupied, &mut placements).then_some(placements)
}

fn place(devices: &[&GpuInstanceProfile], occupied: u64, placements: &mut Vec<Placement>) -> bool {
    let index = placements.len();
    let Some(profile) = devices.get(index) else {
        return true;
    };
    let lowest_start = match (
        index.checked_sub(1).map(|previous| devices[previous]),
        placements.last(),
    ) {
        (Some(previous), Some(last)) if previous.id == profile.id => last.start + 1,
        _ => 0,
    };
    for placement in Placement::of_profile(profile) {
        if placement.start < lowest_start || placement.mask() & occupied != 0 {
            continue;
        }
        placements.push(placement);
        if place(devices, occupied | placement.mask(), placements) {
            return true;
        }
        placements.pop();
    }
    false
}

/// Every `k`-element subset of `0..n`, as ascending index lists, in lexicographic order.
pub(super) fn combinations(n: usize, k: usize) -> impl Iterator<Item = Vec<usize>> {
    let mut next = (k <= n).then(|| (0..k).collect::<Vec<usize>>());
    std::iter::from_fn(move || {
        let current = next.take()?;
        // Advance: find the rightmost index that can still move right, move it, and reset those after it.
        let mut following = current.clone();
        let movable = (0..k).rev().find(|&i| following[i] < n - k + i);
        if let Some(i) = movable {
            following[i] += 1;
            for j in i + 1..k {
                following[j] = following[j - 1] + 1;
            }
            next = Some(following);
        }
        Some(current)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crd::mig::model_by_simulator_name;

    #[test]
    fn combinations_in_lexicographic_order() {
        let all: Vec<Vec<usize>> = combinations(4, 2).collect();
        assert_eq!(
            all,
            vec![
                vec![0, 1],
                vec![0, 2],
                vec![0, 3],
                vec![1, 2],
                vec![1, 3],
                vec![2, 3]
            ]
        );
        assert_eq!(
            combinations(3, 0).collect::<Vec<_>>(),
            vec![Vec::<usize>::new()]
        );
        assert_eq!(combinations(2, 3).count(), 0);
        assert_eq!(combinations(8, 4).count(), 70);
    }

    #[test]
    fn pack_backtracks_past_a_first_choice_that_blocks() {
        let a100 = model_by_simulator_name("a100-40gb").unwrap();
        let two = a100.profile_by_name("2g.10gb").unwrap();
        let one = a100.profile_by_name("1g.5gb").unwrap();
        // Slices 0-1 and 4-5 are taken: the 2g must go to 2, and the 1g cannot then use 2 or 3.
        let occupied = 0b0011_0011;
        let placements = pack(&[two, one], occupied).unwrap();
        assert_eq!(placements[0], Placement { start: 2, size: 2 });
        assert_eq!(placements[1], Placement { start: 6, size: 1 });
        assert!(pack(&[two, two], occupied).is_none());
    }
}
