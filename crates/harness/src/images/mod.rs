//! `cargo xtask images`: the OCI images of the operator, the node agent, the device plugin and the DRA driver
//! (release builds, or with `--profile test` unoptimised ones for the tests; tagged with the chart's appVersion),
//! plus the pod-sandbox ("pause") image the local real node needs and the real-node tests' workload ("testapp"),
//! each for linux/amd64 and linux/arm64 under one OCI image index, written without a container engine as archives
//! into `<cache>/images/` and, with `--push`, to a registry.
//!
//! Every image is two layers: the shared glibc userland from Debian's packages of its architecture (see
//! `userland`) and one binary. The arm64 binaries are cross-compiled with Debian's cross toolchain
//! (`gcc-aarch64-linux-gnu` as cargo's linker), and checked under qemu-user in their image's file system. The
//! binaries are built with the target and cargo paths remapped, the layers with fixed owners and times (the
//! commit's), so the same commit gives the same digests wherever it is built.

mod oci;
mod push;
mod userland;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

use crate::cluster::paths::Layout;
use crate::command;
use oci::{Entry, Image, ImageConfig, ImageIndex, LayerContents};
pub use push::Destination;

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
    Component {
        image: "gpu-dra-driver",
        package: "dra-driver",
        binary: "gpu-dra-driver",
        nonroot: false,
        description: "The DRA driver gpu.nvidia.com: fractional GPUs through Dynamic Resource Allocation.",
    },
];

/// A platform the images are built for.
#[derive(Debug, Clone, Copy)]
struct Platform {
    /// The architecture as OCI, Go and Debian name it.
    architecture: &'static str,
    /// The Rust target, named even for the build machine's own: with `--target`, build scripts and proc macros
    /// are built without the release flags, so one cargo run builds them once for both platforms.
    rust_target: &'static str,
    /// The C compiler of the platform: the static pause and testapp programs, and cargo's linker.
    cc: &'static str,
    /// How a binary of this platform is run on the build machine for the check; `None`: natively, in a chroot.
    emulator: Option<&'static str>,
}

/// amd64, the build machine's, and arm64 (GH200, GB200 and GB300 nodes), cross-built.
const PLATFORMS: [Platform; 2] = [
    Platform {
        architecture: "amd64",
        rust_target: "x86_64-unknown-linux-gnu",
        cc: "cc",
        emulator: None,
    },
    Platform {
        architecture: "arm64",
        rust_target: "aarch64-unknown-linux-gnu",
        cc: "aarch64-linux-gnu-gcc",
        emulator: Some("/usr/bin/qemu-aarch64"),
    },
];

/// Debian's packages for cross-building and checking the arm64 images, each with a file that shows it installed:
/// the cross compiler (cargo's linker), the arm64 C library to link against, and qemu-user to run the binaries.
const CROSS_PACKAGES: [(&str, &str); 3] = [
    ("gcc-aarch64-linux-gnu", "/usr/bin/aarch64-linux-gnu-gcc"),
    ("libc6-dev-arm64-cross", "/usr/aarch64-linux-gnu/lib/crt1.o"),
    ("qemu-user", "/usr/bin/qemu-aarch64"),
];

/// The pause image's name; the local node's containerd config points its sandbox image here.
pub const PAUSE_IMAGE: &str = "pause";
/// The real-node tests' workload: prints its environment, then waits (`images/testapp/testapp.c`).
pub const TESTAPP_IMAGE: &str = "testapp";

#[derive(Debug, Default, clap::Args)]
pub struct Args {
    /// Where to write the archives (default: `<cache>/images`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Push every image, as an index of its linux/amd64 and linux/arm64 images, to REGISTRY/PREFIX (e.g.
    /// `registry.example.com/gpu-operator-rs`): `<REGISTRY/PREFIX>/<image>:<version>`. Credentials, where the
    /// registry wants them, come from REGISTRY_USERNAME and REGISTRY_PASSWORD.
    #[arg(long, value_name = "REGISTRY/PREFIX")]
    pub push: Option<Destination>,
    /// Talk plain HTTP to the registry (a local one without TLS); automatic for localhost and 127.0.0.1.
    #[arg(long)]
    pub insecure: bool,
    /// How the binaries are built.
    #[arg(long, value_enum, default_value_t)]
    pub profile: Profile,
}

