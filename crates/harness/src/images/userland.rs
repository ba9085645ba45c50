//! The minimal glibc userland every image starts from, assembled from Debian's packages (no base image pull):
//! the C library and libgcc (the binaries are glibc-dynamic so that the node-side ones can dlopen
//! libnvidia-ml.so.1, which the NVIDIA container runtime injects), the CA bundle, and users for non-root.
//!
//! The packages are downloaded with `apt-get download` into the cache and unpacked with `dpkg-deb`; only the
//! files a program needs at run time are kept (no documentation, no iconv modules, no maintainer scripts). Each
//! platform's userland comes from that Debian architecture's packages (`libc6:arm64` for arm64), which apt offers
//! once the architecture is added to dpkg (`crate::apt::ensure_architecture`).

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use super::oci::{Entry, LayerContents};

/// The packages of the userland, in the order they are unpacked.
pub const PACKAGES: &[&str] = &["libc6", "libgcc-s1", "ca-certificates"];
/// Those of [`PACKAGES`] that are architecture `all` (data only): apt knows them by their plain name, not
/// qualified with an architecture.
const ARCHITECTURE_ALL: &[&str] = &["ca-certificates"];

/// The non-root user of the images that can run without root (the operator).
pub const NONROOT_UID: u32 = 65532;

/// A downloaded package: its name, version and `.deb` file.
#[derive(Debug, Clone)]
pub struct Package {
    pub name: String,
    pub version: String,
    pub deb: PathBuf,
}

/// Downloads the packages of Debian architecture `architecture` into `dir` (once: an existing `.deb` of the
/// version apt offers is reused), running `apt-get update` first when apt does not know a package yet (a fresh
/// machine).
pub fn download(dir: &Path, architecture: &str) -> anyhow::Result<Vec<Package>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut packages = Vec::new();
    for name in PACKAGES {
        let name = if ARCHITECTURE_ALL.contains(name) {
            (*name).to_string()
        } else {
            format!("{name}:{architecture}")
        };
        let name = name.as_str();
        let version = match candidate_version(name)? {
            Some(version) => version,
            None => {
                run(dir, "apt-get", &["update", "-qq"])?;
                candidate_version(name)?.with_context(|| {
                    format!("apt knows no package {name}, even after apt-get update")
                })?
            }
        };
        let deb = match find_deb(dir, name, &version, architecture)? {
            Some(deb) => deb,
            None => {
                let package = format!("{name}={version}");
                run(dir, "apt-get", &["download", "-qq", &package])?;
                find_deb(dir, name, &version, architecture)?.with_context(|| {
                    format!(
                        "apt-get download {package} wrote no .deb into {}",
                        dir.display()
                    )
                })?
            }
        };
        packages.push(Package {
            name: name.to_string(),
            version,
            deb,
        });
    }
    Ok(packages)
}

/// The version `apt-get download` would fetch, from `apt-cache policy`; `None` when apt has no candidate.
fn candidate_version(name: &str) -> anyhow::Result<Option<String>> {
    let output = Command::new("apt-cache")
        .args(["policy", name])
        .output()
        .context("cannot run apt-cache (the images are assembled from Debian packages)")?;
    Ok(parse_candidate(&String::from_utf8_lossy(&output.stdout)))
}

fn parse_candidate(policy: &str) -> Option<String> {
    policy
        .lines()
        .find_map(|line| line.trim().strip_prefix("Candidate:"))
        .map(str::trim)
        .filter(|version| !version.is_empty() && *version != "(none)")
        .map(str::to_string)
}

