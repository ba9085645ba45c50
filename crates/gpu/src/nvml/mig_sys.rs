//! The MIG calls the safe `nvml-wrapper` API lacks (GPU and compute instances), made directly on the NVML library
//! that `nvml-wrapper` loaded. With `fields_sys`, the only modules of the workspace with `unsafe` code; raw instance
//! handles never leave it, so the rest of the backend deals in ids.
//!
//! Also the GPU-instance possible placements, because `nvml-wrapper`'s `Device::possible_placements` (0.13) is
//! defective: it allocates its output buffer with `Vec::with_capacity(count)`, lets NVML write into the spare
//! capacity, and never sets the vector's length, so it always returns an empty list (and the written elements are
//! never read). [`possible_placements`] allocates `count` initialised elements instead, and keeps as many as the
//! second call reports.
//!
//! Function symbols are taken from the library's symbol table as `Result`s rather than through the bindings'
//! convenience methods, which panic when the installed driver lacks a symbol; we report `NotSupported` instead.

#![allow(unsafe_code)]

use std::fmt::Display;
use std::mem;
use std::os::raw::c_uint;
use std::ptr;

use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, NVML_COMPUTE_INSTANCE_PROFILE_COUNT,
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstanceProfileInfo_t,
    nvmlDevice_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT, nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
};

use super::error::check;
use crate::error::{GpuError, Result};
use crate::types::{ComputeInstance, GpuInstance, Placement};

/// A function of the loaded library, or `NotSupported` when the driver's NVML does not export it.
pub(super) fn symbol<'lib, F, E: Display>(
    slot: &'lib std::result::Result<F, E>,
    name: &str,
) -> Result<&'lib F> {
    slot.as_ref().map_err(|error| {
        GpuError::NotSupported(format!(
            "the installed driver's NVML lacks {name}, a newer driver is needed ({error})"
        ))
    })
}

/// The raw handle of a device.
pub(super) fn raw(device: &Device<'_>) -> nvmlDevice_t {
    // SAFETY: `handle` is unsafe only so that the pointer is not used carelessly; it stays valid as long as the
    // `Device` (and so the `Nvml` it borrows) lives, and every use below is within that borrow.
    unsafe { device.handle() }
}

/// Keeps the first `reported` elements of a buffer NVML filled (never more than it holds).
fn filled<T>(mut buffer: Vec<T>, reported: c_uint) -> Vec<T> {
    buffer.truncate(reported as usize);
    buffer
}

/// Every placement a GPU instance of `profile_id` may take.
pub(super) fn possible_placements(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_id: u32,
) -> Result<Vec<Placement>> {
    let get = symbol(
        &nvml.lib().nvmlDeviceGetGpuInstancePossiblePlacements_v2,
        "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
    )?;
    let context = || format!("listing placements of GPU-instance profile {profile_id}");
    let mut count: c_uint = 0;
    // SAFETY: NVML documents a NULL `placements` as the way to ask for the count; `count` is a valid out-pointer.
    check(
        unsafe { get(raw(device), profile_id, ptr::null_mut(), &mut count) },
        context,
    )?;
    let mut buffer = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    let mut reported = count;
    // SAFETY: `buffer` holds `count` initialised elements, as many as NVML just said the profile has, which is the
    // size NVML requires; `reported` is a valid out-pointer.
    check(
        unsafe { get(raw(device), profile_id, buffer.as_mut_ptr(), &mut reported) },
        context,
    )?;
    Ok(filled(buffer, reported)
        .into_iter()
        .map(placement)
        .collect())
}

/// Our placement from NVML's.
fn placement(raw: nvmlGpuInstancePlacement_t) -> Placement {
    Placement {
        start: raw.start,
        size: raw.size,
    }
}