/// How the images' binaries are built.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// Cargo's `release` profile: the images a release publishes.
    #[default]
    Release,
    /// Cargo's `test-images` profile, without optimisation: the same code built in a fraction of the time, which
    /// the end-to-end tests on the real node run, so that a cold CI run builds both platforms beside the tests.
    Test,
}

impl Profile {
    /// The cargo profile, which is also the name of its directory under the target's.
    fn cargo_profile(self) -> &'static str {
        match self {
            Profile::Release => "release",
            Profile::Test => "test-images",
        }
    }
}

/// What was built, written next to the archives as `images.json` for the tools that use them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Built {
    /// Where the image was pushed, `<registry>/<prefix>/<image>:<version>`; without `--push`, the chart's default
    /// repository.
    pub reference: String,
    pub archive: PathBuf,
    /// The image index's digest: what the registry answers for the tag, and what a node reports after a pull.
    pub digest: String,
    pub platforms: Vec<BuiltPlatform>,
}

impl Built {
    /// Reads the `images.json` a build wrote.
    pub fn read_all(path: &Path) -> anyhow::Result<Vec<Self>> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{} is no list of images", path.display()))
    }

    /// The image's name: the last part of its repository (`gpu-operator` of `<registry>/<prefix>/gpu-operator:1.0`).
    pub fn name(&self) -> &str {
        let repository = self.repository();
        repository
            .rsplit_once('/')
            .map_or(repository, |(_, name)| name)
    }

    /// `<repository>@<digest>`: what the kubelet reports as a container's `imageID` once containerd has pulled
    /// the image by its tag (the digest is the index's, which the tag resolves to).
    pub fn digest_reference(&self) -> String {
        format!("{}@{}", self.repository(), self.digest)
    }

    /// The platforms of the index, as `linux/<architecture>`.
    pub fn platform_names(&self) -> Vec<String> {
        self.platforms
            .iter()
            .map(|platform| format!("linux/{}", platform.architecture))
            .collect()
    }

    fn repository(&self) -> &str {
        // The tag follows the last `:` after the last `/` (a registry's port has a `/` after it).
        match self.reference.rsplit_once(':') {
            Some((repository, tag)) if !tag.contains('/') => repository,
            _ => &self.reference,
        }
    }
}

/// One platform's image in an index.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BuiltPlatform {
    pub architecture: String,
    /// The platform's manifest digest.
    pub digest: String,
    pub compressed_bytes: u64,
}

