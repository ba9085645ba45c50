//! The Go toolchain the tools are built with: the machine's `go` when it is recent enough, else one unpacked into
//! the cache from the Go module proxy (`golang.org/toolchain`, the same module `GOTOOLCHAIN` switching uses).

use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;

use super::paths::{self, Layout};
use super::progress;
use super::versions::{GO_MINIMUM, GO_TOOLCHAIN, GO_TOOLCHAIN_SHA256, GoVersion};
use super::{fetch, gomod};

/// A `go` binary and its version.
#[derive(Debug, Clone)]
pub struct Go {
    pub binary: PathBuf,
    pub version: GoVersion,
}

impl Go {
    /// A `go` command that never switches toolchains by itself and ignores any go.work of the caller.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.binary);
        command.env("GOTOOLCHAIN", "local").env("GOWORK", "off");
        command
    }
}

/// Finds a `go` of at least [`GO_MINIMUM`] on PATH, else in the cache, else installs [`GO_TOOLCHAIN`] there.
pub fn ensure_go(layout: &Layout) -> anyhow::Result<Go> {
    let on_path =
        find_on_path("go").and_then(|binary| probe(&binary).map(|version| Go { binary, version }));
    match on_path {
        Some(go) if go.version >= GO_MINIMUM => return Ok(go),
        Some(go) => progress::say(format!(
            "{} is Go {}, older than the {GO_MINIMUM} the tools need; using Go {GO_TOOLCHAIN} from the cache",
            go.binary.display(),
            go.version
        )),
        None => progress::say(format!(
            "no `go` on PATH; using Go {GO_TOOLCHAIN} from the cache"
        )),
    }
    let root = layout.go_root(GO_TOOLCHAIN);
    let binary = root.join("bin").join("go");
    if !binary.exists() {
        install(&root)?;
    }
    let version = probe(&binary).with_context(|| format!("{} does not run", binary.display()))?;
    Ok(Go { binary, version })
}

/// The first executable file named `name` in the directories of PATH.
fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            candidate
                .metadata()
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
}

/// The version `go env GOVERSION` reports, if the binary runs.
fn probe(binary: &Path) -> Option<GoVersion> {
    let output = Command::new(binary)
        .args(["env", "GOVERSION"])
        .env("GOTOOLCHAIN", "local")
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| GoVersion::parse(&String::from_utf8_lossy(&output.stdout)))
        .flatten()
}

/// The `golang.org/toolchain` module version for this machine, e.g. `v0.0.1-go1.26.8.linux-amd64`.
pub fn toolchain_module_version(
    version: GoVersion,
    os: &str,
    arch: &str,
) -> anyhow::Result<String> {
    Ok(format!("v0.0.1-go{version}.{os}-{}", goarch(arch)?))
}

/// Go's name for a CPU architecture as Rust names it (`std::env::consts::ARCH`).
fn goarch(arch: &str) -> anyhow::Result<&'static str> {
    match arch {
        "x86_64" => Ok("amd64"),
        "aarch64" => Ok("arm64"),
        other => anyhow::bail!("no Go toolchain download for CPU architecture {other}"),
    }
}

/// The pinned SHA-256 of the [`GO_TOOLCHAIN`] zip for this OS and CPU architecture.
fn toolchain_sha256(os: &str, arch: &str) -> anyhow::Result<&'static str> {
    let platform = format!("{os}-{}", goarch(arch)?);
    GO_TOOLCHAIN_SHA256
        .iter()
        .find(|(pinned, _)| *pinned == platform)
        .map(|(_, digest)| *digest)
        .with_context(|| {
            format!(
                "no SHA-256 of the Go {GO_TOOLCHAIN} toolchain for {platform} is pinned in \
                 crates/harness/src/cluster/versions.rs"
            )
        })
}

/// Whether a file of the toolchain must be executable: the commands in bin/ and the compiler, linker etc. in
/// pkg/tool/<os_arch>/. (Module zips do not record file modes.)
pub fn is_executable_in_goroot(relative: &Path) -> bool {
    let parts: Vec<_> = relative.components().map(|part| part.as_os_str()).collect();
    matches!(parts.as_slice(), [bin, _] if *bin == "bin")
        || matches!(parts.as_slice(), [pkg, tool, _, _] if *pkg == "pkg" && *tool == "tool")
}

