//! The DRA driver's part of GPUNode status (pure): each published device with what the claims prepared on this node
//! hold of it, so `kubectl get gpunode -o yaml` answers "how much of this GPU is left".

use crd::gpu_node::{DraDevice, DraStatus};

use crate::claims::Checkpoint;
use crate::slices::DriverDevice;

/// What enforces shared claims' limits on this node; `driver_limits`: the toolkit's memory-limit hook is in use
/// (devices show which of them it holds, `memoryEnforcement`).
#[must_use]
pub fn enforcement(starts_mps: bool, driver_limits: bool) -> &'static str {
    match (starts_mps, driver_limits) {
        (true, false) => {
            "MPS: one control daemon per claim on a shared GPU, with the claim's memory and cores as its client defaults"
        }
        (true, true) => {
            "driver and MPS: on R615+ GPUs the driver holds each claim's containers to its memory (the container \
             toolkit's hook) and a control daemon per claim shares the SMs; elsewhere the daemon holds both"
        }
        (false, _) => {
            "none: simulated GPUs, no MPS control daemon is started; containers still get the limits in their environment"
        }
    }
}

/// The status of `devices` given the prepared claims.
#[must_use]
pub fn status(
    devices: &[DriverDevice],
    prepared: &Checkpoint,
    starts_mps: bool,
    memory_limit_hook: Option<&std::path::Path>,
    warnings: Vec<String>,
) -> DraStatus {
    let devices = devices
        .iter()
        .map(|device| {
            let holders: Vec<_> = prepared
                .claims
                .values()
                .flat_map(|claim| &claim.devices)
                .filter(|held| held.device == device.name)
                .collect();
            let (memory, cores) = if device.shared {
                holders
                    .iter()
                    .filter_map(|held| held.limits.as_ref())
                    .fold((0, 0), |(memory, cores), limits| {
                        (memory + limits.memory_mib, cores + limits.cores)
                    })
            } else if holders.is_empty() {
                (0, 0)
            } else {
                (device.memory_mib, crd::dra::CORES_TOTAL)
            };
            DraDevice {
                name: device.name.clone(),
                gpu: device.gpu_index,
                uuid: device.uuid.clone(),
                shared: device.shared,
                claims: u32::try_from(holders.len()).unwrap_or(u32::MAX),
                memory_mib: device.memory_mib,
                memory_allocated_mib: memory,
                memory_free_mib: device.memory_mib.saturating_sub(memory),
                cores_allocated: cores,
                cores_free: crd::dra::CORES_TOTAL.saturating_sub(cores),
                memory_enforcement: device.shared.then(|| {
                    crate::claims::memory_enforcement(device, memory_limit_hook.is_some())
                }),
                unhealthy: crate::health::unhealthy_reason(device),
            }
        })
        .collect();
    DraStatus {
        devices,
        enforcement: enforcement(starts_mps, memory_limit_hook.is_some()).to_owned(),
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use crd::dra::{GpuSet, Partition};
    use node_runtime::testing::simulated;

    use super::*;
    use crate::cdi::{PreparedDevice, ShareLimits};
    use crate::claims::PreparedClaim;
    use crate::slices;

    fn held(device: &str, limits: Option<(u64, u64)>) -> PreparedClaim {
        PreparedClaim {
            namespace: "team".into(),
            name: "claim".into(),
            devices: vec![PreparedDevice {
                requests: vec!["gpu".into()],
                pool: "node-1".into(),
                device: device.into(),
                share_id: None,
                uuid: "GPU-x".into(),
                device_nodes: vec![],
                limits: limits.map(|(memory_mib, cores)| ShareLimits {
                    memory_mib,
                    cores,
                    mps_dir: PathBuf::new(),
                    enforcement: crd::dra::MemoryEnforcement::MpsPinned,
                }),
                on_demand: None,
                mig_instance: None,
            }],
        }
    }

    #[test]
    fn shared_gpus_show_the_sum_of_their_claims_and_whole_gpus_all_or_nothing() {
        let (_dir, simulator) = simulated("a100-40gb:3", &[]);
        let views = node_runtime::inventory::read(simulator.as_ref()).unwrap();
        let mut devices = slices::devices(
            &views,
            &Partition {
                dra: GpuSet::All,
                shared: "1".parse().unwrap(),
                dynamic_mig: GpuSet::None,
            },
            &[],
        );
        crate::health::taint_unhealthy(&mut devices, &[(2, Some(79))].into());
        let prepared = Checkpoint {
            claims: [
                ("a".to_owned(), held("gpu-1", Some((3000, 30)))),
                ("b".to_owned(), held("gpu-1", Some((3000, 0)))),
                ("c".to_owned(), held("gpu-0", None)),
            ]
            .into(),
            ..Checkpoint::default()
        };
        let status = status(&devices, &prepared, false, None, vec![]);
        let by_name = |name: &str| status.devices.iter().find(|d| d.name == name).unwrap();
        let shared = by_name("gpu-1");
        assert_eq!(
            (
                shared.claims,
                shared.memory_allocated_mib,
                shared.memory_free_mib
            ),
            (2, 6000, 34960)
        );
        assert_eq!((shared.cores_allocated, shared.cores_free), (30, 70));
        let whole = by_name("gpu-0");
        assert_eq!((whole.memory_free_mib, whole.cores_free), (0, 0));
        let idle = by_name("gpu-2");
        assert_eq!((idle.claims, idle.memory_free_mib), (0, 40960));
        assert_eq!(
            idle.unhealthy.as_deref(),
            Some("GPU 2 reported critical XID 79")
        );
        assert_eq!(shared.unhealthy, None);
        assert!(status.enforcement.starts_with("none: simulated GPUs"));
        // The simulator's default driver (R570) cannot cap cgroups: MPS holds the shared GPU's claims even with the
        // toolkit's hook installed; whole GPUs have nothing to enforce.
        let hook = std::path::Path::new("/usr/local/nvidia/toolkit/nvidia-cdi-hook");
        let with_hook = super::status(&devices, &prepared, true, Some(hook), vec![]);
        let by_name = |name: &str| with_hook.devices.iter().find(|d| d.name == name).unwrap();
        assert_eq!(
            by_name("gpu-1").memory_enforcement,
            Some(crd::dra::MemoryEnforcement::MpsPinned)
        );
        assert_eq!(by_name("gpu-0").memory_enforcement, None);
        assert!(with_hook.enforcement.starts_with("driver and MPS"));
    }
}
