//! Every pinned version of the local cluster's tools, in one place.
//!
//! Bumping a version here changes the name of that tool's build directory in the cache, so the next `cluster up`
//! rebuilds exactly that tool.

/// `k8s.io/kubernetes`: the control plane, kubectl, and the kubelet the device-plugin tests join to the cluster.
/// v1.37.2 is not usable: the Go module proxy refuses its zip.
pub const KUBERNETES: &str = "v1.37.1";
/// The oldest Kubernetes the chart claims (`kubeVersion: ">=1.33.0-0"` in Chart.yaml): only its API server is built,
/// for the check that the chart's defaults install there and the operator reconciles against it. Its newest patch
/// release that the module proxy serves.
pub const KUBERNETES_OLDEST: &str = "v1.33.13";
/// `go.etcd.io/etcd/server/v3`; its module root is the etcd server's main package.
pub const ETCD: &str = "v3.6.12";
/// `sigs.k8s.io/kwok`; we run the `kwok` controller directly (no kwokctl).
pub const KWOK: &str = "v0.8.0";
/// `helm.sh/helm/v4`.
pub const HELM: &str = "v4.3.1";
/// `github.com/google/go-containerregistry`, whose `cmd/registry` is the test cluster's local registry.
pub const GO_CONTAINERREGISTRY: &str = "v0.22.1";
/// NVIDIA's gpu-operator, which `cargo xtask bench` measures ours against: release v25.3.2, commit 616690d88d86 of
/// 2025-07-24. Its module path lacks the major version (`/v25`), so its release tags are not module versions; Go
/// names the commit by a pseudo-version on the last v1 tag among its ancestors (v1.8.2). v25.3.2 is the newest
/// release whose every dependency the module proxy serves here (v25.10.1 needs a k8s-operator-libs commit it
/// refuses; v26.x too).
pub const NVIDIA_GPU_OPERATOR: &str = "v1.8.3-0.20250724212111-616690d88d86";
/// The release tag of [`NVIDIA_GPU_OPERATOR`], for reports.
pub const NVIDIA_GPU_OPERATOR_RELEASE: &str = "v25.3.2";
/// go.sum lines of [`NVIDIA_GPU_OPERATOR`]: the checksum database does not know this pseudo-version, so the hashes
/// are pinned here (taken from the first download) and the module's own go.sum vouches for its dependencies.
const NVIDIA_GPU_OPERATOR_SUMS: &[&str] = &[
    "github.com/NVIDIA/gpu-operator v1.8.3-0.20250724212111-616690d88d86 h1:KcEKuIVSUY5XJZTzLjbpD3DRPcQTLwkX1DyzuCZHYKU=",
    "github.com/NVIDIA/gpu-operator v1.8.3-0.20250724212111-616690d88d86/go.mod h1:EkmCOAWVMphjgnRpbqXhpArJQrOJjbKsoHcrklnisfU=",
];

/// The oldest Go toolchain that builds all of the above (`go` directive of their go.mod files).
pub const GO_MINIMUM: GoVersion = GoVersion {
    major: 1,
    minor: 26,
    patch: 0,
};
/// The toolchain installed into the cache when `go` is missing or older than [`GO_MINIMUM`].
pub const GO_TOOLCHAIN: GoVersion = GoVersion {
    major: 1,
    minor: 26,
    patch: 8,
};
/// SHA-256 of the `golang.org/toolchain` module zip of [`GO_TOOLCHAIN`] by `<os>-<arch>` (Go's names), checked
/// before the zip is unpacked. Taken from the proxy's zips, whose `h1:` hashes match the Go checksum
/// database's (`golang.org/toolchain v0.0.1-go1.26.8.linux-amd64 h1:ZOmGe1OnfREDMIdb1Qi4G9JSuDPBLGExZMQ4nis1RXM=`,
/// `...linux-arm64 h1:sYL/O6MqS68ML0kjsQ36WoYIpJqkw60TxizWUYUKQMc=`). Bumping [`GO_TOOLCHAIN`] means new digests.
pub const GO_TOOLCHAIN_SHA256: [(&str, &str); 2] = [
    (
        "linux-amd64",
        "30c2b1bf7dcc88d3eb0a1364e47ddd9128edb3110a30e8a0ef61cd5856b31de7",
    ),
    (
        "linux-arm64",
        "02b36b6787b3ac767668f630e2998df45a3b1f9ffee08d1bf3ef6487cd658d99",
    ),
];