/// Downloads the toolchain zip, checks its pinned digest, and unpacks it to `root` (via a temporary sibling, so a
/// half-done unpack is never taken for a toolchain).
fn install(root: &Path) -> anyhow::Result<()> {
    let (os, arch) = (std::env::consts::OS, std::env::consts::ARCH);
    let module_version = toolchain_module_version(GO_TOOLCHAIN, os, arch)?;
    let sha256 = toolchain_sha256(os, arch)?;
    let proxy = gomod::module_proxy(std::env::var("GOPROXY").ok().as_deref());
    let url = gomod::proxy_url(&proxy, "golang.org/toolchain", &module_version, "zip");
    let zip = progress::step(&format!("download Go {GO_TOOLCHAIN}"), |step| {
        step.update(&url);
        let zip = fetch::get_bytes(&url)?;
        fetch::verify_sha256(&url, &zip, sha256)?;
        Ok(zip)
    })?;
    progress::step(&format!("unpack Go {GO_TOOLCHAIN}"), |_| {
        let partial = paths::with_suffix(root, ".partial");
        if partial.exists() {
            std::fs::remove_dir_all(&partial)
                .with_context(|| format!("cannot remove {}", partial.display()))?;
        }
        let prefix = format!("golang.org/toolchain@{module_version}/");
        unpack(&zip, &prefix, &partial).with_context(|| format!("cannot unpack {url}"))?;
        std::fs::rename(&partial, root)
            .with_context(|| format!("cannot move Go into {}", root.display()))
    })
}

fn unpack(zip: &[u8], prefix: &str, into: &Path) -> anyhow::Result<()> {
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(zip))?;
    for index in 0..archive.len() {
        let mut entry = archive.by_index(index)?;
        let name = String::from_utf8_lossy(entry.name_raw()).into_owned();
        let Some(relative) = entry.enclosed_name() else {
            anyhow::bail!("unsafe path in archive: {name}");
        };
        let Ok(relative) = relative.strip_prefix(prefix) else {
            anyhow::bail!("{name} is not under {prefix}");
        };
        let relative = relative.to_owned();
        let target = into.join(&relative);
        if entry.is_dir() {
            std::fs::create_dir_all(&target)?;
            continue;
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut contents = Vec::with_capacity(usize::try_from(entry.size()).unwrap_or_default());
        entry.read_to_end(&mut contents)?;
        std::fs::write(&target, contents)
            .with_context(|| format!("cannot write {}", target.display()))?;
        let mode = if is_executable_in_goroot(&relative) {
            0o755
        } else {
            0o644
        };
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_toolchain_module_for_this_machine() {
        let version = GoVersion {
            major: 1,
            minor: 26,
            patch: 8,
        };
        assert_eq!(
            toolchain_module_version(version, "linux", "x86_64").unwrap(),
            "v0.0.1-go1.26.8.linux-amd64"
        );
        assert_eq!(
            toolchain_module_version(version, "linux", "aarch64").unwrap(),
            "v0.0.1-go1.26.8.linux-arm64"
        );
        assert!(toolchain_module_version(version, "linux", "riscv64").is_err());
    }

    #[test]
    fn pins_a_digest_for_every_linux_download() {
        for arch in ["x86_64", "aarch64"] {
            let digest = toolchain_sha256("linux", arch).unwrap();
            assert_eq!(digest.len(), 64);
            assert!(digest.bytes().all(|byte| byte.is_ascii_hexdigit()));
        }
        assert!(toolchain_sha256("macos", "aarch64").is_err());
    }

    #[test]
    fn marks_commands_and_compiler_tools_executable() {
        assert!(is_executable_in_goroot(Path::new("bin/go")));
        assert!(is_executable_in_goroot(Path::new(
            "pkg/tool/linux_amd64/compile"
        )));
        assert!(!is_executable_in_goroot(Path::new("src/fmt/print.go")));
        assert!(!is_executable_in_goroot(Path::new("bin")));
        assert!(!is_executable_in_goroot(Path::new(
            "pkg/tool/linux_amd64/sub/file"
        )));
    }

    #[test]
    fn unpacks_under_the_prefix_with_modes() {
        use std::io::Write as _;
        let mut buffer = std::io::Cursor::new(Vec::new());
        let mut writer = zip::ZipWriter::new(&mut buffer);
        let options = zip::write::SimpleFileOptions::default();
        writer
            .start_file(
                "golang.org/toolchain@v0.0.1-go1.26.8.linux-amd64/bin/go",
                options,
            )
            .unwrap();
        writer.write_all(b"#!/bin/sh\n").unwrap();
        writer
            .start_file(
                "golang.org/toolchain@v0.0.1-go1.26.8.linux-amd64/VERSION",
                options,
            )
            .unwrap();
        writer.write_all(b"go1.26.8\n").unwrap();
        writer.finish().unwrap();

        let dir = std::env::temp_dir().join(format!("xtask-unpack-{}", std::process::id()));
        unpack(
            buffer.get_ref(),
            "golang.org/toolchain@v0.0.1-go1.26.8.linux-amd64/",
            &dir,
        )
        .unwrap();
        let mode = |name: &str| {
            std::fs::metadata(dir.join(name))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("bin/go"), 0o755);
        assert_eq!(mode("VERSION"), 0o644);
        assert_eq!(
            std::fs::read_to_string(dir.join("VERSION")).unwrap(),
            "go1.26.8\n"
        );
        assert!(unpack(buffer.get_ref(), "other-prefix/", &dir.join("x")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