/// Id, profile and placement of a GPU instance.
fn gpu_instance_info(nvml: &Nvml, instance: nvmlGpuInstance_t) -> Result<GpuInstance> {
    let get = symbol(&nvml.lib().nvmlGpuInstanceGetInfo, "nvmlGpuInstanceGetInfo")?;
    // SAFETY: the struct holds integers and raw pointers only, for which all-zero bytes are valid values.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { mem::zeroed() };
    // SAFETY: `instance` came from NVML for a live device; `info` is a valid out-pointer.
    check(unsafe { get(instance, &mut info) }, || {
        "reading a GPU instance".to_owned()
    })?;
    Ok(GpuInstance {
        id: info.id,
        profile_id: info.profileId,
        placement: placement(info.placement),
    })
}

/// The GPU instances of one profile; `capacity` is the profile's instance count, the buffer size NVML requires.
pub(super) fn gpu_instances(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_id: u32,
    capacity: u32,
) -> Result<Vec<GpuInstance>> {
    if capacity == 0 {
        return Ok(Vec::new());
    }
    let get = symbol(
        &nvml.lib().nvmlDeviceGetGpuInstances,
        "nvmlDeviceGetGpuInstances",
    )?;
    let mut handles: Vec<nvmlGpuInstance_t> = vec![ptr::null_mut(); capacity as usize];
    let mut count: c_uint = 0;
    // SAFETY: `handles` holds `capacity` elements, the profile's instance count, which NVML documents as the size
    // the buffer must have; `count` is a valid out-pointer.
    check(
        unsafe { get(raw(device), profile_id, handles.as_mut_ptr(), &mut count) },
        || format!("listing GPU instances of profile {profile_id}"),
    )?;
    filled(handles, count)
        .into_iter()
        .map(|handle| gpu_instance_info(nvml, handle))
        .collect()
}

/// Creates a GPU instance of `profile_id` at `at`.
pub(super) fn create_gpu_instance(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_id: u32,
    at: Placement,
) -> Result<GpuInstance> {
    let create = symbol(
        &nvml.lib().nvmlDeviceCreateGpuInstanceWithPlacement,
        "nvmlDeviceCreateGpuInstanceWithPlacement",
    )?;
    let wanted = nvmlGpuInstancePlacement_t {
        start: at.start,
        size: at.size,
    };
    let mut handle: nvmlGpuInstance_t = ptr::null_mut();
    // SAFETY: `wanted` and `handle` are valid for the duration of the call; NVML only reads the one and writes the
    // other.
    check(
        unsafe { create(raw(device), profile_id, &wanted, &mut handle) },
        || format!("creating a GPU instance of profile {profile_id} at {at}"),
    )?;
    gpu_instance_info(nvml, handle)
}

/// The handle of GPU instance `id`.
fn gpu_instance_by_id(nvml: &Nvml, device: &Device<'_>, id: u32) -> Result<nvmlGpuInstance_t> {
    let get = symbol(
        &nvml.lib().nvmlDeviceGetGpuInstanceById,
        "nvmlDeviceGetGpuInstanceById",
    )?;
    let mut handle: nvmlGpuInstance_t = ptr::null_mut();
    // SAFETY: `handle` is a valid out-pointer.
    check(unsafe { get(raw(device), id, &mut handle) }, || {
        format!("finding GPU instance {id}")
    })?;
    Ok(handle)
}

/// Destroys GPU instance `id`.
pub(super) fn destroy_gpu_instance(nvml: &Nvml, device: &Device<'_>, id: u32) -> Result<()> {
    let destroy = symbol(&nvml.lib().nvmlGpuInstanceDestroy, "nvmlGpuInstanceDestroy")?;
    let handle = gpu_instance_by_id(nvml, device, id)?;
    // SAFETY: `handle` was just returned by NVML for this device; NVML invalidates it, and it is not used again.
    check(unsafe { destroy(handle) }, || {
        format!("destroying GPU instance {id}")
    })
}

