//! Reads a real node's GPUs through the NVML backend, read-only, and compares what they report with the MIG
//! catalog the simulator and the MIG manager use.
//!
//! It calls every reading of the `GpuBackend` trait (inventory, details, telemetry, processes, XID events, MIG
//! profiles and placements, and on GPUs with MIG on their instances and devices) and nothing that changes a GPU:
//! no MIG mode, no instance, no reset. For each GPU the catalog knows, each profile's id, slices, instance count,
//! memory, multiprocessors and placements are checked against NVML, and every profile NVML offers that the catalog
//! lacks is named. Exits 1 when anything disagrees or a reading fails, so that a run on new hardware says plainly
//! whether the simulator models it.
//!
//! `cargo run --release -p gpu --example nvml_probe` on a machine with an NVIDIA driver.

use std::collections::BTreeSet;
use std::process::ExitCode;

use crd::mig::GpuModel;
use gpu::nvml::NvmlBackend;
use gpu::{GPU_INSTANCE_PROFILE_INDEX_COUNT, GpuBackend, GpuError, types::Placement};

/// What a probe found wrong, one line each.
#[derive(Default)]
struct Findings(Vec<String>);

impl Findings {
    fn disagree(&mut self, what: String) {
        println!("  DISAGREES {what}");
        self.0.push(what);
    }

    /// Prints a reading, or records its failure.
    fn reading<T: std::fmt::Debug>(&mut self, label: &str, result: gpu::Result<T>) -> Option<T> {
        match result {
            Ok(value) => {
                println!("  {label}: {value:?}");
                Some(value)
            }
            Err(error) => {
                self.disagree(format!("{label}: reading failed: {error}"));
                None
            }
        }
    }
}

fn main() -> ExitCode {
    let backend = match NvmlBackend::new() {
        Ok(backend) => backend,
        Err(error) => {
            eprintln!("cannot open NVML: {error}");
            return ExitCode::FAILURE;
        }
    };
    let mut findings = Findings::default();
    let Some(gpus) = findings.reading("GPUs", backend.gpus()) else {
        return ExitCode::FAILURE;
    };
    findings.reading("XID events waiting", backend.health_events());
    for inventory in &gpus {
        let gpu = inventory.index;
        println!("GPU {gpu}: {} ({})", inventory.product_name, inventory.uuid);
        findings.reading("details", backend.details(gpu));
        findings.reading("telemetry", backend.telemetry(gpu));
        findings.reading("processes", backend.processes(gpu));
        let Some(model) = inventory.model() else {
            println!(
                "  not in the MIG catalog (PCI device id {:#010x})",
                inventory.pci_device_id
            );
            continue;
        };
        println!("  catalog model: {}", model.simulator_name);
        compare_identity(&mut findings, inventory, model);
        compare_profiles(&mut findings, &backend, inventory, model);
        if inventory.mig_mode.is_some_and(|mode| mode.current) {
            findings.reading("GPU instances", backend.gpu_instances(gpu));
            findings.reading("MIG devices", backend.mig_devices(gpu));
        }
    }
    if findings.0.is_empty() {
        println!("every reading succeeded and agrees with the catalog");
        ExitCode::SUCCESS
    } else {
        println!("{} disagreement(s):", findings.0.len());
        for finding in &findings.0 {
            println!("- {finding}");
        }
        ExitCode::FAILURE
    }
}

/// The whole GPU: memory (the catalog's is the board's; NVML reports slightly less on some boards, so only a
/// difference over 2 % counts), compute capability and, with MIG off, multiprocessors.
fn compare_identity(
    findings: &mut Findings,
    inventory: &gpu::types::GpuInventory,
    model: &GpuModel,
) {
    let gpu = inventory.index;
    let memory_gap = inventory.memory_mib.abs_diff(model.memory_mib);
    if memory_gap * 50 > model.memory_mib {
        findings.disagree(format!(
            "GPU {gpu}: memory {} MiB, catalog {} MiB",
            inventory.memory_mib, model.memory_mib
        ));
    }
    if inventory.compute_capability != model.compute_capability {
        findings.disagree(format!(
            "GPU {gpu}: compute capability {}, catalog {}",
            inventory.compute_capability, model.compute_capability
        ));
    }
    let mig_on = inventory.mig_mode.is_some_and(|mode| mode.current);
    if let (false, Some(count)) = (mig_on, inventory.multiprocessor_count)
        && count != model.sm_count
    {
        findings.disagree(format!(
            "GPU {gpu}: {count} multiprocessors, catalog {}",
            model.sm_count
        ));
    }
}

/// Every catalog profile against NVML's answer for its constant, and every constant NVML answers that the catalog
/// lacks.
fn compare_profiles(
    findings: &mut Findings,
    backend: &NvmlBackend,
    inventory: &gpu::types::GpuInventory,
    model: &GpuModel,
) {
    let gpu = inventory.index;
    let mig_on = inventory.mig_mode.is_some_and(|mode| mode.current);
    let mut answered = BTreeSet::new();
    for nvml_index in 0..GPU_INSTANCE_PROFILE_INDEX_COUNT {
        let info = match backend.gpu_instance_profile(gpu, nvml_index) {
            Ok(info) => info,
            Err(GpuError::NotSupported(_) | GpuError::InvalidArgument(_)) => continue,
            Err(error) => {
                findings.disagree(format!(
                    "GPU {gpu}: profile constant {nvml_index}: reading failed: {error}"
                ));
                continue;
            }
        };
        answered.insert(nvml_index);
        println!("  profile constant {nvml_index}: {info:?}");
        let Some(profile) = model
            .profiles
            .iter()
            .find(|profile| profile.nvml_index == nvml_index)
        else {
            findings.disagree(format!(
                "GPU {gpu}: NVML offers profile constant {nvml_index} (id {}, {} slices, {} MiB), the catalog has none",
                info.id, info.slice_count, info.memory_mib
            ));
            continue;
        };
        let catalog = (
            profile.id,
            u32::from(profile.name.slices),
            profile.max_instances,
            profile.memory_mib,
            profile.sm_count,
        );
        let reported = (
            info.id,
            info.slice_count,
            info.instance_count,
            info.memory_mib,
            info.multiprocessor_count,
        );
        if catalog != reported {
            findings.disagree(format!(
                "GPU {gpu}: {} (id, slices, instances, MiB, SMs): catalog {catalog:?}, NVML {reported:?}",
                profile.name
            ));
        }
        match backend.gpu_instance_placements(gpu, info.id) {
            Ok(placements) => {
                let catalog: Vec<Placement> = Placement::of_profile(profile).collect();
                if placements != catalog {
                    findings.disagree(format!(
                        "GPU {gpu}: {} placements: catalog {catalog:?}, NVML {placements:?}",
                        profile.name
                    ));
                }
            }
            // Placements are only offered with MIG on; say so rather than count it against the catalog.
            Err(GpuError::NotSupported(reason)) => {
                println!("  {} placements: not offered ({reason})", profile.name);
            }
            Err(error) => findings.disagree(format!(
                "GPU {gpu}: {} placements: reading failed: {error}",
                profile.name
            )),
        }
    }
    if answered.is_empty() && !mig_on {
        println!("  MIG is off: NVML offers no GPU-instance profile to compare");
        return;
    }
    for profile in model.profiles {
        if !answered.contains(&profile.nvml_index) {
            findings.disagree(format!(
                "GPU {gpu}: catalog profile {} (constant {}) is not offered by NVML",
                profile.name, profile.nvml_index
            ));
        }
    }
}
