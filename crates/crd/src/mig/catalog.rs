//! The MIG-capable GPU models the operator knows, as static data (source: reference/mig-profiles.md).
//!
//! One table serves the simulator (which must answer NVML queries the way the real part does), the config
//! validators (which reject profiles a model cannot create) and the placement planner (which needs allowed starts).
//!
//! Values the reference does not give are derived and marked so in the doc comment of the model that holds them;
//! they should be checked on hardware when one is available, and are never used to make a decision that a real
//! GPU would contradict (on real hardware NVML is asked, not this table).

use std::fmt;

use super::profile_name::{GpuInstanceProfileName, ProfileAttribute};

/// CUDA compute capability, e.g. 8.0 for Ampere data-center parts; labels and the GPU family derive from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComputeCapability {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// One GPU-instance profile of one model, as `nvidia-smi mig -lgip` and NVML describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GpuInstanceProfile {
    /// The profile name, e.g. `1g.5gb`.
    pub name: GpuInstanceProfileName,
    /// The NVML profile constant passed to `GetGpuInstanceProfileInfo` (0 = 1 slice, 7 = 1 slice rev1, ...).
    pub nvml_index: u32,
    /// The profile id that create and placement calls take (the ID column of `nvidia-smi mig -lgip`).
    pub id: u32,
    /// How many instances of this profile alone fit on one GPU.
    pub max_instances: u32,
    /// Streaming multiprocessors of one instance.
    pub sm_count: u32,
    /// Memory of one instance in MiB.
    pub memory_mib: u64,
    /// Memory slices at which an instance may start.
    pub placement_starts: &'static [u8],
    /// Memory slices one instance occupies.
    pub placement_size: u8,
}

/// One GPU model and its MIG geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GpuModel {
    /// The short name the simulator takes on its command line, e.g. `a100-40gb`.
    pub simulator_name: &'static str,
    /// Product names as NVML reports them; the first is the one the simulator reports.
    pub product_names: &'static [&'static str],
    /// PCI device ids (device << 16 | vendor), as mig-parted's `device-filter` writes them.
    pub pci_device_ids: &'static [u32],
    /// Total memory in MiB with MIG off.
    pub memory_mib: u64,
    /// CUDA compute capability.
    pub compute_capability: ComputeCapability,
    /// Streaming multiprocessors with MIG off.
    pub sm_count: u32,
    /// Compute slices with MIG on (the `<G>` of the largest profile).
    pub compute_slices: u8,
    /// Memory slices with MIG on (the unit of placements).
    pub memory_slices: u8,
    /// GPU-instance profiles, smallest first.
    pub profiles: &'static [GpuInstanceProfile],
}

impl GpuModel {
    /// The product name the simulator reports, e.g. `NVIDIA A100-SXM4-40GB`.
    #[must_use]
    pub fn product_name(&self) -> &'static str {
        self.product_names[0]
    }

    /// The profile with this GPU-instance name, if the model has it.
    #[must_use]
    pub fn profile(&self, name: GpuInstanceProfileName) -> Option<&'static GpuInstanceProfile> {
        self.profiles.iter().find(|profile| profile.name == name)
    }

    /// The profile with this name as text (`1g.5gb+me`); `None` for unknown or malformed names.
    #[must_use]
    pub fn profile_by_name(&self, name: &str) -> Option<&'static GpuInstanceProfile> {
        let name: GpuInstanceProfileName = name.parse().ok()?;
        self.profile(name)
    }
}

/// Sizes that differ between the models sharing the A100 layout (7 compute slices, 8 memory slices).
///
/// Arrays are indexed by memory-slice count class: 1, 2, 4 and 8 memory slices.
struct SevenSliceSizes {
    /// The `<GB>` of the profile names.
    memory_gb: [u16; 4],
    /// Instance memory in MiB.
    memory_mib: [u64; 4],
    /// SMs of `1g`, `1g+me`, `1g` with two memory slices, `2g`, `3g`, `4g`, `7g`.
    sm_count: [u32; 7],
}

