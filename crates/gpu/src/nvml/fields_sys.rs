//! NVML's field values (`nvmlDeviceGetFieldValues`), called directly on the library `nvml-wrapper` loaded:
//! `nvml-wrapper`'s `Device::field_values_for` always asks with scope 0, but NVLink traffic is counted per link
//! and needs the link as the scope. One call reads every field asked for; each field answers on its own, so a
//! field the GPU does not give (ECC on a GPU without it, NVLink on a PCIe card) costs only that field.

#![allow(unsafe_code)]

use std::os::raw::c_int;

use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    nvmlFieldValue_t, nvmlReturn_enum_NVML_SUCCESS,
    nvmlValueType_enum_NVML_VALUE_TYPE_DOUBLE as DOUBLE,
    nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT as SIGNED_INT,
    nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG as SIGNED_LONG_LONG,
    nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT as UNSIGNED_INT,
    nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG as UNSIGNED_LONG,
    nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG as UNSIGNED_LONG_LONG,
    nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_SHORT as UNSIGNED_SHORT,
};

use super::error::check;
use super::mig_sys::{raw, symbol};
use crate::error::Result;

/// One field to read: its NVML id (`NVML_FI_*`) and scope (the link, for per-link fields; 0 otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FieldRequest {
    /// `NVML_FI_*`.
    pub id: u32,
    /// The link for per-link fields, else 0.
    pub scope: u32,
}

/// Reads the fields in one call, in the order asked; a field the GPU does not give (or gives as a negative or
/// non-finite number, which no counter here can be) is `None`.
///
/// # Errors
/// When the call as a whole fails (the GPU is lost, the driver's NVML lacks the function).
pub(super) fn field_values(
    nvml: &Nvml,
    device: &Device<'_>,
    requests: &[FieldRequest],
) -> Result<Vec<Option<u64>>> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    let get = symbol(
        &nvml.lib().nvmlDeviceGetFieldValues,
        "nvmlDeviceGetFieldValues",
    )?;
    let mut values: Vec<nvmlFieldValue_t> = requests
        .iter()
        .map(|request| {
            // SAFETY: the struct holds integers and a union of numbers, for which all-zero bytes are valid values.
            let mut value: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
            value.fieldId = request.id;
            value.scopeId = request.scope;
            value
        })
        .collect();
    let count = c_int::try_from(values.len()).unwrap_or(c_int::MAX);
    // SAFETY: `values` holds `count` initialised elements, each naming the field and scope to read; NVML writes
    // each answer into its own element and nothing beyond.
    check(
        unsafe { get(raw(device), count, values.as_mut_ptr()) },
        || "reading field values".to_owned(),
    )?;
    Ok(values.iter().map(number).collect())
}

/// The answer of one field as a whole number, if it has one.
fn number(value: &nvmlFieldValue_t) -> Option<u64> {
    if value.nvmlReturn != nvmlReturn_enum_NVML_SUCCESS {
        return None;
    }
    // SAFETY: `valueType` says which member of the union NVML wrote; only that member is read.
    unsafe {
        match value.valueType {
            UNSIGNED_INT => Some(u64::from(value.value.uiVal)),
            // `c_ulong` is 64 bits on Linux but 32 on other platforms NVML supports.
            #[allow(clippy::useless_conversion)]
            UNSIGNED_LONG => Some(u64::from(value.value.ulVal)),
            UNSIGNED_LONG_LONG => Some(value.value.ullVal),
            UNSIGNED_SHORT => Some(u64::from(value.value.usVal)),
            SIGNED_INT => u64::try_from(value.value.siVal).ok(),
            SIGNED_LONG_LONG => u64::try_from(value.value.sllVal).ok(),
            DOUBLE => {
                let double = value.value.dVal;
                // Truncation is intended: the counters read here are whole numbers NVML happened to give as doubles.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                (double.is_finite() && double >= 0.0).then_some(double as u64)
            }
            _ => None,
        }
    }
}