/// A compute-instance profile of a GPU instance, by NVML constant; `None` when the GPU instance does not offer it.
fn compute_profile(
    nvml: &Nvml,
    instance: nvmlGpuInstance_t,
    index: u32,
) -> Result<Option<nvmlComputeInstanceProfileInfo_t>> {
    let get = symbol(
        &nvml.lib().nvmlGpuInstanceGetComputeInstanceProfileInfo,
        "nvmlGpuInstanceGetComputeInstanceProfileInfo",
    )?;
    // SAFETY: the struct holds integers only, for which all-zero bytes are valid values.
    let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { mem::zeroed() };
    // SAFETY: `instance` came from NVML; `info` is a valid out-pointer.
    let code = unsafe {
        get(
            instance,
            index,
            NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            &mut info,
        )
    };
    if code == nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
        || code == nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT
    {
        return Ok(None);
    }
    check(code, || format!("reading compute-instance profile {index}"))?;
    Ok(Some(info))
}

/// Id and profile of a compute instance, with the slice count of its profile.
fn compute_instance_info(
    nvml: &Nvml,
    handle: nvmlComputeInstance_t,
    gpu_instance_id: u32,
    slice_count: u32,
) -> Result<ComputeInstance> {
    let get = symbol(
        &nvml.lib().nvmlComputeInstanceGetInfo_v2,
        "nvmlComputeInstanceGetInfo_v2",
    )?;
    // SAFETY: the struct holds integers and raw pointers only, for which all-zero bytes are valid values.
    let mut info: nvmlComputeInstanceInfo_t = unsafe { mem::zeroed() };
    // SAFETY: `handle` came from NVML; `info` is a valid out-pointer.
    check(unsafe { get(handle, &mut info) }, || {
        "reading a compute instance".to_owned()
    })?;
    Ok(ComputeInstance {
        id: info.id,
        gpu_instance_id,
        profile_id: info.profileId,
        slice_count,
    })
}

/// The compute instances of GPU instance `gpu_instance_id`.
pub(super) fn compute_instances(
    nvml: &Nvml,
    device: &Device<'_>,
    gpu_instance_id: u32,
) -> Result<Vec<ComputeInstance>> {
    let get = symbol(
        &nvml.lib().nvmlGpuInstanceGetComputeInstances,
        "nvmlGpuInstanceGetComputeInstances",
    )?;
    let instance = gpu_instance_by_id(nvml, device, gpu_instance_id)?;
    let mut found = Vec::new();
    for index in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        let Some(profile) = compute_profile(nvml, instance, index)? else {
            continue;
        };
        if profile.instanceCount == 0 {
            continue;
        }
        let mut handles: Vec<nvmlComputeInstance_t> =
            vec![ptr::null_mut(); profile.instanceCount as usize];
        let mut count: c_uint = 0;
        // SAFETY: `handles` holds the profile's instance count of elements, the size NVML requires; `count` is a
        // valid out-pointer.
        check(
            unsafe { get(instance, profile.id, handles.as_mut_ptr(), &mut count) },
            || format!("listing compute instances of GPU instance {gpu_instance_id}"),
        )?;
        for handle in filled(handles, count) {
            found.push(compute_instance_info(
                nvml,
                handle,
                gpu_instance_id,
                profile.sliceCount,
            )?);
        }
    }
    found.sort_by_key(|compute| compute.id);
    Ok(found)
}

/// Creates a compute instance of the profile with NVML constant `profile_index` in GPU instance `gpu_instance_id`.
pub(super) fn create_compute_instance(
    nvml: &Nvml,
    device: &Device<'_>,
    gpu_instance_id: u32,
    profile_index: u32,
) -> Result<ComputeInstance> {
    let create = symbol(
        &nvml.lib().nvmlGpuInstanceCreateComputeInstance,
        "nvmlGpuInstanceCreateComputeInstance",
    )?;
    let instance = gpu_instance_by_id(nvml, device, gpu_instance_id)?;
    let profile = compute_profile(nvml, instance, profile_index)?.ok_or_else(|| {
        GpuError::NotSupported(format!(
            "compute-instance profile {profile_index} in GPU instance {gpu_instance_id}"
        ))
    })?;
    let mut handle: nvmlComputeInstance_t = ptr::null_mut();
    // SAFETY: `instance` came from NVML for this device; `handle` is a valid out-pointer.
    check(unsafe { create(instance, profile.id, &mut handle) }, || {
        format!("creating a compute instance in GPU instance {gpu_instance_id}")
    })?;
    compute_instance_info(nvml, handle, gpu_instance_id, profile.sliceCount)
}

