//! Hopper parts (GH100, compute capability 9.0): H100, H800, H20, H200 and the Grace Hopper superchips. All have
//! the A100's slice structure (7 compute, 8 memory slices) and so its profile ids, counts and placements.

use super::{
    ComputeCapability, GpuModel, SevenSliceSizes, even_sms, seven_slice_layout, sms_per_slice,
};

/// GH100.
const HOPPER: ComputeCapability = ComputeCapability { major: 9, minor: 0 };

/// SMs of the H100 80GB's profiles, from the reference; the other 132-SM parts are given the same (derived).
const GH100_132_SMS: [u32; 7] = [16, 16, 26, 32, 60, 64, 132];

/// H100 80GB (SXM5 and PCIe) and H800 80GB (SXM and PCIe); `sources` says where each value comes from.
pub(super) const H100_80GB: GpuModel = GpuModel {
    simulator_name: "h100-80gb",
    sources: "From the reference: names, ids, counts, SMs except `1g.10gb+me`, and memory of `1g.10gb` (9.75 GiB = \
        9984 MiB), `1g.20gb` (19.62 GiB, NVML's 20096 MiB), `3g.40gb` (39.5 GiB = 40448 MiB) and `7g.80gb` \
        (79.25 GiB = 81152 MiB). From NVIDIA's default config: the PCIe and H800 ids take the same profiles. \
        Derived: `1g.10gb+me` has the SMs and memory of `1g.10gb`; `2g.20gb` and `4g.40gb` have the memory \
        of the profiles with the same memory slices; placements are the A100's (the reference says to assume \
        them until verified on hardware); the PCIe parts' 114 SMs are not modelled (the simulator reports \
        the SXM5 part).",
    product_names: &[
        "NVIDIA H100 80GB HBM3",
        "NVIDIA H100 PCIe",
        "NVIDIA H800 PCIe",
        "NVIDIA H800",
    ],
    pci_device_ids: &[0x2330_10DE, 0x2331_10DE, 0x2322_10DE, 0x2324_10DE],
    memory_mib: 81559,
    compute_capability: HOPPER,
    sm_count: 132,
    compute_slices: 7,
    memory_slices: 8,
    profiles: &seven_slice_layout(SevenSliceSizes {
        memory_gb: [10, 20, 40, 80],
        memory_mib: [9984, 20096, 40448, 81152],
        sm_count: GH100_132_SMS,
    }),
};

/// H100 NVL and H800 NVL, 94 GB; `sources` says where each value comes from.
pub(super) const H100_94GB: GpuModel = GpuModel {
    simulator_name: "h100-94gb",
    sources: "From the MIG user guide: 94 GB, 7 instances at most. From NVIDIA's default config: ids and names \
        (`1g.12gb`, `1g.12gb+me`, `1g.24gb`, `2g.24gb`, `3g.47gb`, `4g.47gb`, `7g.94gb`) and counts. \
        Derived: SMs as the H100 80GB (same 132-SM die); memory per slice by the catalog's rule from 94 GiB.",
    product_names: &["NVIDIA H100 NVL", "NVIDIA H800 NVL"],
    pci_device_ids: &[0x2321_10DE, 0x233A_10DE],
    memory_mib: 96256,
    compute_capability: HOPPER,
    sm_count: 132,
    compute_slices: 7,
    memory_slices: 8,
    profiles: &seven_slice_layout(SevenSliceSizes::derived(
        [12, 24, 47, 94],
        96256,
        GH100_132_SMS,
    )),
};

/// H100 96GB and the H100 of GH200 480GB; `sources` says where each value comes from.
pub(super) const H100_96GB: GpuModel = GpuModel {
    simulator_name: "h100-96gb",
    sources: "From the MIG user guide: 96 GB, 7 instances at most. From NVIDIA's default config: ids and names \
        (`1g.12gb`, `1g.24gb`, `2g.24gb`, `3g.48gb`, `4g.48gb`, `7g.96gb`). Derived: SMs as the H100 80GB; \
        memory per slice by the catalog's rule from 96 GiB.",
    product_names: &["NVIDIA H100 96GB HBM3", "NVIDIA GH200 480GB"],
    pci_device_ids: &[0x233D_10DE, 0x2342_10DE],
    memory_mib: 98304,
    compute_capability: HOPPER,
    sm_count: 132,
    compute_slices: 7,
    memory_slices: 8,
    profiles: &seven_slice_layout(SevenSliceSizes::derived(
        [12, 24, 48, 96],
        98304,
        GH100_132_SMS,
    )),
};

/// H20, 96 GB; `sources` says where each value comes from.
pub(super) const H20: GpuModel = GpuModel {
    simulator_name: "h20",
    sources: "From the MIG user guide: 96 GB, 7 instances at most. From NVIDIA's default config: its id, grouped \
        with the 96 GB parts (same names). Derived: 78 SMs in all and SMs per slice by the catalog's rule; \
        memory as the H100 96GB.",
    product_names: &["NVIDIA H20"],
    pci_device_ids: &[0x2329_10DE],
    memory_mib: 98304,
    compute_capability: HOPPER,
    sm_count: 78,
    compute_slices: 7,
    memory_slices: 8,
    profiles: &seven_slice_layout(SevenSliceSizes::derived(
        [12, 24, 48, 96],
        98304,
        even_sms(sms_per_slice(78, 7)),
    )),
};

/// H200 141GB and H200 NVL; `sources` says where each value comes from.
pub(super) const H200: GpuModel = GpuModel {
    simulator_name: "h200",
    sources: "From the reference: names, max instances and the slice structure; from NVIDIA's default config: the \
        NVL id takes the same `all-balanced`. Derived: ids, NVML indices and placements as the A100/H100 \
        layout; SMs as the H100 (same GH100 die, 132 SMs); memory as 17.5 GiB (17920 MiB) per memory slice, \
        which keeps the `<GB>` of every name consistent with NVML's rounding of a fraction of 141 GB.",
    product_names: &["NVIDIA H200", "NVIDIA H200 NVL"],
    pci_device_ids: &[0x2335_10DE, 0x233B_10DE],
    memory_mib: 143_771,
    compute_capability: HOPPER,
    sm_count: 132,
    compute_slices: 7,
    memory_slices: 8,
    profiles: &seven_slice_layout(SevenSliceSizes {
        memory_gb: [18, 35, 71, 141],
        memory_mib: [17_920, 35_840, 71_680, 143_360],
        sm_count: GH100_132_SMS,
    }),
};

/// GH200 144G HBM3e; `sources` says where each value comes from.
pub(super) const GH200_144GB: GpuModel = GpuModel {
    simulator_name: "gh200-144gb",
    sources: "From NVIDIA's default config: its id and names (`1g.18gb`, `1g.18gb+me`, `1g.36gb`, `2g.36gb`, \
        `3g.72gb`, `4g.72gb`, `7g.144gb`) and counts. Derived: SMs as the H100 80GB; memory per slice by the \
        catalog's rule from 144 GiB.",
    product_names: &["NVIDIA GH200 144G HBM3e"],
    pci_device_ids: &[0x2348_10DE],
    memory_mib: 147_456,
    compute_capability: HOPPER,
    sm_count: 132,
    compute_slices: 7,
    memory_slices: 8,
    profiles: &seven_slice_layout(SevenSliceSizes::derived(
        [18, 36, 72, 144],
        147_456,
        GH100_132_SMS,
    )),
};
