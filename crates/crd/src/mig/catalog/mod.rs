//! The MIG-capable GPU models the operator knows, as static data, one file per architecture family.
//!
//! One table serves the simulator (which must answer NVML queries the way the real part does), the config
//! validators (which reject profiles a model cannot create) and the placement planner (which needs allowed starts).
//!
//! Sources, in order of authority: the project's reference tables (`reference/mig-profiles.md`, from `nvidia-smi mig
//! -lgip` output), NVIDIA's MIG user guide (its "Supported GPUs" table gives compute capability, memory size and the
//! most instances per model; its "Supported MIG Profiles" tables give profile names, fractions and counts), and
//! NVIDIA's default mig-parted config of gpu-operator v26.7.0 (which PCI device ids take which profiles, and how
//! many). Values none of these give are derived and marked so in the `sources` of the model that holds them; they
//! should be checked on hardware when one is available, and are never used to make a decision that a real GPU would
//! contradict: before the MIG manager creates instances it checks each profile's id, slices and count against what
//! NVML reports for the profile's NVML constant, and stops if they differ. A GPU is matched to its model by PCI
//! device id; product names are what the simulator reports, and those the reference does not give follow NVIDIA's
//! naming as we read it. `docs/mig-catalog.md` prints the table.

mod ampere;
mod blackwell;
mod hopper;

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

impl ComputeCapability {
    /// The architecture's name, as NVIDIA's `nvidia.com/gpu.family` label and DRA attribute give it.
    #[must_use]
    pub fn family(self) -> &'static str {
        match (self.major, self.minor) {
            (1, _) => "tesla",
            (2, _) => "fermi",
            (3, _) => "kepler",
            (5, _) => "maxwell",
            (6, _) => "pascal",
            (7, 0..=4) => "volta",
            (7, _) => "turing",
            (8, 9) => "ada-lovelace",
            (8, _) => "ampere",
            (9, _) => "hopper",
            (10 | 12, _) => "blackwell",
            (13, _) => "rubin",
            _ => "undefined",
        }
    }
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
    /// Where each value comes from, and which values are derived rather than documented (printed in
    /// `docs/mig-catalog.md`).
    pub sources: &'static str,
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

/// NVML's GPU-instance profile constants (`NVML_GPU_INSTANCE_PROFILE_*`), the `nvml_index` of a profile.
pub(super) mod nvml_index {
    /// One slice.
    pub const ONE: u32 = 0;
    /// Two slices.
    pub const TWO: u32 = 1;
    /// Three slices.
    pub const THREE: u32 = 2;
    /// Four slices.
    pub const FOUR: u32 = 3;
    /// Seven slices.
    pub const SEVEN: u32 = 4;
    /// One slice, revision 1: the `+me` variant.
    pub const ONE_REV1: u32 = 7;
    /// Two slices, revision 1: the `+me` variant.
    pub const TWO_REV1: u32 = 8;
    /// One slice, revision 2: twice the memory.
    pub const ONE_REV2: u32 = 9;
    /// One slice with graphics (`+gfx`).
    pub const ONE_GFX: u32 = 10;
    /// Two slices with graphics.
    pub const TWO_GFX: u32 = 11;
    /// Four slices with graphics.
    pub const FOUR_GFX: u32 = 12;
    /// One slice without media extensions (`-me`).
    pub const ONE_NO_ME: u32 = 13;
    /// Two slices without media extensions.
    pub const TWO_NO_ME: u32 = 14;
    /// One slice with all media extensions (`+me.all`).
    pub const ONE_ALL_ME: u32 = 15;
    /// Two slices with all media extensions.
    pub const TWO_ALL_ME: u32 = 16;
}

/// Sizes that differ between the models sharing the A100 layout (7 compute slices, 8 memory slices).
///
/// Arrays are indexed by memory-slice count class: 1, 2, 4 and 8 memory slices.
pub(super) struct SevenSliceSizes {
    /// The `<GB>` of the profile names.
    pub memory_gb: [u16; 4],
    /// Instance memory in MiB.
    pub memory_mib: [u64; 4],
    /// SMs of `1g`, `1g+me`, `1g` with two memory slices, `2g`, `3g`, `4g`, `7g`.
    pub sm_count: [u32; 7],
}

