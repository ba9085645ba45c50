//! The host facts Node Feature Discovery publishes and NVIDIA's operator reads: NVIDIA PCI devices, the OS
//! release and the kernel version (node facts publishes them, feature discovery reads the GPUs' PCI classes). Reading is a few small files; everything else is pure.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

/// PCI vendor id of NVIDIA.
pub const NVIDIA_VENDOR: u32 = 0x10de;

/// PCI class (base class and subclass, the top 16 bits of the 24-bit class code) of a VGA controller: a GPU in
/// graphics mode.
pub const PCI_CLASS_VGA: u32 = 0x0300;
/// PCI class of a 3D controller: a GPU in compute mode (every MIG-capable GPU).
pub const PCI_CLASS_3D: u32 = 0x0302;

/// One PCI device as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciDevice {
    /// Its address, `0000:3b:00.0`.
    pub address: String,
    /// Vendor id, e.g. `0x10de`.
    pub vendor: u32,
    /// The 24-bit class code, e.g. `0x030200` for a 3D controller.
    pub class: u32,
}

impl PciDevice {
    /// The base class and subclass, `0x0302`: what NFD's `pci-<class>_<vendor>` labels name.
    #[must_use]
    pub const fn class_and_subclass(&self) -> u32 {
        self.class >> 8
    }
}

/// What is known about the host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// The fields of `os-release`.
    pub os_release: BTreeMap<String, String>,
    /// The kernel release, e.g. `5.15.0-119-generic`.
    pub kernel: Option<String>,
    /// The PCI devices.
    pub pci: Vec<PciDevice>,
}

/// A sysfs number file (`0x10de`, `0x030200`).
#[must_use]
pub fn parse_hex(text: &str) -> Option<u32> {
    let text = text.trim();
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    u32::from_str_radix(digits, 16).ok()
}

/// The fields of an `os-release` file: `KEY=value` lines, the value unquoted (single or double quotes, with
/// backslash escapes in double quotes); comments, blank lines and malformed lines skipped.
#[must_use]
pub fn parse_os_release(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            if line.starts_with('#') {
                return None;
            }
            let (key, value) = line.split_once('=')?;
            let valid_key = !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            valid_key.then(|| (key.to_owned(), unquote(value.trim())))
        })
        .collect()
}

fn unquote(value: &str) -> String {
    if let Some(inner) = value
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
    {
        let mut out = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => out.extend(chars.next()),
                c => out.push(c),
            }
        }
        return out;
    }
    value
        .strip_prefix('\'')
        .and_then(|rest| rest.strip_suffix('\''))
        .unwrap_or(value)
        .to_owned()
}

/// The `os-release` file of the host whose root filesystem is at `root`: `etc/os-release`, else
/// `usr/lib/os-release` (the order os-release(5) gives).
///
/// # Errors
/// When neither can be read.
pub fn read_os_release(root: &Path) -> io::Result<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(root.join("etc/os-release"))
        .or_else(|_| std::fs::read_to_string(root.join("usr/lib/os-release")))?;
    Ok(parse_os_release(&text))
}

/// The PCI devices under `dir` (`/sys/bus/pci/devices`): one folder per address with `vendor` and `class`
/// files. A device whose files cannot be read or parsed is left out.
///
/// # Errors
/// When `dir` cannot be listed.
pub fn read_pci_devices(dir: &Path) -> io::Result<Vec<PciDevice>> {
    let mut devices: Vec<PciDevice> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let path = entry.path();
            let number = |file: &str| {
                std::fs::read_to_string(path.join(file))
                    .ok()
                    .as_deref()
                    .and_then(parse_hex)
            };
            Some(PciDevice {
                address: entry.file_name().to_string_lossy().into_owned(),
                vendor: number("vendor")?,
                class: number("class")?,
            })
        })
        .collect();
    devices.sort_by(|a, b| a.address.cmp(&b.address));
    Ok(devices)
}

/// The PCI classes of the NVIDIA devices, by address (for GFD's `gpu.mode`).
#[must_use]
pub fn nvidia_classes(devices: &[PciDevice]) -> BTreeMap<String, u32> {
    devices
        .iter()
        .filter(|device| device.vendor == NVIDIA_VENDOR)
        .map(|device| (device.address.clone(), device.class_and_subclass()))
        .collect()
}
