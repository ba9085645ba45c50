//! The failures a GPU backend reports.
//!
//! The variants mirror the NVML return codes that callers must tell apart, because each one calls for a different
//! reaction: `InUse` means "wait for the workload to go, or drain the node", `InsufficientResources` means "this
//! geometry does not fit, another order or placement might", `NotSupported` means "this GPU or platform cannot do it
//! at all", `LibraryNotFound` means "the node has no driver (yet)". Everything else is `Other`, with the text NVML
//! (or the simulator) gave.

/// A failed GPU operation. Each variant carries what was being done, so that a message is useful on its own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// The GPU, its driver or the platform does not offer the operation (NVML_ERROR_NOT_SUPPORTED).
    #[error("not supported: {0}")]
    NotSupported(String),
    /// Another client holds the GPU or instance (NVML_ERROR_IN_USE, "In use by another client").
    #[error("in use by another client: {0}")]
    InUse(String),
    /// The request does not fit what is left on the GPU (NVML_ERROR_INSUFFICIENT_RESOURCES).
    #[error("insufficient resources: {0}")]
    InsufficientResources(String),
    /// An argument is not valid for this GPU (NVML_ERROR_INVALID_ARGUMENT).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The GPU, instance or object asked for does not exist (NVML_ERROR_NOT_FOUND).
    #[error("not found: {0}")]
    NotFound(String),
    /// NVML could not be loaded or initialised: no driver on this node.
    #[error(
        "the NVIDIA driver is not installed or not mounted into this container: \
         libnvidia-ml.so.1 could not be loaded or initialised ({0})"
    )]
    LibraryNotFound(String),
    /// Anything else, with the backend's own description.
    #[error("{0}")]
    Other(String),
}

/// Result of a GPU operation.
pub type Result<T, E = GpuError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::GpuError;

    #[test]
    fn library_not_found_says_what_to_do() {
        let message = GpuError::LibraryNotFound("dlopen failed".into()).to_string();
        assert!(
            message.contains("NVIDIA driver is not installed or not mounted"),
            "{message}"
        );
        assert!(message.contains("libnvidia-ml.so.1"), "{message}");
        assert!(message.ends_with("(dlopen failed)"), "{message}");
    }
}