/// A Go release number such as `1.26.8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct GoVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl GoVersion {
    /// Parses what `go env GOVERSION` prints: `go1.26.8`, `go1.26`, `go1.27rc1`, `go1.26.8 X:nocoverageredesign`.
    pub fn parse(text: &str) -> Option<Self> {
        let rest = text.trim().strip_prefix("go")?;
        let rest = rest.split_whitespace().next()?;
        let mut parts = rest.split('.');
        let major = leading_number(parts.next()?)?;
        let minor = leading_number(parts.next()?)?;
        let patch = parts.next().and_then(leading_number).unwrap_or(0);
        Some(Self {
            major,
            minor,
            patch,
        })
    }
}

impl std::fmt::Display for GoVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

fn leading_number(text: &str) -> Option<u32> {
    let end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    text[..end].parse().ok()
}

/// How the binaries of one tool are named when `go build` writes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// `go build -o <dir>/ pkgs...`: each binary is named after the last element of its package path.
    Directory,
    /// `go build -o <dir>/<name> pkg`: one package, whose default name would be wrong (etcd's is `server`).
    Single(&'static str),
}

/// One Go program (or several from one module) that the cluster needs, built from the Go module proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoTool {
    /// Short name, used for directories and progress messages.
    pub name: &'static str,
    /// The module to require.
    pub module: &'static str,
    pub version: &'static str,
    /// Main packages, built in one `go build`.
    pub packages: &'static [&'static str],
    /// The binaries that the build leaves in the tool's directory.
    pub binaries: &'static [&'static str],
    pub output: Output,
    /// `-X` settings, without the `-X`.
    pub version_ldflags: Vec<String>,
    /// Whether the module's go.mod replaces the `k8s.io/*` staging modules with local paths, which a consumer must
    /// replace with their published versions.
    pub kubernetes_staging: bool,
    /// Files or directories copied from the module's source tree into the tool's directory (e.g. kwok's default
    /// stages), by their last path element.
    pub module_files: &'static [&'static str],
    /// go.sum lines for a module version the checksum database does not know; when set, the module's own go.sum is
    /// trusted for its dependencies.
    pub pinned_sums: &'static [&'static str],
    /// Built without cgo (`CGO_ENABLED=0`), as a static binary that runs in an empty root.
    pub static_binary: bool,
}

impl GoTool {
    /// The directory name that identifies this build: a version bump gives a new directory, hence a rebuild.
    pub fn dir_name(&self) -> String {
        format!("{}-{}", self.name, self.version)
    }

