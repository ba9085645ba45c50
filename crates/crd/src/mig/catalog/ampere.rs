//! Ampere data-center parts (GA100, compute capability 8.0): A100, A800, A30 and the 96 GB PG506 board.

use super::nvml_index::{FOUR, ONE, ONE_REV1, TWO, TWO_REV1};
use super::{
    ComputeCapability, GpuInstanceProfile, GpuModel, SevenSliceSizes, profile, seven_slice_layout,
};
use crate::mig::profile_name::{GpuInstanceProfileName, ProfileAttribute};

/// GA100.
const AMPERE: ComputeCapability = ComputeCapability { major: 8, minor: 0 };

/// SMs of the A100 layout's profiles (`1g`, `1g+me`, `1g` with two memory slices, `2g`, `3g`, `4g`, `7g`); 98 of
/// the 108 SMs are usable with MIG on.
const A100_SMS: [u32; 7] = [14, 14, 14, 28, 42, 56, 98];

/// A100 40GB, SXM4 and PCIe, and the A800 40GB PCIe; `sources` says where each value comes from.
pub(super) const A100_40GB: GpuModel = GpuModel {
    simulator_name: "a100-40gb",
    sources: "Every value from the reference table; the PCIe and A800 ids are those NVIDIA's default config lists \
        with the A100-40GB.",
    product_names: &[
        "NVIDIA A100-SXM4-40GB",
        "NVIDIA A100-PCIE-40GB",
        "NVIDIA A800-PCIE-40GB",
    ],
    pci_device_ids: &[0x20B0_10DE, 0x20B1_10DE, 0x20F1_10DE, 0x20F6_10DE],
    memory_mib: 40960,
    compute_capability: AMPERE,
    sm_count: 108,
    compute_slices: 7,
    memory_slices: 8,
    profiles: &seven_slice_layout(SevenSliceSizes {
        memory_gb: [5, 10, 20, 40],
        memory_mib: [4864, 9856, 19968, 40192],
        sm_count: A100_SMS,
    }),
};

/// A100 80GB, SXM4 and PCIe, and the A800 80GB, SXM4 and PCIe; `sources` says where each value comes from.
pub(super) const A100_80GB: GpuModel = GpuModel {
    simulator_name: "a100-80gb",
    sources: "Every value from the reference; the A800 ids are those NVIDIA's default config lists with the \
        A100-80GB.",
    product_names: &[
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA A100 80GB PCIe",
        "NVIDIA A800-SXM4-80GB",
        "NVIDIA A800 80GB PCIe",
    ],
    pci_device_ids: &[0x20B2_10DE, 0x20B5_10DE, 0x20F3_10DE, 0x20F5_10DE],
    memory_mib: 81920,
    compute_capability: AMPERE,
    sm_count: 108,
    compute_slices: 7,
    memory_slices: 8,
    profiles: &seven_slice_layout(SevenSliceSizes {
        memory_gb: [10, 20, 40, 80],
        memory_mib: [9728, 19456, 40192, 80896],
        sm_count: A100_SMS,
    }),
};

/// The 96 GB GA100 board (PG506, device id 0x20B6); `sources` says where each value comes from.
pub(super) const PG506_96GB: GpuModel = GpuModel {
    simulator_name: "pg506-96gb",
    sources: "From NVIDIA's default config: its id and its profile names (`1g.12gb`, `2g.24gb`, `3g.48gb` in \
        `all-balanced`, the 96 GB names otherwise). Derived: SMs and slice structure as the A100; 96 GiB in \
        all, memory per slice by the catalog's rule; product name from the board number.",
    product_names: &["NVIDIA PG506-232"],
    pci_device_ids: &[0x20B6_10DE],
    memory_mib: 98304,
    compute_capability: AMPERE,
    sm_count: 108,
    compute_slices: 7,
    memory_slices: 8,
    profiles: &seven_slice_layout(SevenSliceSizes::derived([12, 24, 48, 96], 98304, A100_SMS)),
};

/// A30 24GB; `sources` says where each value comes from.
pub(super) const A30: GpuModel = GpuModel {
    simulator_name: "a30",
    sources: "From the reference and the MIG user guide: names, max instances, 4 compute and 4 memory slices. \
        Derived: profile ids by memory fraction as NVML numbers them (full 0, half 5, quarter 14, rev1 \
        variants 6 and 21); 14 SMs per compute slice (56 in all); 5952 MiB per memory slice; placements `1g` \
        at 0..3 size 1, `2g` at 0 and 2 size 2, `4g` at 0 size 4.",
    product_names: &["NVIDIA A30"],
    pci_device_ids: &[0x20B7_10DE],
    memory_mib: 24576,
    compute_capability: AMPERE,
    sm_count: 56,
    compute_slices: 4,
    memory_slices: 4,
    profiles: &A30_PROFILES,
};

/// The A30's profiles (see [`A30`]).
#[rustfmt::skip]
const A30_PROFILES: [GpuInstanceProfile; 5] = {
    let one = GpuInstanceProfileName::new(1, 6);
    let two = GpuInstanceProfileName::new(2, 12);
    let media = ProfileAttribute::MediaExtensions;
    [
        // name, NVML index, id, max instances, SMs, MiB, placement starts, placement size
        profile(one,                                   ONE,       14, 4, 14,  5952, &[0, 1, 2, 3], 1),
        profile(one.with(media),                       ONE_REV1,  21, 1, 14,  5952, &[0, 1, 2, 3], 1),
        profile(two,                                   TWO,        5, 2, 28, 11904, &[0, 2],       2),
        profile(two.with(media),                       TWO_REV1,   6, 1, 28, 11904, &[0, 2],       2),
        profile(GpuInstanceProfileName::new(4, 24),    FOUR,       0, 1, 56, 23808, &[0],          4),
    ]
};