/// Destroys compute instance `id` of GPU instance `gpu_instance_id`.
pub(super) fn destroy_compute_instance(
    nvml: &Nvml,
    device: &Device<'_>,
    gpu_instance_id: u32,
    id: u32,
) -> Result<()> {
    let get = symbol(
        &nvml.lib().nvmlGpuInstanceGetComputeInstanceById,
        "nvmlGpuInstanceGetComputeInstanceById",
    )?;
    let destroy = symbol(
        &nvml.lib().nvmlComputeInstanceDestroy,
        "nvmlComputeInstanceDestroy",
    )?;
    let instance = gpu_instance_by_id(nvml, device, gpu_instance_id)?;
    let mut handle: nvmlComputeInstance_t = ptr::null_mut();
    // SAFETY: `instance` came from NVML; `handle` is a valid out-pointer.
    check(unsafe { get(instance, id, &mut handle) }, || {
        format!("finding compute instance {id} in GPU instance {gpu_instance_id}")
    })?;
    // SAFETY: `handle` was just returned by NVML; NVML invalidates it, and it is not used again.
    check(unsafe { destroy(handle) }, || {
        format!("destroying compute instance {id} in GPU instance {gpu_instance_id}")
    })
}

/// The GPU- and compute-instance ids of a MIG device handle.
pub(super) fn mig_device_ids(nvml: &Nvml, mig_device: &Device<'_>) -> Result<(u32, u32)> {
    let gpu_instance = symbol(
        &nvml.lib().nvmlDeviceGetGpuInstanceId,
        "nvmlDeviceGetGpuInstanceId",
    )?;
    let compute_instance = symbol(
        &nvml.lib().nvmlDeviceGetComputeInstanceId,
        "nvmlDeviceGetComputeInstanceId",
    )?;
    let (mut gpu_instance_id, mut compute_instance_id): (c_uint, c_uint) = (0, 0);
    // SAFETY: `mig_device` is a live MIG device handle; `gpu_instance_id` is a valid out-pointer.
    check(
        unsafe { gpu_instance(raw(mig_device), &mut gpu_instance_id) },
        || "reading the GPU instance of a MIG device".to_owned(),
    )?;
    // SAFETY: as above, for `compute_instance_id`.
    check(
        unsafe { compute_instance(raw(mig_device), &mut compute_instance_id) },
        || "reading the compute instance of a MIG device".to_owned(),
    )?;
    Ok((gpu_instance_id, compute_instance_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filled_keeps_what_nvml_reported() {
        let buffer = vec![placement(nvmlGpuInstancePlacement_t { start: 0, size: 4 }); 3];
        assert_eq!(filled(buffer.clone(), 2).len(), 2);
        assert_eq!(filled(buffer.clone(), 9).len(), 3);
        assert!(filled(buffer, 0).is_empty());
    }

    #[test]
    fn placements_convert_field_by_field() {
        assert_eq!(
            placement(nvmlGpuInstancePlacement_t { start: 4, size: 4 }),
            Placement { start: 4, size: 4 }
        );
    }

    #[test]
    fn a_missing_symbol_is_not_supported() {
        let missing: std::result::Result<fn(), &str> = Err("undefined symbol");
        let error = symbol(&missing, "nvmlDeviceCreateGpuInstanceWithPlacement").unwrap_err();
        assert!(matches!(error, GpuError::NotSupported(_)), "{error}");
        assert!(
            error
                .to_string()
                .contains("nvmlDeviceCreateGpuInstanceWithPlacement"),
            "{error}"
        );
    }
}