/// The `.deb` of this package version in `dir`, for `architecture` or `all` (data-only packages such as
/// ca-certificates); `name` may carry the `:<architecture>` qualifier, which file names do not.
fn find_deb(
    dir: &Path,
    name: &str,
    version: &str,
    architecture: &str,
) -> anyhow::Result<Option<PathBuf>> {
    let prefix = deb_file_prefix(name, version);
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        let file = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        if file
            .strip_prefix(&prefix)
            .is_some_and(|rest| rest == format!("{architecture}.deb") || rest == "all.deb")
        {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// Debian's file name of a package version up to the architecture: `:` (an epoch) is written `%3a`, and an
/// architecture qualifier of the name is not part of it.
fn deb_file_prefix(name: &str, version: &str) -> String {
    let name = name.split_once(':').map_or(name, |(name, _)| name);
    format!("{name}_{}_", version.replace(':', "%3a"))
}

fn run(dir: &Path, program: &str, args: &[&str]) -> anyhow::Result<()> {
    let status = Command::new(program)
        .args(args)
        .current_dir(dir)
        .status()
        .with_context(|| format!("cannot start {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

/// Whether a packaged path is needed at run time.
fn keep(path: &str) -> bool {
    const DROPPED: &[&str] = &[
        "usr/share/doc",
        "usr/share/man",
        "usr/share/lintian",
        "usr/share/locale",
        "usr/share/gcc",
        "usr/share/gdb",
        "usr/sbin",
        "usr/bin",
        "etc/ld.so.conf.d",
    ];
    // iconv modules live under each architecture's library directory (`usr/lib/<triplet>/gconv`).
    let iconv = path
        .strip_prefix("usr/lib/")
        .and_then(|rest| rest.split('/').nth(1))
        .is_some_and(|component| component == "gconv");
    !iconv
        && !DROPPED
            .iter()
            .any(|dropped| path == *dropped || path.starts_with(&format!("{dropped}/")))
}

/// Adds the files of one package to `layer`.
pub fn unpack(package: &Package, layer: &mut LayerContents) -> anyhow::Result<()> {
    let output = Command::new("dpkg-deb")
        .arg("--fsys-tarfile")
        .arg(&package.deb)
        .output()
        .context("cannot run dpkg-deb")?;
    if !output.status.success() {
        bail!(
            "dpkg-deb --fsys-tarfile {} failed: {}",
            package.deb.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let mut archive = tar::Archive::new(output.stdout.as_slice());
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.display().to_string();
        let path = path
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_string();
        if path.is_empty() || !keep(&path) {
            continue;
        }
        let mode = entry.header().mode()?;
        let item = match entry.header().entry_type() {
            tar::EntryType::Directory => Entry::Directory { mode },
            tar::EntryType::Symlink => Entry::Symlink {
                target: entry
                    .link_name()?
                    .with_context(|| format!("{path}: symlink without a target"))?
                    .display()
                    .to_string(),
            },
            tar::EntryType::Regular => {
                let mut contents = Vec::new();
                entry.read_to_end(&mut contents)?;
                Entry::File { mode, contents }
            }
            other => bail!(
                "{}: {path} is a {other:?}, not expected in a library package",
                package.name
            ),
        };
        layer.insert(&path, item);
    }
    Ok(())
}

/// `/etc/ssl/certs/ca-certificates.crt` made from the certificates ca-certificates ships (what its install
/// script would generate), in file-name order.
pub fn add_ca_bundle(layer: &mut LayerContents, certificates: &[(String, Vec<u8>)]) {
    let mut sorted: Vec<&(String, Vec<u8>)> = certificates.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut bundle = Vec::new();
    for (_, pem) in sorted {
        bundle.extend_from_slice(pem);
        if !pem.ends_with(b"\n") {
            bundle.push(b'\n');
        }
    }
    layer.insert(
        "/etc/ssl/certs/ca-certificates.crt",
        Entry::File {
            mode: 0o644,
            contents: bundle,
        },
    );
}

/// The certificates under `usr/share/ca-certificates` of an unpacked ca-certificates package.
pub fn certificates_in(layer: &LayerContents) -> Vec<(String, Vec<u8>)> {
    layer
        .files_under("usr/share/ca-certificates/")
        .filter(|(path, _)| path.ends_with(".crt"))
        .map(|(path, contents)| (path.to_string(), contents.to_vec()))
        .collect()
}

/// `/etc/passwd`, `/etc/group` and a world-writable `/tmp`, so that `runAsNonRoot` images have a named user.
pub fn add_users(layer: &mut LayerContents) {
    let file = |text: String| Entry::File {
        mode: 0o644,
        contents: text.into_bytes(),
    };
    layer.insert(
        "/etc/passwd",
        file(format!(
            "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{NONROOT_UID}:{NONROOT_UID}:nonroot:/home/nonroot:/sbin/nologin\n"
        )),
    );
    layer.insert(
        "/etc/group",
        file(format!("root:x:0:\nnonroot:x:{NONROOT_UID}:\n")),
    );
    layer.insert("/tmp", Entry::Directory { mode: 0o1777 });
    layer.insert("/home/nonroot", Entry::Directory { mode: 0o755 });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidate_is_read_from_apt_cache_policy() {
        let policy = "libc6:\n  Installed: 2.36-9+deb12u10\n  Candidate: 2.36-9+deb12u13\n  Version table:\n";
        assert_eq!(parse_candidate(policy).as_deref(), Some("2.36-9+deb12u13"));
        assert_eq!(
            parse_candidate("foo:\n  Installed: (none)\n  Candidate: (none)\n"),
            None
        );
        assert_eq!(parse_candidate(""), None);
    }

    #[test]
    fn epochs_are_escaped_in_file_names() {
        assert_eq!(deb_file_prefix("libc6", "2.36-9"), "libc6_2.36-9_");
        assert_eq!(deb_file_prefix("libc6:arm64", "2.36-9"), "libc6_2.36-9_");
        assert_eq!(deb_file_prefix("tool", "1:2.0"), "tool_1%3a2.0_");
    }

    #[test]
    fn finds_the_deb_of_the_architecture_or_all() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        for file in [
            "libc6_2.36-9_amd64.deb",
            "libc6_2.36-9_arm64.deb",
            "ca-certificates_2023_all.deb",
        ] {
            std::fs::write(dir.join(file), "").unwrap();
        }
        let found = |name, version, architecture| {
            find_deb(dir, name, version, architecture)
                .unwrap()
                .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
        };
        assert_eq!(
            found("libc6:arm64", "2.36-9", "arm64").as_deref(),
            Some("libc6_2.36-9_arm64.deb")
        );
        assert_eq!(
            found("libc6:amd64", "2.36-9", "amd64").as_deref(),
            Some("libc6_2.36-9_amd64.deb")
        );
        assert_eq!(
            found("ca-certificates", "2023", "arm64").as_deref(),
            Some("ca-certificates_2023_all.deb")
        );
        assert_eq!(found("libc6:riscv64", "2.36-9", "riscv64"), None);
    }

    #[test]
    fn documentation_and_iconv_modules_are_dropped() {
        assert!(keep("usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(keep("usr/share/ca-certificates/mozilla/ISRG_Root_X1.crt"));
        assert!(!keep("usr/share/doc/libc6/copyright"));
        assert!(!keep("usr/lib/x86_64-linux-gnu/gconv/UTF-16.so"));
        assert!(!keep("usr/lib/aarch64-linux-gnu/gconv/UTF-16.so"));
        assert!(keep("usr/lib/aarch64-linux-gnu/libc.so.6"));
        assert!(!keep("usr/bin/ldd"));
    }

    #[test]
    fn the_bundle_concatenates_certificates_in_name_order() {
        let mut layer = LayerContents::default();
        add_ca_bundle(
            &mut layer,
            &[
                ("b.crt".into(), b"B".to_vec()),
                ("a.crt".into(), b"A\n".to_vec()),
            ],
        );
        assert_eq!(
            layer
                .files_under("etc/ssl/certs/")
                .next()
                .map(|(_, c)| c.to_vec()),
            Some(b"A\nB\n".to_vec())
        );
    }
}
