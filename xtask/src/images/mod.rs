//! `cargo xtask images`: the OCI image archives of the operator, the node agent and the device plugin (release
//! builds, tagged with the chart's appVersion), plus the pod-sandbox ("pause") image the local real node needs and
//! the real-node tests' workload ("testapp"), all written without a registry or a container engine into `<cache>/images/`.
//!
//! Every image is two layers: the shared glibc userland from Debian's packages (see `userland`) and one binary.
//! The binaries are built with the target and cargo paths remapped, the layers with fixed owners and times
//! (the commit's), so the same commit gives the same digests wherever it is built.

mod oci;
mod userland;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

use crate::cluster::paths::Layout;
use crate::command;
use oci::{Entry, Image, ImageConfig, LayerContents};

/// Where the chart pulls this project's images from (`operator.repository` and friends in values.yaml).
pub const REPOSITORY: &str = "ghcr.io/gpu-operator-rs";

/// The source repository named in the images' OCI labels.
const SOURCE: &str = "https://github.com/gpu-operator-rs/gpu-operator-rs";

/// One of this project's binaries and the image that ships it.
#[derive(Debug, Clone, Copy)]
struct Component {
    image: &'static str,
    package: &'static str,
    binary: &'static str,
    /// Whether the image runs as the non-root user by default; the node-side ones need root for host paths,
    /// the kubelet's sockets and the GPU.
    nonroot: bool,
    description: &'static str,
}

const COMPONENTS: &[Component] = &[
    Component {
        image: "gpu-operator",
        package: "operator",
        binary: "gpu-operator",
        nonroot: true,
        description: "The cluster controller: reconciles the ClusterPolicy into operand DaemonSets.",
    },
    Component {
        image: "gpu-node-agent",
        package: "node-agent",
        binary: "gpu-node-agent",
        nonroot: false,
        description: "The per-node agent: MIG manager, feature discovery, exporter, validator, status exporter.",
    },
    Component {
        image: "gpu-device-plugin",
        package: "device-plugin",
        binary: "gpu-device-plugin",
        nonroot: false,
        description: "The kubelet device plugin: whole GPUs, MIG, time-slicing and MPS.",
    },
];

/// The pause image's name; the local node's containerd config points its sandbox image here.
pub const PAUSE_IMAGE: &str = "pause";
/// The real-node tests' workload: prints its environment, then waits (`images/testapp/testapp.c`).
pub const TESTAPP_IMAGE: &str = "testapp";

#[derive(Debug, Default, clap::Args)]
pub struct Args {
    /// Where to write the archives (default: `<cache>/images`).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// What was built, written next to the archives as `images.json` for the tools that import them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Built {
    pub reference: String,
    pub archive: PathBuf,
    pub digest: String,
    pub compressed_bytes: u64,
}