impl SevenSliceSizes {
    /// Sizes for a part whose names NVIDIA documents but whose per-profile memory we derive: memory per slice by
    /// [`memory_slice_mib`] of `total_mib`.
    pub(super) const fn derived(memory_gb: [u16; 4], total_mib: u64, sm_count: [u32; 7]) -> Self {
        let slice = memory_slice_mib(total_mib, 8);
        Self {
            memory_gb,
            memory_mib: [slice, 2 * slice, 4 * slice, 8 * slice],
            sm_count,
        }
    }
}

/// Derived SMs of the seven profiles when every compute slice has `sms` SMs.
pub(super) const fn even_sms(sms: u32) -> [u32; 7] {
    [sms, sms, sms, 2 * sms, 3 * sms, 4 * sms, 7 * sms]
}

/// Derived memory of one memory slice: the total split evenly, rounded down to 256 MiB, less 256 MiB that MIG
/// keeps for itself (the A100-40GB's reference values, 40960 MiB in all and 4864 MiB per slice, follow this rule).
pub(super) const fn memory_slice_mib(total_mib: u64, memory_slices: u64) -> u64 {
    total_mib / memory_slices / 256 * 256 - 256
}

/// Derived SMs of one compute slice: the SMs split evenly, rounded down to an even number (SMs come in pairs,
/// one texture processing cluster).
pub(super) const fn sms_per_slice(sm_count: u32, compute_slices: u32) -> u32 {
    sm_count / compute_slices / 2 * 2
}

/// Builds the seven profiles of the A100 layout. Ids, indices, counts and placements are shared by every model with
/// 7 compute and 8 memory slices (reference: "ids as A100", "same slice structure"); only names, memory and SMs
/// differ.
#[rustfmt::skip]
pub(super) const fn seven_slice_layout(sizes: SevenSliceSizes) -> [GpuInstanceProfile; 7] {
    use nvml_index::{ONE, ONE_REV1, ONE_REV2, TWO, THREE, FOUR, SEVEN};
    let gb = sizes.memory_gb;
    let mib = sizes.memory_mib;
    let sms = sizes.sm_count;
    let one_slice = GpuInstanceProfileName::new(1, gb[0]);
    let media = one_slice.with(ProfileAttribute::MediaExtensions);
    let every_slice: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
    [
        // name, NVML index, id, max instances, SMs, MiB, placement starts, placement size
        profile(one_slice,                              ONE,      19, 7, sms[0], mib[0], every_slice,    1),
        profile(media,                                  ONE_REV1, 20, 1, sms[1], mib[0], every_slice,    1),
        profile(GpuInstanceProfileName::new(1, gb[1]), ONE_REV2, 15, 4, sms[2], mib[1], &[0, 2, 4, 6],  2),
        profile(GpuInstanceProfileName::new(2, gb[1]), TWO,      14, 3, sms[3], mib[1], &[0, 2, 4],     2),
        profile(GpuInstanceProfileName::new(3, gb[2]), THREE,     9, 2, sms[4], mib[2], &[0, 4],        4),
        profile(GpuInstanceProfileName::new(4, gb[2]), FOUR,      5, 1, sms[5], mib[2], &[0],           4),
        profile(GpuInstanceProfileName::new(7, gb[3]), SEVEN,     0, 1, sms[6], mib[3], &[0],           8),
    ]
}

/// Positional constructor so that the tables read like the reference tables.
#[allow(clippy::too_many_arguments)]
pub(super) const fn profile(
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

/// Every known model, by family.
static MODELS: [GpuModel; 15] = [
    ampere::A100_40GB,
    ampere::A100_80GB,
    ampere::PG506_96GB,
    ampere::A30,
    hopper::H100_80GB,
    hopper::H100_94GB,
    hopper::H100_96GB,
    hopper::H20,
    hopper::H200,
    hopper::GH200_144GB,
    blackwell::B200,
    blackwell::GB200,
    blackwell::B300,
    blackwell::GB300,
    blackwell::RTX_PRO_6000,
];

/// Every model in the catalog.
#[must_use]
pub fn models() -> &'static [GpuModel] {
    &MODELS
}

/// The model the simulator calls `name` (`a100-40gb`, `h100-80gb`, `b200`, ...).
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
mod tests;