/// Builds the seven profiles of the A100 layout. Ids, indices, counts and placements are shared by A100, H100 and
/// H200 (reference: "ids as A100", "same slice structure"); only names, memory and SMs differ.
#[rustfmt::skip]
const fn seven_slice_layout(sizes: SevenSliceSizes) -> [GpuInstanceProfile; 7] {
    let gb = sizes.memory_gb;
    let mib = sizes.memory_mib;
    let sms = sizes.sm_count;
    let one_slice = GpuInstanceProfileName::new(1, gb[0]);
    let media = one_slice.with(ProfileAttribute::MediaExtensions);
    let every_slice: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
    [
        // name, NVML index, id, max instances, SMs, MiB, placement starts, placement size
        profile(one_slice,                              0, 19, 7, sms[0], mib[0], every_slice,    1),
        profile(media,                                  7, 20, 1, sms[1], mib[0], every_slice,    1),
        profile(GpuInstanceProfileName::new(1, gb[1]), 9, 15, 4, sms[2], mib[1], &[0, 2, 4, 6],  2),
        profile(GpuInstanceProfileName::new(2, gb[1]), 1, 14, 3, sms[3], mib[1], &[0, 2, 4],     2),
        profile(GpuInstanceProfileName::new(3, gb[2]), 2,  9, 2, sms[4], mib[2], &[0, 4],        4),
        profile(GpuInstanceProfileName::new(4, gb[2]), 3,  5, 1, sms[5], mib[2], &[0],           4),
        profile(GpuInstanceProfileName::new(7, gb[3]), 4,  0, 1, sms[6], mib[3], &[0],           8),
    ]
}

/// Positional constructor so that the tables below read like the reference tables.
#[allow(clippy::too_many_arguments)]
const fn profile(
    name: GpuInstanceProfileName,
    nvml_index: u32,
    id: u32,
    max_instances: u32,
    sm_count: u32,
    memory_mib: u64,
    placement_starts: &'static [u8],
    placement_size: u8,
) -> GpuInstanceProfile {
    GpuInstanceProfile {
        name,
        nvml_index,
        id,
        max_instances,
        sm_count,
        memory_mib,
        placement_starts,
        placement_size,
    }
}

/// A100-SXM4-40GB: every value from the reference table.
static A100_40GB_PROFILES: [GpuInstanceProfile; 7] = seven_slice_layout(SevenSliceSizes {
    memory_gb: [5, 10, 20, 40],
    memory_mib: [4864, 9856, 19968, 40192],
    sm_count: [14, 14, 14, 28, 42, 56, 98],
});

/// A100-SXM4-80GB and A100 80GB PCIe: every value from the reference.
static A100_80GB_PROFILES: [GpuInstanceProfile; 7] = seven_slice_layout(SevenSliceSizes {
    memory_gb: [10, 20, 40, 80],
    memory_mib: [9728, 19456, 40192, 80896],
    sm_count: [14, 14, 14, 28, 42, 56, 98],
});

/// H100 80GB HBM3. From the reference: names, ids, counts, SMs except `1g.10gb+me`, and memory of `1g.10gb`
/// (9.75 GiB = 9984 MiB), `1g.20gb` (19.62 GiB, NVML's 20096 MiB), `3g.40gb` (39.5 GiB = 40448 MiB) and `7g.80gb`
/// (79.25 GiB = 81152 MiB). Derived: `1g.10gb+me` has the SMs and memory of `1g.10gb`; `2g.20gb` and `4g.40gb`
/// have the memory of the profiles with the same memory slices; placements are the A100's (the reference says to
/// assume them until verified on hardware).
static H100_80GB_PROFILES: [GpuInstanceProfile; 7] = seven_slice_layout(SevenSliceSizes {
    memory_gb: [10, 20, 40, 80],
    memory_mib: [9984, 20096, 40448, 81152],
    sm_count: [16, 16, 26, 32, 60, 64, 132],
});

/// H200 141GB. From the reference: names, max instances and the slice structure. Derived: ids, NVML indices and
/// placements as the A100/H100 layout; SMs as the H100 (same GH100 die, 132 SMs); memory as 17.5 GiB (17920 MiB) per
/// memory slice, which keeps the `<GB>` of every name consistent with NVML's rounding of a fraction of 141 GB.
static H200_PROFILES: [GpuInstanceProfile; 7] = seven_slice_layout(SevenSliceSizes {
    memory_gb: [18, 35, 71, 141],
    memory_mib: [17_920, 35_840, 71_680, 143_360],
    sm_count: [16, 16, 26, 32, 60, 64, 132],
});

