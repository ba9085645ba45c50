//! GPU reset. NVML's public API has no reset call (`nvidia-smi --gpu-reset` uses a private one), so the reset runs
//! `nvidia-smi`, which ships with the driver next to `libnvidia-ml.so.1`. Its failures are read back into our error
//! variants, so callers handle a busy GPU or a platform without reset the same way on both backends.

use std::io::ErrorKind;
use std::process::Command;

use crate::error::{GpuError, Result};

/// Resets the GPU at `pci_bus_id` with `nvidia-smi --gpu-reset`.
pub(super) fn reset_with_nvidia_smi(pci_bus_id: &str) -> Result<()> {
    let output = Command::new("nvidia-smi")
        .args(["--gpu-reset", "-i", pci_bus_id])
        .output()
        .map_err(|error| match error.kind() {
            ErrorKind::NotFound => GpuError::NotSupported(format!(
                "resetting GPU {pci_bus_id} needs nvidia-smi, which is not on PATH; reboot the node instead"
            )),
            _ => GpuError::Other(format!("running nvidia-smi to reset GPU {pci_bus_id}: {error}")),
        })?;
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    Err(classify_failure(pci_bus_id, &text))
}

/// Reads nvidia-smi's explanation of a failed reset.
fn classify_failure(pci_bus_id: &str, output: &str) -> GpuError {
    let lower = output.to_lowercase();
    let detail = format!("resetting GPU {pci_bus_id}: {}", output.trim());
    if lower.contains("in use") || lower.contains("being used") {
        GpuError::InUse(detail)
    } else if lower.contains("not supported") {
        GpuError::NotSupported(detail)
    } else {
        GpuError::Other(detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_failures_map_to_our_variants() {
        let bus = "00000000:07:00.0";
        assert!(matches!(
            classify_failure(
                bus,
                "GPU 00000000:07:00.0 is currently in use by another process.\n"
            ),
            GpuError::InUse(_)
        ));
        assert!(matches!(
            classify_failure(
                bus,
                "Unable to reset this GPU because it's being used by some other process"
            ),
            GpuError::InUse(_)
        ));
        assert!(matches!(
            classify_failure(bus, "Resetting GPU 00000000:07:00.0 is not supported."),
            GpuError::NotSupported(_)
        ));
        let other = classify_failure(bus, "Insufficient Permissions\n");
        assert_eq!(
            other,
            GpuError::Other(format!("resetting GPU {bus}: Insufficient Permissions"))
        );
    }
}
