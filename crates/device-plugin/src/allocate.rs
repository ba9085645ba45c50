//! The answer to one container's Allocate: how the allocated devices reach the container (environment, volume
//! mounts, CDI names, device nodes) and, for MPS replicas, the per-replica limits. Pure: the server looks the
//! resource up and passes it in.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crd::config::device_plugin::{
    DeviceIdStrategy, DeviceListStrategy, DevicePluginConfig, ResourceName, SharingStrategy,
};

use crate::api::{CdiDevice, ContainerAllocateResponse, DeviceSpec, Mount};
use crate::cdi;
use crate::plan::{Device, Resource};

/// The variable the NVIDIA container runtime reads the devices from.
pub const VISIBLE_DEVICES_ENV: &str = "NVIDIA_VISIBLE_DEVICES";
/// Where the volume-mounts strategy puts one empty file per device.
pub const CONTAINER_DEVICES_DIR: &str = "/var/run/nvidia-container-devices";
pub use node_runtime::mps::{
    MEMORY_LIMIT_ENV as MPS_MEMORY_LIMIT_ENV, PIPE_ENV as MPS_PIPE_ENV,
    THREADS_ENV as MPS_THREADS_ENV,
};
/// The CDI annotation prefix NVIDIA's plugin uses unless configured.
const DEFAULT_CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// How Allocate answers, from the config's plugin flags and the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocateSettings {
    /// How devices reach the container; never empty.
    pub list_strategies: Vec<DeviceListStrategy>,
    /// Whether devices are named by UUID or index.
    pub id_strategy: DeviceIdStrategy,
    /// Whether `/dev/nvidia*` device nodes are passed to the kubelet.
    pub pass_device_specs: bool,
    /// Annotation prefix of the `cdi-annotations` strategy.
    pub cdi_annotation_prefix: String,
    /// Host directory under which each MPS resource keeps its control daemon's pipes.
    pub mps_root: PathBuf,
}

impl AllocateSettings {
    /// The settings `config` asks for. Without a `deviceListStrategy` in the config, devices go by
    /// `NVIDIA_VISIBLE_DEVICES`, and also by CDI name when `cdi` (the operator's `--cdi`) is on, so that runtimes
    /// with and without CDI support both work.
    #[must_use]
    pub fn new(config: &DevicePluginConfig, cdi: bool, mps_root: &Path) -> Self {
        let plugin = config
            .flags
            .as_ref()
            .and_then(|flags| flags.plugin.clone())
            .unwrap_or_default();
        let list_strategies = if plugin.device_list_strategy.is_empty() {
            let mut strategies = vec![DeviceListStrategy::Envvar];
            if cdi {
                strategies.push(DeviceListStrategy::CdiCri);
            }
            strategies
        } else {
            plugin.device_list_strategy
        };
        Self {
            list_strategies,
            id_strategy: plugin.device_id_strategy.unwrap_or(DeviceIdStrategy::Uuid),
            pass_device_specs: plugin.pass_device_specs.unwrap_or(false),
            cdi_annotation_prefix: plugin
                .cdi_annotation_prefix
                .unwrap_or_else(|| DEFAULT_CDI_ANNOTATION_PREFIX.to_owned()),
            mps_root: mps_root.to_owned(),
        }
    }

    /// Whether a CDI spec must exist for the answers to work.
    #[must_use]
    pub fn uses_cdi(&self) -> bool {
        self.list_strategies.iter().any(|strategy| {
            matches!(
                strategy,
                DeviceListStrategy::CdiCri | DeviceListStrategy::CdiAnnotations
            )
        })
    }

    fn uses(&self, strategy: DeviceListStrategy) -> bool {
        self.list_strategies.contains(&strategy)
    }
}

/// Why an Allocate request fails. The texts are what `kubectl describe pod` shows under the failed admission.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    /// A device the resource does not (or no longer) advertise.
    #[error("unknown device {device} for resource {resource}")]
    UnknownDevice {
        /// The resource.
        resource: ResourceName,
        /// The device ID asked for.
        device: String,
    },
    /// More than one replica of a resource that allows one per container (NVIDIA's message).
    #[error(
        "request for '{resource}: {count}' too large: maximum request size for shared resources is 1"
    )]
    TooLarge {
        /// The resource.
        resource: ResourceName,
        /// Replicas asked for.
        count: usize,
    },
}

