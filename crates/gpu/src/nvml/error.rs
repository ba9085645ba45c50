//! From NVML's failures to ours. Pure, so the mapping is tested without a GPU.

use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES, nvmlReturn_enum_NVML_SUCCESS, nvmlReturn_t,
};

use crate::error::GpuError;

/// Maps an error of the safe wrapper, saying what was being done (`context`).
///
/// `nvml-wrapper` has no variant for `NVML_ERROR_INSUFFICIENT_RESOURCES` (what creating a MIG instance that does not
/// fit returns) and reports it as `UnexpectedVariant(23)`; it is recognised here so that callers see
/// [`GpuError::InsufficientResources`] whichever path an error took.
pub(crate) fn from_nvml(error: NvmlError, context: &str) -> GpuError {
    let detail = format!("{context} ({error})");
    match error {
        NvmlError::InvalidArg => GpuError::InvalidArgument(detail),
        NvmlError::NotSupported => GpuError::NotSupported(detail),
        NvmlError::InUse => GpuError::InUse(detail),
        NvmlError::NotFound => GpuError::NotFound(detail),
        NvmlError::UnexpectedVariant(code)
            if code == nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES =>
        {
            GpuError::InsufficientResources(context.to_owned())
        }
        NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound | NvmlError::DriverNotLoaded => {
            GpuError::LibraryNotFound(detail)
        }
        NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound => {
            GpuError::NotSupported(format!(
                "{context}: the installed driver's NVML lacks this function, a newer driver is needed ({error})"
            ))
        }
        other => GpuError::Other(format!("{context}: {other}")),
    }
}

/// Maps a raw NVML return code from a direct library call; `Ok` for success.
pub(crate) fn check(code: nvmlReturn_t, context: impl FnOnce() -> String) -> Result<(), GpuError> {
    if code == nvmlReturn_enum_NVML_SUCCESS {
        return Ok(());
    }
    let context = context();
    Err(
        if code == nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES {
            GpuError::InsufficientResources(context)
        } else {
            from_nvml(NvmlError::from(code), &context)
        },
    )
}

/// Maps a failed `nvmlInit`: anything that says "no library, no driver" becomes [`GpuError::LibraryNotFound`], whose
/// message tells the operator what to install or mount.
pub(crate) fn from_init(error: NvmlError) -> GpuError {
    match from_nvml(error, "initialising NVML") {
        GpuError::NotSupported(detail) => GpuError::LibraryNotFound(detail),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use nvml_wrapper_sys::bindings::{
        nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST, nvmlReturn_enum_NVML_ERROR_IN_USE,
        nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT, nvmlReturn_enum_NVML_ERROR_NOT_FOUND,
        nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
    };

    use super::*;

    fn code(code: nvmlReturn_t) -> GpuError {
        check(code, || "creating a GPU instance".to_owned()).unwrap_err()
    }

    #[test]
    fn return_codes_map_to_the_variants_callers_handle() {
        assert!(check(nvmlReturn_enum_NVML_SUCCESS, String::new).is_ok());
        assert_eq!(
            code(nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES),
            GpuError::InsufficientResources("creating a GPU instance".into())
        );
        assert!(matches!(
            code(nvmlReturn_enum_NVML_ERROR_IN_USE),
            GpuError::InUse(_)
        ));
        assert!(matches!(
            code(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED),
            GpuError::NotSupported(_)
        ));
        assert!(matches!(
            code(nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT),
            GpuError::InvalidArgument(_)
        ));
        assert!(matches!(
            code(nvmlReturn_enum_NVML_ERROR_NOT_FOUND),
            GpuError::NotFound(_)
        ));
        let lost = code(nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST);
        assert!(matches!(lost, GpuError::Other(_)), "{lost}");
        assert!(
            lost.to_string().starts_with("creating a GPU instance: "),
            "{lost}"
        );
    }

    #[test]
    fn wrapper_errors_map_the_same_way() {
        assert!(matches!(
            from_nvml(NvmlError::UnexpectedVariant(23), "x"),
            GpuError::InsufficientResources(_)
        ));
        assert!(matches!(
            from_nvml(NvmlError::InUse, "x"),
            GpuError::InUse(_)
        ));
        assert!(matches!(
            from_nvml(NvmlError::FailedToLoadSymbol("nvmlFoo".into()), "x"),
            GpuError::NotSupported(_)
        ));
    }

    #[test]
    fn a_missing_driver_is_library_not_found() {
        for error in [
            NvmlError::LibraryNotFound,
            NvmlError::DriverNotLoaded,
            NvmlError::FailedToLoadSymbol("nvmlInit_v2".into()),
        ] {
            let mapped = from_init(error);
            assert!(matches!(mapped, GpuError::LibraryNotFound(_)), "{mapped}");
            assert!(mapped.to_string().contains("libnvidia-ml.so.1"), "{mapped}");
        }
        assert!(matches!(
            from_init(NvmlError::NoPermission),
            GpuError::Other(_)
        ));
    }
}
