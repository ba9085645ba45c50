//! Building the cluster's tools from their Go modules, once, into the cache.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::paths::{self, Layout};
use super::toolchain::{self, Go};
use super::versions::{self, GoTool, Output};
use super::{fetch, gomod, progress};

/// The built tools: one directory with every binary, and kwok's stage files.
#[derive(Debug, Clone)]
pub struct Toolset {
    pub bin_dir: PathBuf,
    /// kwok's default stages, to be passed to `kwok --config`.
    pub kwok_stages: Vec<PathBuf>,
}

impl Toolset {
    /// The path of one of the binaries.
    pub fn binary(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }
}

/// Whether a tool's directory holds everything its build leaves there.
fn is_built(dir: &Path, tool: &GoTool) -> bool {
    expected_files(tool)
        .iter()
        .all(|name| dir.join(name).exists())
}

fn expected_files(tool: &GoTool) -> Vec<String> {
    let binaries = tool.binaries.iter().map(|name| (*name).to_owned());
    binaries
        .chain(tool.module_files.iter().map(|file| file_name(file)))
        .collect()
}

fn file_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_owned()
}

/// Builds one tool outside the toolset (kube-proxy) if it is not in the cache yet; returns its directory.
pub fn ensure_tool(layout: &Layout, tool: &GoTool) -> anyhow::Result<PathBuf> {
    let dir = layout.tool_dir(tool);
    if !is_built(&dir, tool) {
        let go = toolchain::ensure_go(layout)?;
        build(layout, &go, tool)
            .with_context(|| format!("building {} {}", tool.module, tool.version))?;
    }
    Ok(dir)
}

/// Builds every tool that is not in the cache yet, and links all binaries into one directory.
pub fn ensure_built(layout: &Layout) -> anyhow::Result<Toolset> {
    let tools = versions::all_tools();
    let missing: Vec<&GoTool> = tools
        .iter()
        .filter(|tool| !is_built(&layout.tool_dir(tool), tool))
        .collect();
    if !missing.is_empty() {
        let go = toolchain::ensure_go(layout)?;
        progress::say(format!(
            "building with Go {} ({})",
            go.version,
            go.binary.display()
        ));
        for tool in missing {
            build(layout, &go, tool)
                .with_context(|| format!("building {} {}", tool.module, tool.version))?;
        }
    }
    let bin_dir = layout.bin_dir(&tools);
    create_dir(&bin_dir)?;
    for tool in &tools {
        for binary in tool.binaries {
            link(&layout.tool_dir(tool).join(binary), &bin_dir.join(binary))?;
        }
    }
    let kwok = versions::kwok();
    let kwok_dir = layout.tool_dir(&kwok);
    let kwok_stages = kwok
        .module_files
        .iter()
        .map(|file| kwok_dir.join(file_name(file)))
        .collect();
    Ok(Toolset {
        bin_dir,
        kwok_stages,
    })
}

/// A symlink at `link` pointing to `target`, replacing whatever was there.
fn link(target: &Path, link: &Path) -> anyhow::Result<()> {
    if std::fs::read_link(link).is_ok_and(|current| current == target) {
        return Ok(());
    }
    if link.symlink_metadata().is_ok() {
        std::fs::remove_file(link).with_context(|| format!("cannot replace {}", link.display()))?;
    }
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("cannot link {} to {}", link.display(), target.display()))
}