/// The answer for one container that was given the devices `ids` of `resource`.
///
/// # Errors
/// [`AllocateError`] for an unknown device, or several replicas where only one is allowed.
pub fn allocate(
    name: &ResourceName,
    resource: &Resource,
    settings: &AllocateSettings,
    ids: &[String],
) -> Result<ContainerAllocateResponse, AllocateError> {
    let devices = ids
        .iter()
        .map(|id| {
            resource
                .devices
                .iter()
                .find(|device| &device.id == id)
                .ok_or_else(|| AllocateError::UnknownDevice {
                    resource: name.clone(),
                    device: id.clone(),
                })
        })
        .collect::<Result<Vec<&Device>, _>>()?;
    if ids.len() > 1
        && resource
            .shared
            .is_some_and(|shared| shared.fail_requests_greater_than_one)
    {
        return Err(AllocateError::TooLarge {
            resource: name.clone(),
            count: ids.len(),
        });
    }
    // Replicas of one GPU are one device to the container.
    let mut physical: Vec<&Device> = Vec::new();
    for device in devices {
        if !physical.iter().any(|seen| seen.uuid == device.uuid) {
            physical.push(device);
        }
    }
    let names: Vec<String> = physical
        .iter()
        .map(|device| device_name(device, settings.id_strategy))
        .collect();

    let mut response = ContainerAllocateResponse::default();
    if settings.uses(DeviceListStrategy::Envvar) {
        response
            .envs
            .insert(VISIBLE_DEVICES_ENV.into(), names.join(","));
    }
    if settings.uses(DeviceListStrategy::VolumeMounts) {
        if !settings.uses(DeviceListStrategy::Envvar) {
            response
                .envs
                .insert(VISIBLE_DEVICES_ENV.into(), CONTAINER_DEVICES_DIR.into());
        }
        response.mounts.extend(names.iter().map(|device| Mount {
            container_path: format!("{CONTAINER_DEVICES_DIR}/{device}"),
            host_path: "/dev/null".into(),
            read_only: true,
        }));
    }
    let cdi_names: Vec<String> = physical
        .iter()
        .map(|device| cdi::qualified_name(&device.uuid))
        .collect();
    if settings.uses(DeviceListStrategy::CdiCri) {
        response.cdi_devices.extend(
            cdi_names
                .iter()
                .map(|name| CdiDevice { name: name.clone() }),
        );
    }
    if settings.uses(DeviceListStrategy::CdiAnnotations) {
        let key = format!(
            "{}nvidia-device-plugin_{}",
            settings.cdi_annotation_prefix,
            name.short_name()
        );
        response.annotations.insert(key, cdi_names.join(","));
    }
    if settings.pass_device_specs {
        response.devices = device_specs(&physical);
    }
    if resource
        .shared
        .is_some_and(|shared| shared.strategy == SharingStrategy::Mps)
    {
        add_mps_limits(&mut response, name, &physical, &settings.mps_root);
    }
    Ok(response)
}

/// A device as `NVIDIA_VISIBLE_DEVICES` and the volume mounts name it: its UUID, or `<gpu>` / `<gpu>:<mig>`.
fn device_name(device: &Device, strategy: DeviceIdStrategy) -> String {
    match (strategy, device.mig_index) {
        (DeviceIdStrategy::Uuid, _) => device.uuid.clone(),
        (DeviceIdStrategy::Index, None) => device.gpu_index.to_string(),
        (DeviceIdStrategy::Index, Some(mig)) => format!("{}:{mig}", device.gpu_index),
    }
}

/// The device nodes a container needs for these devices: the control nodes and each GPU's own node (a MIG
/// device's parent GPU).
fn device_specs(devices: &[&Device]) -> Vec<DeviceSpec> {
    let mut gpus: Vec<u32> = devices.iter().map(|device| device.gpu_index).collect();
    gpus.sort_unstable();
    gpus.dedup();
    cdi::device_nodes(&gpus)
        .into_iter()
        .map(|path| DeviceSpec {
            container_path: path.clone(),
            host_path: path,
            permissions: "rw".into(),
        })
        .collect()
}

/// The MPS client limits of one replica: its share of each device's memory and of the SMs, and the control
/// daemon's pipe directory. The limits are what gives MPS replicas memory isolation, which time-slicing lacks.
fn add_mps_limits(
    response: &mut ContainerAllocateResponse,
    name: &ResourceName,
    devices: &[&Device],
    root: &Path,
) {
    let replicated: Vec<&&Device> = devices
        .iter()
        .filter(|device| device.replicas > 1)
        .collect();
    let Some(most_replicas) = replicated.iter().map(|device| device.replicas).max() else {
        return;
    };
    let limits: Vec<String> = replicated
        .iter()
        .map(|device| {
            format!(
                "{}={}M",
                device.uuid,
                device.memory_mib / u64::from(device.replicas)
            )
        })
        .collect();
    let pipe = mps_pipe_dir(root, name);
    let container_pipe = mps_pipe_dir(Path::new("/mps"), name);
    let envs = BTreeMap::from([
        (MPS_MEMORY_LIMIT_ENV.to_owned(), limits.join(",")),
        (
            MPS_THREADS_ENV.to_owned(),
            (100 / most_replicas).to_string(),
        ),
        (
            MPS_PIPE_ENV.to_owned(),
            container_pipe.display().to_string(),
        ),
    ]);
    response.envs.extend(envs);
    response.mounts.push(Mount {
        container_path: container_pipe.display().to_string(),
        host_path: pipe.display().to_string(),
        read_only: false,
    });
}

/// The pipe directory of a resource's MPS control daemon under `root`: `<root>/<resource short name>/pipe`.
#[must_use]
pub fn mps_pipe_dir(root: &Path, name: &ResourceName) -> PathBuf {
    root.join(name.short_name()).join("pipe")
}

#[cfg(test)]
#[path = "allocate_tests.rs"]
mod tests;