pub fn run(root: &Path, args: &Args) -> anyhow::Result<Vec<Built>> {
    let out = match &args.out {
        Some(out) => out.clone(),
        None => Layout::from_env()?.root.join("images"),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let version = chart_app_version(root)?;
    let revision = git(root, &["rev-parse", "HEAD"])?;
    let dirty = !git(root, &["status", "--porcelain"])?.is_empty();
    let created: u64 = git(root, &["log", "-1", "--format=%ct"])?
        .parse()
        .context("git log printed no commit time")?;

    say("building the release binaries");
    command::release_build(root, &release_targets())?;

    say("assembling the glibc userland from Debian packages");
    let cache = Layout::from_env()?.root.join("debs");
    let packages = userland::download(&cache)?;
    let mut base = LayerContents::default();
    for package in &packages {
        userland::unpack(package, &mut base)?;
    }
    let certificates = userland::certificates_in(&base);
    if certificates.is_empty() {
        bail!("the ca-certificates package held no certificates under /usr/share/ca-certificates");
    }
    userland::add_ca_bundle(&mut base, &certificates);
    userland::add_users(&mut base);
    let base_layer = base.build(created)?;
    let package_list = packages
        .iter()
        .map(|package| format!("{}={}", package.name, package.version))
        .collect::<Vec<_>>()
        .join(" ");

    let labels = |title: &str, description: &str| -> BTreeMap<String, String> {
        let revision = if dirty {
            format!("{revision}-dirty")
        } else {
            revision.clone()
        };
        BTreeMap::from([
            ("org.opencontainers.image.title".into(), title.to_string()),
            (
                "org.opencontainers.image.description".into(),
                description.to_string(),
            ),
            ("org.opencontainers.image.source".into(), SOURCE.to_string()),
            ("org.opencontainers.image.revision".into(), revision),
            ("org.opencontainers.image.version".into(), version.clone()),
            (
                "org.opencontainers.image.licenses".into(),
                "Apache-2.0".into(),
            ),
            (
                "io.gpu-operator-rs.debian-packages".into(),
                package_list.clone(),
            ),
        ])
    };

    let release = command::target_dir(root).join("release");
    let mut built = Vec::new();
    for component in COMPONENTS {
        let binary = std::fs::read(release.join(component.binary))
            .with_context(|| format!("the release build left no {}", component.binary))?;
        let path = format!("/usr/local/bin/{}", component.binary);
        let contents = single_file_contents(&path, binary);
        smoke_test(&[&base, &contents], &path)?;
        let layer = contents.build(created)?;
        let user = if component.nonroot {
            format!("{0}:{0}", userland::NONROOT_UID)
        } else {
            String::new()
        };
        let image = Image {
            config: ImageConfig {
                reference: format!("{REPOSITORY}/{}:{version}", component.image),
                entrypoint: vec![path],
                user,
                env: vec![
                    "PATH=/usr/local/bin:/usr/bin:/bin".into(),
                    "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt".into(),
                ],
                labels: labels(component.image, component.description),
                created,
            },
            layers: vec![&base_layer, &layer],
        };
        built.push(write(&out, component.image, &version, &image)?);
    }

    for (name, description) in [
        (
            PAUSE_IMAGE,
            "The pod sandbox process of the local real node.",
        ),
        (
            TESTAPP_IMAGE,
            "The real-node tests' workload: prints its environment, then waits.",
        ),
    ] {
        say(format!("building the {name} image"));
        let program = build_static_c(root, &out, name)?;
        let path = format!("/{name}");
        let layer = single_file_contents(&path, program).build(created)?;
        let image = Image {
            config: ImageConfig {
                reference: format!("{REPOSITORY}/{name}:{version}"),
                entrypoint: vec![path],
                user: "65535:65535".into(),
                env: Vec::new(),
                labels: labels(name, description),
                created,
            },
            layers: vec![&layer],
        };
        built.push(write(&out, name, &version, &image)?);
    }

    std::fs::write(
        out.join("images.json"),
        serde_json::to_string_pretty(&built)?,
    )?;
    println!("\n{}", report(&built));
    Ok(built)
}

/// The packages and binaries the images ship, as `cargo build` arguments.
fn release_targets() -> Vec<String> {
    COMPONENTS
        .iter()
        .flat_map(|component| ["--package", component.package, "--bin", component.binary])
        .map(str::to_string)
        .collect()
}

fn single_file_contents(path: &str, contents: Vec<u8>) -> LayerContents {
    let mut layer = LayerContents::default();
    layer.insert(
        path,
        Entry::File {
            mode: 0o755,
            contents,
        },
    );
    layer
}

fn write(out: &Path, name: &str, version: &str, image: &Image) -> anyhow::Result<Built> {
    let (archive, written) = image.archive()?;
    let path = out.join(format!("{name}-{version}.oci.tar"));
    std::fs::write(&path, archive).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(Built {
        reference: image.config.reference.clone(),
        archive: path,
        digest: written.manifest_digest,
        compressed_bytes: written.compressed_size,
    })
}

/// Runs `binary --help` inside the image's file system (chroot), so a missing library fails here, not in a pod.
fn smoke_test(layers: &[&LayerContents], binary: &str) -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        say(format!("not root: skipping the chroot check of {binary}"));
        return Ok(());
    }
    let rootfs = tempfile_dir()?;
    for layer in layers {
        layer.extract(&rootfs)?;
    }
    let output = Command::new("chroot")
        .arg(&rootfs)
        .args([binary, "--help"])
        .output()
        .context("cannot run chroot")?;
    std::fs::remove_dir_all(&rootfs).ok();
    if !output.status.success() {
        bail!(
            "{binary} does not start in its image: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("gpu-operator-image-check-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The program `images/<name>/<name>.c`, static, built with the machine's C compiler.
fn build_static_c(root: &Path, out: &Path, name: &str) -> anyhow::Result<Vec<u8>> {
    let binary = out.join(format!("{name}.bin"));
    let source = root.join(format!("images/{name}/{name}.c"));
    command::run(
        root,
        &[],
        "cc",
        &[
            "-static",
            "-Os",
            "-s",
            "-o",
            &binary.display().to_string(),
            &source.display().to_string(),
        ],
    )?;
    let contents = std::fs::read(&binary)?;
    std::fs::remove_file(&binary).ok();
    Ok(contents)
}

#[derive(Deserialize)]
struct ChartMetadata {
    #[serde(rename = "appVersion")]
    app_version: String,
}

fn chart_app_version(root: &Path) -> anyhow::Result<String> {
    let path = root.join("charts/gpu-operator/Chart.yaml");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let chart: ChartMetadata = serde_saphyr::from_str(&text)
        .with_context(|| format!("{}: no appVersion", path.display()))?;
    Ok(chart.app_version)
}

fn git(root: &Path, args: &[&str]) -> anyhow::Result<String> {
    Ok(command::output(
        &[],
        "git",
        &[&["-C", &root.display().to_string()], args].concat(),
    )?
    .trim()
    .to_string())
}

fn report(built: &[Built]) -> String {
    let mut table = String::from("| image | digest | compressed |\n|---|---|---|\n");
    for image in built {
        table.push_str(&format!(
            "| {} | {} | {:.1} MB |\n",
            image.reference,
            image.digest,
            image.compressed_bytes as f64 / 1_000_000.0
        ));
    }
    table
}

fn say(message: impl AsRef<str>) {
    eprintln!("images: {}", message.as_ref());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_pulls_from_the_repository_the_images_are_tagged_with() {
        let root = crate::crdgen::workspace_root();
        let values = std::fs::read_to_string(root.join("charts/gpu-operator/values.yaml")).unwrap();
        for component in COMPONENTS {
            assert!(
                values.contains(&format!("image: {}", component.image)),
                "values.yaml names no image {}",
                component.image
            );
        }
        assert!(values.contains(&format!("repository: {REPOSITORY}")));
    }

    /// The project has one version: the workspace's, which every crate inherits (so every binary's `--version`
    /// prints it), is the chart's `version` and `appVersion`, and the images are tagged with the appVersion.
    #[test]
    fn images_chart_and_crates_share_the_workspace_version() {
        #[derive(Deserialize)]
        struct ChartVersions {
            version: String,
            #[serde(rename = "appVersion")]
            app_version: String,
        }
        let root = crate::crdgen::workspace_root();
        // xtask inherits the workspace version, as the loop below checks of every member.
        let workspace_version = env!("CARGO_PKG_VERSION");
        let chart_path = root.join("charts/gpu-operator/Chart.yaml");
        let chart: ChartVersions =
            serde_saphyr::from_str(&std::fs::read_to_string(&chart_path).unwrap()).unwrap();
        assert_eq!(
            chart.version, workspace_version,
            "Chart.yaml version differs from the workspace version in Cargo.toml"
        );
        assert_eq!(
            chart.app_version, workspace_version,
            "Chart.yaml appVersion differs from the workspace version in Cargo.toml"
        );
        assert_eq!(chart_app_version(&root).unwrap(), workspace_version);

        let workspace = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let members = workspace_members(&workspace);
        assert!(members.contains(&"xtask"), "{members:?}");
        for member in members {
            let manifest = std::fs::read_to_string(root.join(member).join("Cargo.toml")).unwrap();
            assert!(
                manifest
                    .lines()
                    .any(|line| line.trim() == "version.workspace = true"),
                "{member}/Cargo.toml does not inherit the workspace version (version.workspace = true)"
            );
        }
    }

    /// The paths of the workspace's `members = [ ... ]` list, one quoted path a line as Cargo.toml writes them.
    fn workspace_members(cargo_toml: &str) -> Vec<&str> {
        cargo_toml
            .lines()
            .skip_while(|line| !line.starts_with("members = ["))
            .skip(1)
            .take_while(|line| !line.starts_with(']'))
            .map(|line| line.trim().trim_end_matches(',').trim_matches('"'))
            .collect()
    }
}