pub fn run(root: &Path, args: &Args) -> anyhow::Result<Vec<Built>> {
    anyhow::ensure!(
        std::env::consts::ARCH == "x86_64",
        "the images are built on an amd64 machine (arm64 is cross-compiled from there); this one is {}",
        std::env::consts::ARCH
    );
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

    prepare_platforms()?;
    say(format!(
        "building the binaries for every platform (cargo profile {})",
        args.profile.cargo_profile()
    ));
    let (env, build_args) = platforms_build(root, args.profile);
    let build_args: Vec<&str> = build_args.iter().map(String::as_str).collect();
    command::run(root, &env, &command::cargo(), &build_args)?;

    let labels = |title: &str, description: &str, packages: &str| -> BTreeMap<String, String> {
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
                packages.to_string(),
            ),
        ])
    };

    // Per image, its manifests in the order of PLATFORMS.
    let mut manifests: BTreeMap<&str, Vec<oci::Manifest>> = BTreeMap::new();
    let mut annotations: BTreeMap<&str, BTreeMap<String, String>> = BTreeMap::new();
    for platform in &PLATFORMS {
        say(format!(
            "assembling the {} glibc userland from Debian packages",
            platform.architecture
        ));
        let cache = Layout::from_env()?.root.join("debs");
        let packages = userland::download(&cache, platform.architecture)?;
        let mut base = LayerContents::default();
        for package in &packages {
            userland::unpack(package, &mut base)?;
        }
        let certificates = userland::certificates_in(&base);
        if certificates.is_empty() {
            bail!(
                "the ca-certificates package held no certificates under /usr/share/ca-certificates"
            );
        }
        userland::add_ca_bundle(&mut base, &certificates);
        userland::add_users(&mut base);
        let base_layer = base.build(created)?;
        // Without the architecture qualifiers, so that both platforms' images carry the same labels.
        let package_list = packages
            .iter()
            .map(|package| {
                let name = package.name.split(':').next().unwrap_or(&package.name);
                format!("{name}={}", package.version)
            })
            .collect::<Vec<_>>()
            .join(" ");

        let binaries = binaries_dir(root, platform, args.profile);
        for component in COMPONENTS {
            let binary = std::fs::read(binaries.join(component.binary)).with_context(|| {
                format!(
                    "the {} build left no {}",
                    platform.architecture, component.binary
                )
            })?;
            let path = format!("/usr/local/bin/{}", component.binary);
            let contents = single_file_contents(&path, binary);
            check_version(platform, &[&base, &contents], &path)?;
            let layer = contents.build(created)?;
            let user = if component.nonroot {
                format!("{0}:{0}", userland::NONROOT_UID)
            } else {
                String::new()
            };
            let labels = labels(component.image, component.description, &package_list);
            let image = Image {
                config: ImageConfig {
                    architecture: platform.architecture,
                    entrypoint: vec![path],
                    user,
                    env: vec![
                        "PATH=/usr/local/bin:/usr/bin:/bin".into(),
                        "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt".into(),
                    ],
                    labels: labels.clone(),
                    created,
                },
                layers: vec![&base_layer, &layer],
            };
            manifests
                .entry(component.image)
                .or_default()
                .push(image.manifest()?);
            annotations.insert(component.image, labels);
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
            say(format!(
                "building the {} {name} image",
                platform.architecture
            ));
            let program = build_static_c(root, &out, name, platform)?;
            let path = format!("/{name}");
            let layer = single_file_contents(&path, program).build(created)?;
            // Static programs: no Debian package in them.
            let labels = labels(name, description, "");
            let image = Image {
                config: ImageConfig {
                    architecture: platform.architecture,
                    entrypoint: vec![path],
                    user: "65535:65535".into(),
                    env: Vec::new(),
                    labels: labels.clone(),
                    created,
                },
                layers: vec![&layer],
            };
            manifests.entry(name).or_default().push(image.manifest()?);
            annotations.insert(name, labels);
        }
    }

    let mut indexes = Vec::new();
    for (name, manifests) in manifests {
        let index = ImageIndex::new(manifests, &annotations[name], created)?;
        indexes.push((name, index));
    }
    let mut built = Vec::new();
    for (name, index) in &indexes {
        let reference = format!("{REPOSITORY}/{name}:{version}");
        let archive = out.join(format!("{name}-{version}.oci.tar"));
        std::fs::write(&archive, index.archive(&reference)?)
            .with_context(|| format!("cannot write {}", archive.display()))?;
        built.push(Built {
            reference,
            archive,
            digest: index.digest.clone(),
            platforms: index
                .manifests
                .iter()
                .map(|manifest| BuiltPlatform {
                    architecture: manifest.architecture.to_string(),
                    digest: manifest.digest.clone(),
                    compressed_bytes: manifest.compressed_size(),
                })
                .collect(),
        });
    }
    if let Some(destination) = &args.push {
        let pushed = push::push(destination, args.insecure, &version, &indexes)?;
        for (image, reference) in built.iter_mut().zip(pushed) {
            image.reference = reference;
        }
    }

    std::fs::write(
        out.join("images.json"),
        serde_json::to_string_pretty(&built)?,
    )?;
    println!("\n{}", report(&built));
    Ok(built)
}

/// What every platform's build needs from the machine: Debian's cross toolchain and qemu-user, each
/// architecture's packages known to apt, and the Rust standard library of each target.
fn prepare_platforms() -> anyhow::Result<()> {
    crate::apt::ensure(&CROSS_PACKAGES)?;
    for platform in &PLATFORMS {
        crate::apt::ensure_architecture(platform.architecture)?;
        ensure_rust_target(platform.rust_target)?;
    }
    Ok(())
}