/// A30 24GB. From the reference: names, max instances, 4 compute and 4 memory slices. Derived: NVML indices from the
/// slice counts (2-slice rev1 is index 8); profile ids by memory fraction as NVML numbers them (full 0, half 5,
/// quarter 14, rev1 variants 6 and 21); 14 SMs per compute slice (56 in all); 5952 MiB per memory slice; placements
/// `1g` at 0..3 size 1, `2g` at 0 and 2 size 2, `4g` at 0 size 4.
#[rustfmt::skip]
static A30_PROFILES: [GpuInstanceProfile; 5] = {
    let one = GpuInstanceProfileName::new(1, 6);
    let two = GpuInstanceProfileName::new(2, 12);
    let media = ProfileAttribute::MediaExtensions;
    [
        // name, NVML index, id, max instances, SMs, MiB, placement starts, placement size
        profile(one,                                   0, 14, 4, 14,  5952, &[0, 1, 2, 3], 1),
        profile(one.with(media),                       7, 21, 1, 14,  5952, &[0, 1, 2, 3], 1),
        profile(two,                                   1,  5, 2, 28, 11904, &[0, 2],       2),
        profile(two.with(media),                       8,  6, 1, 28, 11904, &[0, 2],       2),
        profile(GpuInstanceProfileName::new(4, 24),    3,  0, 1, 56, 23808, &[0],          4),
    ]
};

/// Ampere data-center parts.
const AMPERE: ComputeCapability = ComputeCapability { major: 8, minor: 0 };
/// Hopper parts.
const HOPPER: ComputeCapability = ComputeCapability { major: 9, minor: 0 };

/// Every known model. Total memory is not in the reference: the values are what NVML reports for these parts
/// (derived for H200 and A30, like their profile memory).
static MODELS: [GpuModel; 5] = [
    GpuModel {
        simulator_name: "a100-40gb",
        product_names: &["NVIDIA A100-SXM4-40GB"],
        pci_device_ids: &[0x20B0_10DE],
        memory_mib: 40960,
        compute_capability: AMPERE,
        sm_count: 108,
        compute_slices: 7,
        memory_slices: 8,
        profiles: &A100_40GB_PROFILES,
    },
    GpuModel {
        simulator_name: "a100-80gb",
        product_names: &["NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"],
        pci_device_ids: &[0x20B2_10DE, 0x20B5_10DE],
        memory_mib: 81920,
        compute_capability: AMPERE,
        sm_count: 108,
        compute_slices: 7,
        memory_slices: 8,
        profiles: &A100_80GB_PROFILES,
    },
    GpuModel {
        simulator_name: "h100-80gb",
        product_names: &["NVIDIA H100 80GB HBM3"],
        pci_device_ids: &[0x2330_10DE],
        memory_mib: 81559,
        compute_capability: HOPPER,
        sm_count: 132,
        compute_slices: 7,
        memory_slices: 8,
        profiles: &H100_80GB_PROFILES,
    },
    GpuModel {
        simulator_name: "h200",
        product_names: &["NVIDIA H200"],
        pci_device_ids: &[0x2335_10DE],
        memory_mib: 143_771,
        compute_capability: HOPPER,
        sm_count: 132,
        compute_slices: 7,
        memory_slices: 8,
        profiles: &H200_PROFILES,
    },
    GpuModel {
        simulator_name: "a30",
        product_names: &["NVIDIA A30"],
        pci_device_ids: &[0x20B7_10DE],
        memory_mib: 24576,
        compute_capability: AMPERE,
        sm_count: 56,
        compute_slices: 4,
        memory_slices: 4,
        profiles: &A30_PROFILES,
    },
];

/// Every model in the catalog.
#[must_use]
pub fn models() -> &'static [GpuModel] {
    &MODELS
}

/// The model the simulator calls `name` (`a100-40gb`, `a100-80gb`, `h100-80gb`, `h200`, `a30`).
#[must_use]
pub fn model_by_simulator_name(name: &str) -> Option<&'static GpuModel> {
    MODELS.iter().find(|model| model.simulator_name == name)
}

/// The model with this PCI device id (e.g. `0x20B010DE`).
#[must_use]
pub fn model_by_pci_device_id(id: u32) -> Option<&'static GpuModel> {
    MODELS
        .iter()
        .find(|model| model.pci_device_ids.contains(&id))
}

