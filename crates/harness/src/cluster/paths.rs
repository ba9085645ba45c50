//! Where everything lives: one cache directory outside the repository, shared by every checkout.
//!
//! ```text
//! <cache>/go/go<version>/          a Go toolchain, only when the machine has no recent enough `go`
//! <cache>/gomod/<tool>-<version>/  throwaway Go modules (go.mod + tools.go) that the tools are built from
//! <cache>/tools/<tool>-<version>/  the built binaries of one tool
//! <cache>/bin/<toolset>/           links to every tool's binaries: the directory put on PATH
//! <cache>/logs/                    build logs
//! <cache>/cluster/                 the running cluster: state.json, certificates, kubeconfigs, data, logs
//! ```

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::versions::{self, GoTool, GoVersion};

/// Resolves the cache root: `$GPU_OPERATOR_CACHE`, else `$XDG_CACHE_HOME/gpu-operator-rs`, else
/// `$HOME/.cache/gpu-operator-rs`. Empty or relative values are ignored (as the XDG specification asks).
pub fn cache_root(
    gpu_operator_cache: Option<OsString>,
    xdg_cache_home: Option<OsString>,
    home: Option<OsString>,
) -> Option<PathBuf> {
    let absolute =
        |value: Option<OsString>| value.map(PathBuf::from).filter(|path| path.is_absolute());
    absolute(gpu_operator_cache)
        .or_else(|| absolute(xdg_cache_home).map(|dir| dir.join("gpu-operator-rs")))
        .or_else(|| absolute(home).map(|dir| dir.join(".cache").join("gpu-operator-rs")))
}

/// The cache directory and the paths inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    /// The layout for this process's environment.
    pub fn from_env() -> anyhow::Result<Self> {
        let var = std::env::var_os;
        let root = cache_root(
            var("GPU_OPERATOR_CACHE"),
            var("XDG_CACHE_HOME"),
            var("HOME"),
        )
        .context("no cache directory: set GPU_OPERATOR_CACHE (or HOME) to an absolute path")?;
        Ok(Self { root })
    }

    /// The toolchain unpacked from the Go module proxy.
    pub fn go_root(&self, version: GoVersion) -> PathBuf {
        self.root.join("go").join(format!("go{version}"))
    }

    /// The throwaway Go module a tool is built from.
    pub fn module_dir(&self, tool: &GoTool) -> PathBuf {
        self.root.join("gomod").join(tool.dir_name())
    }

    /// The finished build of a tool.
    pub fn tool_dir(&self, tool: &GoTool) -> PathBuf {
        self.root.join("tools").join(tool.dir_name())
    }

    /// Links to the binaries of every tool in `tools`.
    pub fn bin_dir(&self, tools: &[GoTool]) -> PathBuf {
        self.root.join("bin").join(versions::toolset_name(tools))
    }

    /// The full output of the go commands that built a tool.
    pub fn build_log(&self, tool: &GoTool) -> PathBuf {
        self.root
            .join("logs")
            .join(format!("build-{}.log", tool.dir_name()))
    }

    /// The one local cluster.
    pub fn state_dir(&self) -> PathBuf {
        self.root.join("cluster")
    }

    /// The API server of the oldest Kubernetes the chart claims, which runs beside the cluster while it is checked.
    pub fn oldest_api_state_dir(&self) -> PathBuf {
        self.root.join("cluster-oldest-api")
    }
}

/// `path` with `suffix` appended to its file name (`tools/kwok-v0.8.0` -> `tools/kwok-v0.8.0.partial`).
pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().map(OsString::from).unwrap_or_default();
    name.push(suffix);
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(value: &str) -> Option<OsString> {
        Some(OsString::from(value))
    }

    #[test]
    fn cache_root_prefers_the_project_variable_then_xdg_then_home() {
        assert_eq!(
            cache_root(os("/c"), os("/x"), os("/h")),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(
            cache_root(None, os("/x"), os("/h")),
            Some(PathBuf::from("/x/gpu-operator-rs"))
        );
        assert_eq!(
            cache_root(None, None, os("/h")),
            Some(PathBuf::from("/h/.cache/gpu-operator-rs"))
        );
        assert_eq!(
            cache_root(os(""), os("relative"), os("/h")),
            Some(PathBuf::from("/h/.cache/gpu-operator-rs"))
        );
        assert_eq!(cache_root(None, None, None), None);
    }

    #[test]
    fn layout_names_directories_by_version() {
        let layout = Layout {
            root: PathBuf::from("/c"),
        };
        let kwok = versions::kwok();
        assert_eq!(
            layout.tool_dir(&kwok),
            PathBuf::from("/c/tools/kwok-v0.8.0")
        );
        assert_eq!(
            layout.module_dir(&kwok),
            PathBuf::from("/c/gomod/kwok-v0.8.0")
        );
        assert_eq!(
            layout.build_log(&kwok),
            PathBuf::from("/c/logs/build-kwok-v0.8.0.log")
        );
        assert_eq!(
            layout.go_root(versions::GO_TOOLCHAIN),
            PathBuf::from("/c/go/go1.26.8")
        );
        assert_eq!(
            layout.bin_dir(&versions::all_tools()),
            PathBuf::from("/c/bin/etcd-v3.6.12_kwok-v0.8.0_helm-v4.3.1_kubernetes-v1.37.1")
        );
        assert_eq!(
            with_suffix(&layout.tool_dir(&kwok), ".partial"),
            PathBuf::from("/c/tools/kwok-v0.8.0.partial")
        );
    }
}