    /// The `-ldflags` argument for `go build`: no symbol table or DWARF (`-s -w`, as Kubernetes' own release
    /// builds): nobody debugs these test tools, and writing the debug information of nine large binaries is a
    /// good part of their link time on a cold CI machine.
    pub fn ldflags(&self) -> String {
        ["-s", "-w"]
            .into_iter()
            .map(str::to_owned)
            .chain(
                self.version_ldflags
                    .iter()
                    .map(|setting| format!("-X {setting}")),
            )
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// kwok's default stages, as kwokctl would load them: nodes become Ready and keep a lease, pods become Ready,
/// complete and go away on deletion.
pub const KWOK_STAGE_FILES: &[&str] = &[
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
];

pub fn kubernetes() -> GoTool {
    GoTool {
        name: "kubernetes",
        packages: &[
            "k8s.io/kubernetes/cmd/kube-apiserver",
            "k8s.io/kubernetes/cmd/kube-controller-manager",
            "k8s.io/kubernetes/cmd/kube-scheduler",
            "k8s.io/kubernetes/cmd/kubectl",
            "k8s.io/kubernetes/cmd/kubelet",
        ],
        binaries: &[
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubectl",
            "kubelet",
        ],
        ..kubernetes_module(KUBERNETES)
    }
}

/// The API server of [`KUBERNETES_OLDEST`], a tool of its own (it joins no toolset: the cluster runs
/// [`KUBERNETES`]).
pub fn kube_apiserver_oldest() -> GoTool {
    GoTool {
        name: "kube-apiserver",
        packages: &["k8s.io/kubernetes/cmd/kube-apiserver"],
        binaries: &["kube-apiserver"],
        ..kubernetes_module(KUBERNETES_OLDEST)
    }
}

/// kube-proxy, from the same module as [`kubernetes`] but built on its own: only the real node needs it, and a
/// separate tool leaves the cached control-plane build (and the toolset's name) as they are.
pub fn kube_proxy() -> GoTool {
    GoTool {
        name: "kube-proxy",
        packages: &["k8s.io/kubernetes/cmd/kube-proxy"],
        binaries: &["kube-proxy"],
        ..kubernetes_module(KUBERNETES)
    }
}

/// What every build from `k8s.io/kubernetes` at `version` shares: the module, its version and the version stamps.
fn kubernetes_module(version: &'static str) -> GoTool {
    let minor = version
        .trim_start_matches('v')
        .split('.')
        .nth(1)
        .unwrap_or_default();
    let mut ldflags = Vec::new();
    for package in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        ldflags.push(format!("{package}.gitVersion={version}"));
        ldflags.push(format!("{package}.gitMajor=1"));
        ldflags.push(format!("{package}.gitMinor={minor}"));
    }
    GoTool {
        name: "kubernetes",
        module: "k8s.io/kubernetes",
        version,
        packages: &[],
        binaries: &[],
        output: Output::Directory,
        version_ldflags: ldflags,
        kubernetes_staging: true,
        module_files: &[],
        pinned_sums: &[],
        static_binary: false,
    }
}

pub fn etcd() -> GoTool {
    GoTool {
        name: "etcd",
        module: "go.etcd.io/etcd/server/v3",
        version: ETCD,
        packages: &["go.etcd.io/etcd/server/v3"],
        binaries: &["etcd"],
        output: Output::Single("etcd"),
        version_ldflags: Vec::new(),
        kubernetes_staging: false,
        module_files: &[],
        pinned_sums: &[],
        static_binary: false,
    }
}

pub fn kwok() -> GoTool {
    GoTool {
        name: "kwok",
        module: "sigs.k8s.io/kwok",
        version: KWOK,
        packages: &["sigs.k8s.io/kwok/cmd/kwok"],
        binaries: &["kwok"],
        output: Output::Directory,
        version_ldflags: vec![format!(
            "sigs.k8s.io/kwok/pkg/consts.Version={}",
            KWOK.trim_start_matches('v')
        )],
        kubernetes_staging: false,
        module_files: KWOK_STAGE_FILES,
        pinned_sums: &[],
        static_binary: false,
    }
}

pub fn helm() -> GoTool {
    GoTool {
        name: "helm",
        module: "helm.sh/helm/v4",
        version: HELM,
        packages: &["helm.sh/helm/v4/cmd/helm"],
        binaries: &["helm"],
        output: Output::Directory,
        version_ldflags: vec![format!("helm.sh/helm/v4/internal/version.version={HELM}")],
        kubernetes_staging: false,
        module_files: &[],
        pinned_sums: &[],
        static_binary: false,
    }
}

/// go-containerregistry's registry: an OCI distribution server that keeps what is pushed in memory, on loopback,
/// without TLS. The real-node tests push the images to it and the real node pulls them from it. Built on its own
/// (not part of the toolset), since only the real-node run needs it.
pub fn registry() -> GoTool {
    GoTool {
        name: "registry",
        module: "github.com/google/go-containerregistry",
        version: GO_CONTAINERREGISTRY,
        packages: &["github.com/google/go-containerregistry/cmd/registry"],
        binaries: &["registry"],
        output: Output::Directory,
        version_ldflags: Vec::new(),
        kubernetes_staging: false,
        module_files: &[],
        pinned_sums: &[],
        static_binary: false,
    }
}

/// NVIDIA's operator, with what it reads at run time: its manifests (`assets`, `manifests`) and its Helm chart
/// (`gpu-operator`, with the CRDs). Static, as NVIDIA builds it, so that it runs in a root of its own where its
/// hard-coded paths (`/opt/gpu-operator`, `/host-etc`) exist.
pub fn nvidia_gpu_operator() -> GoTool {
    GoTool {
        name: "nvidia-gpu-operator",
        module: "github.com/NVIDIA/gpu-operator",
        version: NVIDIA_GPU_OPERATOR,
        packages: &["github.com/NVIDIA/gpu-operator/cmd/gpu-operator"],
        // Not `gpu-operator`: that is the name of its chart's directory, copied next to it.
        binaries: &["nvidia-gpu-operator"],
        output: Output::Single("nvidia-gpu-operator"),
        version_ldflags: Vec::new(),
        kubernetes_staging: false,
        module_files: &["assets", "manifests", "deployments/gpu-operator"],
        pinned_sums: NVIDIA_GPU_OPERATOR_SUMS,
        static_binary: true,
    }
}

/// All tools, in build order (the small ones first, so a failure shows early).
/// The version of the `k8s.io/*` staging modules published with Kubernetes `version`: `v1.37.1` has `v0.37.1`.
pub fn staging_version(version: &str) -> String {
    match version.strip_prefix("v1.") {
        Some(rest) => format!("v0.{rest}"),
        None => version.to_owned(),
    }
}

pub fn all_tools() -> Vec<GoTool> {
    vec![etcd(), kwok(), helm(), kubernetes()]
}

/// The name of the directory of links to every tool's binaries: changes whenever any version does.
pub fn toolset_name(tools: &[GoTool]) -> String {
    tools
        .iter()
        .map(GoTool::dir_name)
        .collect::<Vec<_>>()
        .join("_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_modules_share_the_minor_and_patch() {
        assert_eq!(staging_version("v1.37.1"), "v0.37.1");
        assert_eq!(staging_version(KUBERNETES_OLDEST), "v0.33.13");
        let oldest = kube_apiserver_oldest();
        assert_eq!(oldest.dir_name(), "kube-apiserver-v1.33.13");
        assert!(
            oldest
                .ldflags()
                .contains("k8s.io/component-base/version.gitMinor=33")
        );
    }

    #[test]
    fn parses_go_versions() {
        assert_eq!(
            GoVersion::parse("go1.26.8"),
            Some(GoVersion {
                major: 1,
                minor: 26,
                patch: 8
            })
        );
        assert_eq!(
            GoVersion::parse("go1.26\n"),
            Some(GoVersion {
                major: 1,
                minor: 26,
                patch: 0
            })
        );
        assert_eq!(
            GoVersion::parse("go1.27rc1"),
            Some(GoVersion {
                major: 1,
                minor: 27,
                patch: 0
            })
        );
        assert_eq!(
            GoVersion::parse("go1.26.8 X:nocoverageredesign"),
            Some(GoVersion {
                major: 1,
                minor: 26,
                patch: 8
            })
        );
        assert_eq!(GoVersion::parse("devel"), None);
        assert!(GoVersion::parse("go1.25.9").unwrap() < GO_MINIMUM);
        assert!(GO_TOOLCHAIN >= GO_MINIMUM);
    }

    #[test]
    fn kubernetes_ldflags_set_both_version_packages() {
        let flags = kubernetes().ldflags();
        assert_eq!(
            flags,
            "-s -w -X k8s.io/component-base/version.gitVersion=v1.37.1 -X k8s.io/component-base/version.gitMajor=1 \
             -X k8s.io/component-base/version.gitMinor=37 -X k8s.io/client-go/pkg/version.gitVersion=v1.37.1 \
             -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=37"
        );
        assert_eq!(etcd().ldflags(), "-s -w");
    }

    #[test]
    fn a_version_bump_renames_the_toolset() {
        let mut tools = all_tools();
        let before = toolset_name(&tools);
        assert_eq!(
            before,
            "etcd-v3.6.12_kwok-v0.8.0_helm-v4.3.1_kubernetes-v1.37.1"
        );
        tools[2].version = "v4.3.2";
        assert_ne!(toolset_name(&tools), before);
    }
}
