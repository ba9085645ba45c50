//! Blackwell parts: the data-center B200, GB200, B300 and GB300 (7 compute, 8 memory slices, the A100's profile
//! ids, counts and placements) and the RTX PRO 6000 Blackwell (4 compute, 4 memory slices, with the graphics and
//! media-engine variants `+gfx`, `-me` and `+me.all`).

use super::nvml_index::{
    FOUR, FOUR_GFX, ONE, ONE_ALL_ME, ONE_GFX, ONE_NO_ME, TWO, TWO_ALL_ME, TWO_GFX, TWO_NO_ME,
};
use super::{
    ComputeCapability, GpuInstanceProfile, GpuModel, SevenSliceSizes, even_sms, memory_slice_mib,
    profile, seven_slice_layout, sms_per_slice,
};
use crate::mig::profile_name::{GpuInstanceProfileName, ProfileAttribute};

/// B200 and GB200 (MIG user guide).
const BLACKWELL: ComputeCapability = ComputeCapability {
    major: 10,
    minor: 0,
};
/// B300 and GB300 (Blackwell Ultra; derived, the MIG user guide we read does not list them yet).
const BLACKWELL_ULTRA: ComputeCapability = ComputeCapability {
    major: 10,
    minor: 3,
};
/// RTX PRO 6000 Blackwell (MIG user guide).
const BLACKWELL_RTX: ComputeCapability = ComputeCapability {
    major: 12,
    minor: 0,
};

/// B200, 180 GB; `sources` says where each value comes from.
pub(super) const B200: GpuModel = GpuModel {
    simulator_name: "b200",
    sources: "From the MIG user guide: compute capability 10.0, 180 GB, 7 instances at most. From NVIDIA's default \
        config: its id, names (`1g.23gb`, `1g.23gb+me`, `1g.45gb`, `2g.45gb`, `3g.90gb`, `4g.90gb`, \
        `7g.180gb`) and counts. Derived: 148 SMs and SMs per slice by the catalog's rule; memory per slice \
        by the catalog's rule from 180 GiB.",
    product_names: &["NVIDIA B200"],
    pci_device_ids: &[0x2901_10DE],
    memory_mib: 184_320,
    compute_capability: BLACKWELL,
    sm_count: 148,
    compute_slices: 7,
    memory_slices: 8,
    profiles: &seven_slice_layout(SevenSliceSizes::derived(
        [23, 45, 90, 180],
        184_320,
        even_sms(sms_per_slice(148, 7)),
    )),
};

/// GB200 (HGX), 186 GB; `sources` says where each value comes from.
pub(super) const GB200: GpuModel = GpuModel {
    simulator_name: "gb200",
    sources: "From the MIG user guide: compute capability 10.0, 186 GB, 7 instances at most. From NVIDIA's default \
        config: its id, `all-balanced` (`1g.23gb`, `2g.47gb`, `3g.93gb`) and the names of its group \
        (`1g.23gb+me`, `1g.47gb`, `4g.93gb`, `7g.186gb`). Derived: SMs as the B200; memory per slice by the \
        catalog's rule from 186 GiB.",
    product_names: &["NVIDIA GB200"],
    pci_device_ids: &[0x2941_10DE],
    memory_mib: 190_464,
    compute_capability: BLACKWELL,
    sm_count: 148,
    compute_slices: 7,
    memory_slices: 8,
    profiles: &seven_slice_layout(SevenSliceSizes::derived(
        [23, 47, 93, 186],
        190_464,
        even_sms(sms_per_slice(148, 7)),
    )),
};

/// B300; `sources` says where each value comes from.
pub(super) const B300: GpuModel = GpuModel {
    simulator_name: "b300",
    sources: "From NVIDIA's default config: its id, names (`1g.34gb`, `1g.34gb+me`, `1g.67gb`, `2g.67gb`, \
        `3g.135gb`, `4g.135gb`, `7g.269gb`) and counts. Derived: compute capability 10.3; 160 SMs and SMs \
        per slice by the catalog's rule; memory per slice by the catalog's rule from 269 GiB (the `7g` \
        name).",
    product_names: &["NVIDIA B300 SXM6 AC"],
    pci_device_ids: &[0x3182_10DE],
    memory_mib: 275_456,
    compute_capability: BLACKWELL_ULTRA,
    sm_count: 160,
    compute_slices: 7,
    memory_slices: 8,
    profiles: &seven_slice_layout(SevenSliceSizes::derived(
        [34, 67, 135, 269],
        275_456,
        even_sms(sms_per_slice(160, 7)),
    )),
};