/// The model NVML names `name` (e.g. `NVIDIA H100 80GB HBM3`).
#[must_use]
pub fn model_by_product_name(name: &str) -> Option<&'static GpuModel> {
    MODELS
        .iter()
        .find(|model| model.product_names.contains(&name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile_of(model: &str, name: &str) -> &'static GpuInstanceProfile {
        model_by_simulator_name(model)
            .unwrap()
            .profile_by_name(name)
            .unwrap_or_else(|| panic!("{model} has no {name}"))
    }

    /// (name, index, id, max, SMs, MiB, starts, size) as the reference tables print them.
    type Row = (&'static str, u32, u32, u32, u32, u64, &'static [u8], u8);

    fn assert_rows(model: &str, rows: &[Row]) {
        let profiles = model_by_simulator_name(model).unwrap().profiles;
        assert_eq!(profiles.len(), rows.len(), "{model}");
        for (profile, row) in profiles.iter().zip(rows) {
            let actual: Row = (
                row.0,
                profile.nvml_index,
                profile.id,
                profile.max_instances,
                profile.sm_count,
                profile.memory_mib,
                profile.placement_starts,
                profile.placement_size,
            );
            assert_eq!(profile.name.to_string(), row.0, "{model}");
            assert_eq!(actual, *row, "{model}");
        }
    }

    #[test]
    fn a100_40gb_matches_the_reference_table() {
        let all: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
        assert_rows(
            "a100-40gb",
            &[
                ("1g.5gb", 0, 19, 7, 14, 4864, all, 1),
                ("1g.5gb+me", 7, 20, 1, 14, 4864, all, 1),
                ("1g.10gb", 9, 15, 4, 14, 9856, &[0, 2, 4, 6], 2),
                ("2g.10gb", 1, 14, 3, 28, 9856, &[0, 2, 4], 2),
                ("3g.20gb", 2, 9, 2, 42, 19968, &[0, 4], 4),
                ("4g.20gb", 3, 5, 1, 56, 19968, &[0], 4),
                ("7g.40gb", 4, 0, 1, 98, 40192, &[0], 8),
            ],
        );
        let model = model_by_simulator_name("a100-40gb").unwrap();
        assert_eq!(model.sm_count, 108);
        assert_eq!(model.compute_capability.to_string(), "8.0");
        assert_eq!((model.compute_slices, model.memory_slices), (7, 8));
    }

    #[test]
    fn a100_80gb_matches_the_reference() {
        let all: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
        assert_rows(
            "a100-80gb",
            &[
                ("1g.10gb", 0, 19, 7, 14, 9728, all, 1),
                ("1g.10gb+me", 7, 20, 1, 14, 9728, all, 1),
                ("1g.20gb", 9, 15, 4, 14, 19456, &[0, 2, 4, 6], 2),
                ("2g.20gb", 1, 14, 3, 28, 19456, &[0, 2, 4], 2),
                ("3g.40gb", 2, 9, 2, 42, 40192, &[0, 4], 4),
                ("4g.40gb", 3, 5, 1, 56, 40192, &[0], 4),
                ("7g.80gb", 4, 0, 1, 98, 80896, &[0], 8),
            ],
        );
    }

    #[test]
    fn h100_matches_the_reference_with_gib_converted() {
        assert_eq!(profile_of("h100-80gb", "1g.10gb").memory_mib, 9984);
        assert_eq!(profile_of("h100-80gb", "1g.20gb").memory_mib, 20096);
        assert_eq!(profile_of("h100-80gb", "3g.40gb").memory_mib, 40448);
        assert_eq!(profile_of("h100-80gb", "7g.80gb").memory_mib, 81152);
        let ids: Vec<(String, u32, u32, u32)> = model_by_simulator_name("h100-80gb")
            .unwrap()
            .profiles
            .iter()
            .map(|p| (p.name.to_string(), p.id, p.max_instances, p.sm_count))
            .collect();
        let expected = [
            ("1g.10gb", 19, 7, 16),
            ("1g.10gb+me", 20, 1, 16),
            ("1g.20gb", 15, 4, 26),
            ("2g.20gb", 14, 3, 32),
            ("3g.40gb", 9, 2, 60),
            ("4g.40gb", 5, 1, 64),
            ("7g.80gb", 0, 1, 132),
        ];
        let expected: Vec<(String, u32, u32, u32)> = expected
            .iter()
            .map(|(name, id, max, sms)| ((*name).to_owned(), *id, *max, *sms))
            .collect();
        assert_eq!(ids, expected);
        assert_eq!(
            model_by_simulator_name("h100-80gb")
                .unwrap()
                .compute_capability
                .to_string(),
            "9.0"
        );
    }

    #[test]
    fn h200_and_a30_have_the_reference_names_and_counts() {
        let names = |model: &str| -> Vec<(String, u32)> {
            model_by_simulator_name(model)
                .unwrap()
                .profiles
                .iter()
                .map(|p| (p.name.to_string(), p.max_instances))
                .collect()
        };
        let owned = |rows: &[(&str, u32)]| -> Vec<(String, u32)> {
            rows.iter().map(|(n, c)| ((*n).to_owned(), *c)).collect()
        };
        assert_eq!(
            names("h200"),
            owned(&[
                ("1g.18gb", 7),
                ("1g.18gb+me", 1),
                ("1g.35gb", 4),
                ("2g.35gb", 3),
                ("3g.71gb", 2),
                ("4g.71gb", 1),
                ("7g.141gb", 1)
            ])
        );
        assert_eq!(
            names("a30"),
            owned(&[
                ("1g.6gb", 4),
                ("1g.6gb+me", 1),
                ("2g.12gb", 2),
                ("2g.12gb+me", 1),
                ("4g.24gb", 1)
            ])
        );
        let a30 = model_by_simulator_name("a30").unwrap();
        assert_eq!((a30.compute_slices, a30.memory_slices), (4, 4));
    }

    /// Placements must stay inside the memory slices, and the listed starts must allow max instances side by side.
    #[test]
    fn every_profile_fits_its_model() {
        for model in models() {
            let full = model.profiles.iter().map(|p| p.sm_count).max().unwrap();
            for profile in model.profiles {
                assert!(profile.name.slices <= model.compute_slices, "{profile:?}");
                assert!(profile.memory_mib < model.memory_mib, "{profile:?}");
                assert!(
                    profile.sm_count <= full && full <= model.sm_count,
                    "{profile:?}"
                );
                for start in profile.placement_starts {
                    assert!(
                        start + profile.placement_size <= model.memory_slices,
                        "{profile:?}"
                    );
                }
                let disjoint = profile
                    .placement_starts
                    .windows(2)
                    .all(|pair| pair[0] + profile.placement_size <= pair[1]);
                if disjoint {
                    assert!(
                        profile.placement_starts.len() as u32 >= profile.max_instances,
                        "{profile:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn lookups_find_each_model() {
        assert_eq!(
            model_by_pci_device_id(0x20B0_10DE).unwrap().simulator_name,
            "a100-40gb"
        );
        assert_eq!(
            model_by_pci_device_id(0x20B5_10DE).unwrap().simulator_name,
            "a100-80gb"
        );
        assert_eq!(
            model_by_pci_device_id(0x2335_10DE).unwrap().simulator_name,
            "h200"
        );
        assert!(model_by_pci_device_id(0x1234_10DE).is_none());
        assert_eq!(
            model_by_product_name("NVIDIA H100 80GB HBM3")
                .unwrap()
                .simulator_name,
            "h100-80gb"
        );
        assert_eq!(
            model_by_product_name("NVIDIA A100 80GB PCIe")
                .unwrap()
                .simulator_name,
            "a100-80gb"
        );
        assert_eq!(
            model_by_product_name("NVIDIA A30").unwrap().simulator_name,
            "a30"
        );
        assert!(model_by_product_name("NVIDIA A30X").is_none());
        for model in models() {
            assert_eq!(model_by_simulator_name(model.simulator_name), Some(model));
            assert_eq!(model_by_product_name(model.product_name()), Some(model));
        }
        let a100 = model_by_simulator_name("a100-40gb").unwrap();
        assert_eq!(a100.product_name(), "NVIDIA A100-SXM4-40GB");
        assert!(a100.profile_by_name("1g.10gb+me").is_none());
        assert!(a100.profile_by_name("not a profile").is_none());
    }
}