/// go.mod + tools.go, `go mod tidy`, one `go build` of all the tool's packages into a temporary directory, the
/// module files copied next to the binaries, and the directory renamed into place.
fn build(layout: &Layout, go: &Go, tool: &GoTool) -> anyhow::Result<()> {
    let label = format!("{} {}", tool.name, tool.version);
    let module_dir = layout.module_dir(tool);
    let log = layout.build_log(tool);
    create_dir(&module_dir)?;
    create_dir(&layout.root.join("logs"))?;
    std::fs::write(&log, "").with_context(|| format!("cannot create {}", log.display()))?;

    let replaced = if tool.kubernetes_staging {
        progress::step(&format!("read the go.mod of {label}"), |_| {
            let proxy = gomod::module_proxy(std::env::var("GOPROXY").ok().as_deref());
            let upstream =
                fetch::get_text(&gomod::proxy_url(&proxy, tool.module, tool.version, "mod"))?;
            let replaced = gomod::staging_replaces(&upstream);
            anyhow::ensure!(
                !replaced.is_empty(),
                "the go.mod of {label} replaces no staging module"
            );
            Ok(replaced)
        })?
    } else {
        Vec::new()
    };
    write(
        &module_dir.join("go.mod"),
        &gomod::render_go_mod(tool, &replaced, &versions::staging_version(tool.version)),
    )?;
    write(
        &module_dir.join("tools.go"),
        &gomod::render_tools_go(tool.packages),
    )?;
    if !tool.pinned_sums.is_empty() {
        progress::step(&format!("go mod download ({label})"), |_| {
            pin_sums(go, tool, &module_dir)
        })?;
    }

    progress::step(&format!("go mod tidy ({label})"), |step| {
        step.run(
            go.command().args(["mod", "tidy"]).current_dir(&module_dir),
            &log,
        )
    })?;

    let target = layout.tool_dir(tool);
    let partial = paths::with_suffix(&target, ".partial");
    for dir in [&partial, &target] {
        if dir.exists() {
            std::fs::remove_dir_all(dir)
                .with_context(|| format!("cannot remove {}", dir.display()))?;
        }
    }
    create_dir(&partial)?;
    progress::step(&format!("go build ({label})"), |step| {
        let mut command = go.command();
        command.current_dir(&module_dir).args(["build", "-v", "-o"]);
        match tool.output {
            Output::Directory => command.arg(format!("{}/", partial.display())),
            Output::Single(name) => command.arg(partial.join(name)),
        };
        command.arg("-ldflags").arg(tool.ldflags());
        if tool.static_binary {
            command.env("CGO_ENABLED", "0");
        }
        step.run(command.args(tool.packages), &log)
    })?;

    if !tool.module_files.is_empty() {
        let output = go
            .command()
            .args(["list", "-m", "-f", "{{.Dir}}", tool.module])
            .current_dir(&module_dir)
            .output()
            .context("go list -m")?;
        anyhow::ensure!(
            output.status.success(),
            "go list -m {} failed: {}",
            tool.module,
            String::from_utf8_lossy(&output.stderr)
        );
        let source = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        for file in tool.module_files {
            copy_tree(&source.join(file), &partial.join(file_name(file)))?;
        }
    }
    anyhow::ensure!(
        is_built(&partial, tool),
        "go build finished but {} lacks some of {:?} (see {})",
        partial.display(),
        expected_files(tool),
        log.display()
    );
    std::fs::rename(&partial, &target)
        .with_context(|| format!("cannot move the build to {}", target.display()))
}

/// Writes the pinned go.sum lines, downloads the module (checked against them), and adds the module's own go.sum,
/// so that `go mod tidy` finds every dependency's hash without asking the checksum database.
fn pin_sums(go: &Go, tool: &GoTool, module_dir: &Path) -> anyhow::Result<()> {
    let pinned = tool.pinned_sums.join("\n") + "\n";
    write(&module_dir.join("go.sum"), &pinned)?;
    let output = go
        .command()
        .args(["mod", "download", "-json"])
        .arg(format!("{}@{}", tool.module, tool.version))
        .current_dir(module_dir)
        .output()
        .context("go mod download")?;
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).with_context(|| {
        format!(
            "go mod download printed no JSON: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    if let Some(error) = answer["Error"].as_str() {
        anyhow::bail!("go mod download {}@{}: {error}", tool.module, tool.version);
    }
    let dir = answer["Dir"]
        .as_str()
        .context("go mod download named no directory")?;
    let dependencies = std::fs::read_to_string(Path::new(dir).join("go.sum"))
        .with_context(|| format!("cannot read the go.sum of {}", tool.module))?;
    write(&module_dir.join("go.sum"), &(pinned + &dependencies))
}

/// Copies a file, or a directory with everything in it; the copies are writable (module cache files are not), so
/// that a rebuild can remove them.
pub fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    if from.is_dir() {
        create_dir(to)?;
        for entry in
            std::fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))?
        {
            let entry = entry?;
            copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
        return Ok(());
    }
    std::fs::copy(from, to).with_context(|| format!("cannot copy {}", from.display()))?;
    std::fs::set_permissions(to, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .with_context(|| format!("cannot make {} writable", to.display()))
}

pub(super) fn create_dir(path: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(path).with_context(|| format!("cannot create {}", path.display()))
}

pub(super) fn write(path: &Path, contents: &str) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_is_built_when_all_its_files_are_there() {
        let dir = std::env::temp_dir().join(format!("xtask-tools-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kwok = versions::kwok();
        assert!(!is_built(&dir, &kwok));
        std::fs::write(dir.join("kwok"), "").unwrap();
        assert!(!is_built(&dir, &kwok), "the stage files are missing");
        for file in kwok.module_files {
            std::fs::write(dir.join(file_name(file)), "").unwrap();
        }
        assert!(is_built(&dir, &kwok));
        assert_eq!(expected_files(&versions::etcd()), vec!["etcd"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