/// GB300; `sources` says where each value comes from.
pub(super) const GB300: GpuModel = GpuModel {
    simulator_name: "gb300",
    sources: "From NVIDIA's default config: its id, names (`1g.35gb`, `1g.35gb+me`, `1g.70gb`, `2g.70gb`, \
        `3g.139gb`, `4g.139gb`, `7g.278gb`) and counts (seven `1g.35gb`). Derived: as the B300, memory from \
        278 GiB.",
    product_names: &["NVIDIA GB300"],
    pci_device_ids: &[0x31C2_10DE],
    memory_mib: 284_672,
    compute_capability: BLACKWELL_ULTRA,
    sm_count: 160,
    compute_slices: 7,
    memory_slices: 8,
    profiles: &seven_slice_layout(SevenSliceSizes::derived(
        [35, 70, 139, 278],
        284_672,
        even_sms(sms_per_slice(160, 7)),
    )),
};

/// RTX PRO 6000 Blackwell Server Edition, 96 GB; `sources` says where each value comes from.
pub(super) const RTX_PRO_6000: GpuModel = GpuModel {
    simulator_name: "rtx-pro-6000",
    sources: "From the MIG user guide: compute capability 12.0, 96 GB, 4 instances at most. From NVIDIA's default \
        config: its id, names and counts (`1g.24gb`, `+gfx` and `-me` four times, `+me.all` once; `2g.48gb`, \
        `+gfx` and `-me` twice, `+me.all` once; `4g.96gb` and `+gfx` once). NVML indices are NVML's \
        constants for these variants. Derived: 4 memory slices (one per compute slice, as the A30); \
        placements as the A30; 188 SMs and SMs per slice by the catalog's rule; memory per slice by the \
        catalog's rule from 96 GiB; profile ids: the A30's for the plain and `+me.all` profiles, our own \
        unique numbers for `+gfx` and `-me` (the simulator needs an id; on hardware the MIG manager stops \
        before creating instances when NVML reports other ids).",
    product_names: &["NVIDIA RTX PRO 6000 Blackwell Server Edition"],
    pci_device_ids: &[0x2BB5_10DE],
    memory_mib: 98304,
    compute_capability: BLACKWELL_RTX,
    sm_count: 188,
    compute_slices: 4,
    memory_slices: 4,
    profiles: &RTX_PRO_6000_PROFILES,
};

/// The RTX PRO 6000's profiles (see [`RTX_PRO_6000`]).
#[rustfmt::skip]
const RTX_PRO_6000_PROFILES: [GpuInstanceProfile; 10] = {
    let slice = memory_slice_mib(98304, 4);
    let sms = sms_per_slice(188, 4);
    let one = GpuInstanceProfileName::new(1, 24);
    let two = GpuInstanceProfileName::new(2, 48);
    let four = GpuInstanceProfileName::new(4, 96);
    let all_media = ProfileAttribute::AllMediaExtensions;
    let graphics = ProfileAttribute::Graphics;
    let no_media = ProfileAttribute::NoMediaExtensions;
    let quarters: &[u8] = &[0, 1, 2, 3];
    [
        // name, NVML index, id, max instances, SMs, MiB, placement starts, placement size
        profile(one,                     ONE,        14, 4, sms,     slice,     quarters, 1),
        profile(one.with(all_media),     ONE_ALL_ME, 21, 1, sms,     slice,     quarters, 1),
        profile(one.with(graphics),      ONE_GFX,    47, 4, sms,     slice,     quarters, 1),
        profile(one.with(no_media),      ONE_NO_ME,  48, 4, sms,     slice,     quarters, 1),
        profile(two,                     TWO,         5, 2, 2 * sms, 2 * slice, &[0, 2],  2),
        profile(two.with(all_media),     TWO_ALL_ME,  6, 1, 2 * sms, 2 * slice, &[0, 2],  2),
        profile(two.with(graphics),      TWO_GFX,    49, 2, 2 * sms, 2 * slice, &[0, 2],  2),
        profile(two.with(no_media),      TWO_NO_ME,  50, 2, 2 * sms, 2 * slice, &[0, 2],  2),
        profile(four,                    FOUR,        0, 1, 4 * sms, 4 * slice, &[0],     4),
        profile(four.with(graphics),     FOUR_GFX,   51, 1, 4 * sms, 4 * slice, &[0],     4),
    ]
};