/// The build of the images' binaries for every platform, as the environment and arguments of one cargo run (which builds the build scripts and proc macros once, and keeps both cores busy across both targets); each
/// platform's C compiler is its linker, set for this build only, so that no cargo configuration changes anyone's
/// other builds.
fn platforms_build(root: &Path, profile: Profile) -> (Vec<(String, String)>, Vec<String>) {
    let mut env = command::release_env(root);
    let mut args: Vec<String> = ["build", "--profile", profile.cargo_profile(), "--locked"]
        .map(String::from)
        .into();
    for platform in &PLATFORMS {
        let variable = platform.rust_target.to_uppercase().replace('-', "_");
        env.push((
            format!("CARGO_TARGET_{variable}_LINKER"),
            platform.cc.to_string(),
        ));
        // For build scripts that compile C for the target (ring's assembly, under kube's TLS).
        env.push((
            format!("CC_{}", platform.rust_target.replace('-', "_")),
            platform.cc.to_string(),
        ));
        args.extend(["--target".to_string(), platform.rust_target.to_string()]);
    }
    args.extend(release_targets());
    (env, args)
}

/// The images' build, started at the lowest CPU priority with its output in `log`: `cargo xtask test`
/// starts it before the end-to-end tests against the local cluster, which leave the cores idle much of the time
/// (waiting for the API server, kubelets and controllers), so that a cold build costs the run little time; [`run`]
/// later finds it done. The debug builds of those tests go on beside it, since cargo locks each profile's
/// directory on its own.
pub fn build_in_background(
    root: &Path,
    profile: Profile,
    log: &Path,
) -> anyhow::Result<BackgroundBuild> {
    prepare_platforms()?;
    let (env, args) = platforms_build(root, profile);
    let output =
        std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    say(format!(
        "building the images' binaries for every platform (cargo profile {}) in the background, at the lowest CPU \
         priority (log: {})",
        profile.cargo_profile(),
        log.display()
    ));
    let child = Command::new("nice")
        .args(["-n", "19", &command::cargo()])
        .args(&args)
        .current_dir(root)
        .envs(env)
        .stdout(output.try_clone()?)
        .stderr(output)
        // Its own process group, so that a cancel stops cargo's compilers too.
        .process_group(0)
        .spawn()
        .context("cannot start the background release build")?;
    Ok(BackgroundBuild {
        child,
        log: log.to_path_buf(),
        started: std::time::Instant::now(),
    })
}

/// A build running in the background (see [`build_in_background`]).
#[derive(Debug)]
pub struct BackgroundBuild {
    child: std::process::Child,
    log: PathBuf,
    started: std::time::Instant,
}

impl BackgroundBuild {
    /// Waits for the build; fails, naming its log, when it failed.
    pub fn finish(mut self) -> anyhow::Result<()> {
        let status = self.child.wait()?;
        anyhow::ensure!(
            status.success(),
            "the images' background build failed ({status}); see {}",
            self.log.display()
        );
        say(format!(
            "the images' background build is done, {:.0} s after it started",
            self.started.elapsed().as_secs_f64()
        ));
        Ok(())
    }

    /// Stops the build, when what it was for failed anyway.
    pub fn cancel(mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let _ = self.child.wait();
    }
}

/// Installs the Rust standard library of `target` with rustup when the toolchain lacks it.
fn ensure_rust_target(target: &str) -> anyhow::Result<()> {
    let sysroot = command::output(&[], "rustc", &["--print", "sysroot"])?;
    if Path::new(sysroot.trim())
        .join("lib/rustlib")
        .join(target)
        .exists()
    {
        return Ok(());
    }
    command::run(Path::new("."), &[], "rustup", &["target", "add", target])
}

