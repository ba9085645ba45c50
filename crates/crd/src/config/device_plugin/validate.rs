//! The checks types cannot express: rules across the entries of a list.

use std::collections::BTreeMap;

use super::{DevicePluginConfig, MAX_MPS_REPLICAS, ReplicatedResources, ResourceName};
use crate::config::ConfigError;

/// Checks a typed config; returns the first problem in document order of sections.
pub(super) fn validate(config: &DevicePluginConfig) -> Result<(), ConfigError> {
    if let Some(resources) = &config.resources {
        for (list, mappings) in [("gpus", &resources.gpus), ("mig", &resources.mig)] {
            if let Some(index) = mappings
                .iter()
                .position(|mapping| mapping.pattern.is_empty())
            {
                return Err(ConfigError::invalid(
                    format!("resources.{list}[{index}].pattern"),
                    "must not be empty (use \"*\" to match every product)",
                ));
            }
        }
    }
    if let Some(sharing) = &config.sharing {
        for (section, shared) in [
            ("timeSlicing", &sharing.time_slicing),
            ("mps", &sharing.mps),
        ] {
            if let Some(shared) = shared {
                validate_shared(&format!("sharing.{section}.resources"), shared)?;
            }
        }
        if let Some(mps) = &sharing.mps
            && let Some(index) = mps
                .resources
                .iter()
                .position(|resource| resource.replicas > MAX_MPS_REPLICAS)
        {
            return Err(ConfigError::invalid(
                format!("sharing.mps.resources[{index}].replicas"),
                format!(
                    "{} is too large for MPS, replicas must be at most {MAX_MPS_REPLICAS} (each replica gets a whole \
                     percent of the GPU's threads); use time-slicing for more",
                    mps.resources[index].replicas
                ),
            ));
        }
    }
    if let Some(imex) = &config.imex
        && !matches!(imex.channel_ids.as_slice(), [] | [0])
    {
        return Err(ConfigError::invalid(
            "imex.channelIDs",
            "only channel 0 is supported: write [0], or leave channelIDs out",
        ));
    }
    Ok(())
}

/// Each resource is replicated once, and no two replicated resources are advertised under one name (the kubelet
/// would see one resource with the devices of both).
fn validate_shared(path: &str, shared: &ReplicatedResources) -> Result<(), ConfigError> {
    let mut names: BTreeMap<&ResourceName, usize> = BTreeMap::new();
    let mut advertised: BTreeMap<ResourceName, usize> = BTreeMap::new();
    for (index, resource) in shared.resources.iter().enumerate() {
        let at = format!("{path}[{index}]");
        if let Some(first) = names.insert(&resource.name, index) {
            return Err(ConfigError::invalid(
                format!("{at}.name"),
                format!(
                    "\"{}\" is already shared by resources[{first}]; list each resource once",
                    resource.name
                ),
            ));
        }
        if resource.rename.is_none() && shared.rename_by_default && resource.name.shared().is_err()
        {
            return Err(ConfigError::invalid(
                format!("{at}.name"),
                format!(
                    "\"{}.shared\" (the renameByDefault name) is longer than 63 characters; use a shorter rename",
                    resource.name
                ),
            ));
        }
        let name = shared.advertised_name(resource);
        let field = if resource.rename.is_some() {
            "rename"
        } else {
            "name"
        };
        if let Some(first) = advertised.get(&name) {
            return Err(ConfigError::invalid(
                format!("{at}.{field}"),
                format!(
                    "\"{name}\" is already advertised by resources[{first}]; give each resource its own name"
                ),
            ));
        }
        advertised.insert(name, index);
    }
    Ok(())
}