/// Where cargo leaves the binaries of `platform` built with `profile`.
fn binaries_dir(root: &Path, platform: &Platform, profile: Profile) -> PathBuf {
    command::target_dir(root)
        .join(platform.rust_target)
        .join(profile.cargo_profile())
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

/// Runs `binary --version` in the image's file system and prints what it printed, so that a missing library or
/// a binary of the wrong architecture fails the build, not a pod: natively in a chroot (which needs root; skipped
/// otherwise), and the cross-built ones under qemu-user with the image's file system as their root for the
/// dynamic loader and libraries (`-L`).
fn check_version(
    platform: &Platform,
    layers: &[&LayerContents],
    binary: &str,
) -> anyhow::Result<()> {
    let root = nix::unistd::geteuid().is_root();
    if platform.emulator.is_none() && !root {
        say(format!("not root: skipping the chroot check of {binary}"));
        return Ok(());
    }
    let rootfs = tempfile_dir()?;
    for layer in layers {
        layer.extract(&rootfs)?;
    }
    let (shown, output) = match platform.emulator {
        None => (
            format!(
                "chroot <{} image> {binary} --version",
                platform.architecture
            ),
            Command::new("chroot")
                .arg(&rootfs)
                .args([binary, "--version"])
                .output()
                .context("cannot run chroot"),
        ),
        Some(emulator) => (
            format!(
                "{emulator} -L <{} image> <{0} image>{binary} --version",
                platform.architecture
            ),
            Command::new(emulator)
                .arg("-L")
                .arg(&rootfs)
                .arg(rootfs.join(binary.trim_start_matches('/')))
                .arg("--version")
                .output()
                .with_context(|| format!("cannot run {emulator}")),
        ),
    };
    std::fs::remove_dir_all(&rootfs).ok();
    let output = output?;
    if !output.status.success() {
        bail!(
            "{binary} does not start in its {} image ({shown}): {}",
            platform.architecture,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    say(format!(
        "{shown}: {}",
        String::from_utf8_lossy(&output.stdout).trim()
    ));
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("gpu-operator-image-check-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The program `images/<name>/<name>.c`, static, built with the platform's C compiler.
fn build_static_c(
    root: &Path,
    out: &Path,
    name: &str,
    platform: &Platform,
) -> anyhow::Result<Vec<u8>> {
    let binary = out.join(format!("{name}-{}.bin", platform.architecture));
    let source = root.join(format!("images/{name}/{name}.c"));
    command::run(
        root,
        &[],
        platform.cc,
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
    let mut table = String::from(
        "| image | index digest | platform | manifest digest | compressed |\n|---|---|---|---|---|\n",
    );
    for image in built {
        for platform in &image.platforms {
            table.push_str(&format!(
                "| {} | {} | linux/{} | {} | {:.1} MB |\n",
                image.reference,
                image.digest,
                platform.architecture,
                platform.digest,
                platform.compressed_bytes as f64 / 1_000_000.0
            ));
        }
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
    fn a_pushed_image_is_named_and_pinned_by_its_index_digest() {
        let pushed = Built {
            reference: "127.0.0.1:5000/gpu-operator-rs/gpu-node-agent:0.1.0".into(),
            archive: PathBuf::from("gpu-node-agent.oci.tar"),
            digest: "sha256:abc".into(),
            platforms: ["amd64", "arm64"]
                .map(|architecture| BuiltPlatform {
                    architecture: architecture.into(),
                    digest: format!("sha256:{architecture}"),
                    compressed_bytes: 1,
                })
                .into(),
        };
        assert_eq!(pushed.name(), "gpu-node-agent");
        assert_eq!(
            pushed.digest_reference(),
            "127.0.0.1:5000/gpu-operator-rs/gpu-node-agent@sha256:abc"
        );
        assert_eq!(pushed.platform_names(), ["linux/amd64", "linux/arm64"]);
        let untagged = Built {
            reference: "127.0.0.1:5000/testapp".into(),
            ..pushed
        };
        assert_eq!(untagged.name(), "testapp");
        assert_eq!(
            untagged.digest_reference(),
            "127.0.0.1:5000/testapp@sha256:abc"
        );
    }

    #[test]
    fn the_chart_pulls_from_the_repository_the_images_are_tagged_with() {
        let root = crate::workspace_root();
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
        let root = crate::workspace_root();
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
