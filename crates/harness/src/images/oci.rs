//! OCI images written without any container tool: deterministic layers, a config and a manifest per platform,
//! and an image index over the platforms, pushed to a registry (see `push`) or tarred as an OCI image layout
//! that `ctr images import` (and podman, skopeo, crane) read.
//!
//! Everything that could vary between two builds of the same inputs is fixed: file order (sorted), owners (0),
//! modification times (the commit time), gzip headers (no name, mtime 0) and JSON key order. The same inputs
//! therefore give the same digests on any machine.

use std::collections::BTreeMap;
use std::io::Write as _;

use flate2::Compression;
use serde::Serialize;
use sha2::{Digest as _, Sha256};

/// One file-system entry of a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Directory { mode: u32 },
    File { mode: u32, contents: Vec<u8> },
    Symlink { target: String },
}

/// A layer's entries by absolute path inside the image (`/usr/lib/...`); parents are added when missing.
#[derive(Debug, Clone, Default)]
pub struct LayerContents {
    entries: BTreeMap<String, Entry>,
}

impl LayerContents {
    /// Adds (or replaces) the entry at `path`, and any missing parent directory with mode 0755.
    pub fn insert(&mut self, path: &str, entry: Entry) {
        let path = normalize(path);
        let mut parent = String::new();
        for component in path
            .split('/')
            .collect::<Vec<_>>()
            .split_last()
            .map_or(&[][..], |(_, rest)| rest)
        {
            parent = if parent.is_empty() {
                component.to_string()
            } else {
                format!("{parent}/{component}")
            };
            self.entries
                .entry(parent.clone())
                .or_insert(Entry::Directory { mode: 0o755 });
        }
        self.entries.insert(path, entry);
    }

    /// The regular files whose paths start with `prefix` (no leading `/`), in path order.
    pub fn files_under<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a [u8])> + 'a {
        self.entries
            .range(prefix.to_string()..)
            .take_while(move |(path, _)| path.starts_with(prefix))
            .filter_map(|(path, entry)| match entry {
                Entry::File { contents, .. } => Some((path.as_str(), contents.as_slice())),
                _ => None,
            })
    }

    /// Writes the entries under `dir`, as a container runtime would unpack the layer.
    pub fn extract(&self, dir: &std::path::Path) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        for (path, entry) in &self.entries {
            let target = dir.join(path);
            match entry {
                Entry::Directory { mode } => {
                    std::fs::create_dir_all(&target)?;
                    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(*mode))?;
                }
                Entry::File { mode, contents } => {
                    std::fs::write(&target, contents)?;
                    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(*mode))?;
                }
                Entry::Symlink { target: link } => {
                    std::fs::remove_file(&target).ok();
                    std::os::unix::fs::symlink(link, &target)?;
                }
            }
        }
        Ok(())
    }

    /// The uncompressed tar of the entries, in path order, every owner 0 and every mtime `mtime`.
    fn tar(&self, mtime: u64) -> std::io::Result<Vec<u8>> {
        let mut builder = tar::Builder::new(Vec::new());
        builder.mode(tar::HeaderMode::Deterministic);
        for (path, entry) in &self.entries {
            let mut header = tar::Header::new_gnu();
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(mtime);
            match entry {
                Entry::Directory { mode } => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(*mode);
                    header.set_size(0);
                    builder.append_data(&mut header, format!("{path}/"), std::io::empty())?;
                }
                Entry::File { mode, contents } => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(*mode);
                    header.set_size(contents.len() as u64);
                    builder.append_data(&mut header, path, contents.as_slice())?;
                }
                Entry::Symlink { target } => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    builder.append_link(&mut header, path, target)?;
                }
            }
        }
        builder.into_inner()
    }

    /// The layer as the image stores it: gzip'd tar, its digest, and the digest of the uncompressed tar.
    pub fn build(&self, mtime: u64) -> std::io::Result<Layer> {
        let tar = self.tar(mtime)?;
        let diff_id = sha256(&tar);
        // No file name and mtime 0 in the gzip header: the compressed bytes depend on the tar alone.
        let mut encoder = flate2::GzBuilder::new()
            .mtime(0)
            .write(Vec::new(), Compression::best());
        encoder.write_all(&tar)?;
        let compressed = encoder.finish()?;
        Ok(Layer {
            digest: sha256(&compressed),
            diff_id,
            compressed,
        })
    }
}

/// Paths are kept without the leading `/`, as tar archives hold them.
fn normalize(path: &str) -> String {
    path.trim_start_matches('/')
        .trim_end_matches('/')
        .to_string()
}

/// A built layer.
#[derive(Debug, Clone)]
pub struct Layer {
    pub compressed: Vec<u8>,
    /// `sha256:<hex>` of the compressed bytes (the blob name).
    pub digest: String,
    /// `sha256:<hex>` of the uncompressed tar (the config's `rootfs.diff_ids`).
    pub diff_id: String,
}

/// What the image runs and how it is described.
#[derive(Debug, Clone)]
pub struct ImageConfig {
    /// The platform's architecture, as OCI (and Go, and Debian) name it: `amd64`, `arm64`.
    pub architecture: &'static str,
    pub entrypoint: Vec<String>,
    /// `uid:gid`, empty for root.
    pub user: String,
    pub env: Vec<String>,
    /// OCI annotations / labels (`org.opencontainers.image.*`).
    pub labels: BTreeMap<String, String>,
    /// Seconds since the epoch, written as the image's `created` time.
    pub created: u64,
}

/// One platform's image, ready to be written: its config and layers, bottom first.
#[derive(Debug)]
pub struct Image<'a> {
    pub config: ImageConfig,
    pub layers: Vec<&'a Layer>,
}

/// One platform's manifest with the blobs it names.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub architecture: &'static str,
    pub bytes: Vec<u8>,
    /// `sha256:<hex>` of [`Self::bytes`].
    pub digest: String,
    pub config: Vec<u8>,
    pub config_digest: String,
    pub layers: Vec<Layer>,
}

impl Manifest {
    /// Bytes a pull of this platform transfers: the compressed layers plus config and manifest.
    pub fn compressed_size(&self) -> u64 {
        self.layers
            .iter()
            .map(|layer| layer.compressed.len() as u64)
            .sum::<u64>()
            + self.config.len() as u64
            + self.bytes.len() as u64
    }
}

/// A multi-platform image: an OCI image index naming one manifest per platform, as registries serve it and
/// container runtimes resolve it (each node pulls the manifest of its own platform).
#[derive(Debug, Clone)]
pub struct ImageIndex {
    pub bytes: Vec<u8>,
    /// `sha256:<hex>` of [`Self::bytes`]: the digest a registry answers for the tag, and the one containerd and
    /// the kubelet report for a pulled image.
    pub digest: String,
    pub manifests: Vec<Manifest>,
    /// The images' creation time, also the modification time of the archive's entries.
    created: u64,
}

pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

#[derive(Serialize)]
struct Descriptor<'a> {
    #[serde(rename = "mediaType")]
    media_type: &'a str,
    digest: String,
    size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    platform: Option<Platform<'a>>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
}

#[derive(Serialize)]
struct Platform<'a> {
    architecture: &'a str,
    os: &'a str,
}

impl Image<'_> {
    /// The manifest of this platform's image, with its config and layers.
    pub fn manifest(&self) -> anyhow::Result<Manifest> {
        let config = self.config_json()?;
        let config_digest = sha256(&config);
        let layer_descriptors: Vec<Descriptor> = self
            .layers
            .iter()
            .map(|layer| Descriptor {
                media_type: LAYER_MEDIA_TYPE,
                digest: layer.digest.clone(),
                size: layer.compressed.len() as u64,
                platform: None,
                annotations: BTreeMap::new(),
            })
            .collect();
        let bytes = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": Descriptor {
                media_type: CONFIG_MEDIA_TYPE,
                digest: config_digest.clone(),
                size: config.len() as u64,
                platform: None,
                annotations: BTreeMap::new(),
            },
            "layers": layer_descriptors,
            "annotations": self.config.labels,
        }))?;
        Ok(Manifest {
            architecture: self.config.architecture,
            digest: sha256(&bytes),
            bytes,
            config,
            config_digest,
            layers: self.layers.iter().map(|layer| (*layer).clone()).collect(),
        })
    }

    fn config_json(&self) -> anyhow::Result<Vec<u8>> {
        let created = chrono_seconds(self.config.created);
        Ok(serde_json::to_vec(&serde_json::json!({
            "created": created,
            "architecture": self.config.architecture,
            "os": "linux",
            "config": {
                "User": self.config.user,
                "Env": self.config.env,
                "Entrypoint": self.config.entrypoint,
                "Labels": self.config.labels,
            },
            "rootfs": {
                "type": "layers",
                "diff_ids": self.layers.iter().map(|layer| layer.diff_id.clone()).collect::<Vec<_>>(),
            },
        }))?)
    }
}

impl ImageIndex {
    /// The index of `manifests` (one per platform, in the given order), annotated like each manifest.
    pub fn new(
        manifests: Vec<Manifest>,
        annotations: &BTreeMap<String, String>,
        created: u64,
    ) -> anyhow::Result<Self> {
        let descriptors: Vec<Descriptor> = manifests
            .iter()
            .map(|manifest| Descriptor {
                media_type: MANIFEST_MEDIA_TYPE,
                digest: manifest.digest.clone(),
                size: manifest.bytes.len() as u64,
                platform: Some(Platform {
                    architecture: manifest.architecture,
                    os: "linux",
                }),
                annotations: BTreeMap::new(),
            })
            .collect();
        let bytes = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": INDEX_MEDIA_TYPE,
            "manifests": descriptors,
            "annotations": annotations,
        }))?;
        Ok(Self {
            digest: sha256(&bytes),
            bytes,
            manifests,
            created,
        })
    }

    /// Every blob the manifests name (configs and layers), each once: what a registry must hold before the
    /// manifests can be pushed.
    pub fn blobs(&self) -> Vec<(&str, &[u8])> {
        let mut blobs: BTreeMap<&str, &[u8]> = BTreeMap::new();
        for manifest in &self.manifests {
            blobs.insert(&manifest.config_digest, &manifest.config);
            for layer in &manifest.layers {
                blobs.insert(&layer.digest, &layer.compressed);
            }
        }
        blobs.into_iter().collect()
    }

    /// The OCI image-layout archive (a tar) whose `index.json` names this index as `reference`.
    pub fn archive(&self, reference: &str) -> anyhow::Result<Vec<u8>> {
        let tag = reference
            .rsplit_once(':')
            .map_or("latest", |(_, tag)| tag)
            .to_string();
        let layout_index = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": INDEX_MEDIA_TYPE,
            "manifests": [Descriptor {
                media_type: INDEX_MEDIA_TYPE,
                digest: self.digest.clone(),
                size: self.bytes.len() as u64,
                platform: None,
                annotations: BTreeMap::from([
                    ("io.containerd.image.name".to_string(), reference.to_string()),
                    ("org.opencontainers.image.ref.name".to_string(), tag),
                ]),
            }],
        }))?;
        let mut layout = LayerContents::default();
        let blob = |digest: &str| format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"));
        let file = |contents: Vec<u8>| Entry::File {
            mode: 0o644,
            contents,
        };
        layout.insert(
            "oci-layout",
            file(br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()),
        );
        layout.insert("index.json", file(layout_index));
        layout.insert(&blob(&self.digest), file(self.bytes.clone()));
        for manifest in &self.manifests {
            layout.insert(&blob(&manifest.digest), file(manifest.bytes.clone()));
        }
        for (digest, contents) in self.blobs() {
            layout.insert(&blob(digest), file(contents.to_vec()));
        }
        Ok(layout.tar(self.created)?)
    }
}

/// `sha256:<hex>` of the bytes.
pub fn sha256(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let hex: String = hash.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("sha256:{hex}")
}

/// RFC 3339 UTC time of `seconds` since the epoch (civil-from-days, so no date crate is needed).
fn chrono_seconds(seconds: u64) -> String {
    let days = (seconds / 86_400) as i64;
    let rest = seconds % 86_400;
    let (hour, minute, second) = (rest / 3600, rest % 3600 / 60, rest % 60);
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contents() -> LayerContents {
        let mut layer = LayerContents::default();
        layer.insert(
            "/usr/local/bin/tool",
            Entry::File {
                mode: 0o755,
                contents: b"#!binary".to_vec(),
            },
        );
        layer.insert(
            "/lib64/ld-linux-x86-64.so.2",
            Entry::Symlink {
                target: "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2".into(),
            },
        );
        layer
    }

    fn image<'a>(layer: &'a Layer, architecture: &'static str) -> Image<'a> {
        Image {
            config: ImageConfig {
                architecture,
                entrypoint: vec!["/usr/local/bin/tool".into()],
                user: "65532:65532".into(),
                env: vec!["PATH=/usr/local/bin".into()],
                labels: BTreeMap::from([(
                    "org.opencontainers.image.version".into(),
                    "1.2.3".into(),
                )]),
                created: 1_700_000_000,
            },
            layers: vec![layer],
        }
    }

    fn index(layer: &Layer) -> ImageIndex {
        let manifests = ["amd64", "arm64"]
            .map(|architecture| image(layer, architecture).manifest().unwrap())
            .to_vec();
        ImageIndex::new(manifests, &BTreeMap::new(), 1_700_000_000).unwrap()
    }

    #[test]
    fn parents_are_added_and_entries_sorted() {
        let layer = contents();
        let paths: Vec<&String> = layer.entries.keys().collect();
        assert_eq!(
            paths,
            [
                "lib64",
                "lib64/ld-linux-x86-64.so.2",
                "usr",
                "usr/local",
                "usr/local/bin",
                "usr/local/bin/tool"
            ]
        );
    }

    #[test]
    fn the_same_inputs_give_the_same_digests() {
        let first = contents().build(1_700_000_000).unwrap();
        let second = contents().build(1_700_000_000).unwrap();
        assert_eq!(first.digest, second.digest);
        assert_eq!(first.compressed, second.compressed);
        let (a, b) = (index(&first), index(&second));
        assert_eq!(a.digest, b.digest);
        assert_eq!(
            a.archive("example.test/tool:1.2.3").unwrap(),
            b.archive("example.test/tool:1.2.3").unwrap()
        );
        // A different file time is a different layer.
        assert_ne!(
            contents().build(1_700_000_001).unwrap().digest,
            first.digest
        );
    }

    #[test]
    fn the_index_names_one_manifest_per_platform() {
        let layer = contents().build(0).unwrap();
        let index = index(&layer);
        assert_eq!(sha256(&index.bytes), index.digest);
        let json: serde_json::Value = serde_json::from_slice(&index.bytes).unwrap();
        assert_eq!(json["mediaType"], INDEX_MEDIA_TYPE);
        let platforms: Vec<(&str, &str)> = json["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|entry| {
                (
                    entry["platform"]["architecture"].as_str().unwrap(),
                    entry["digest"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            platforms,
            [
                ("amd64", index.manifests[0].digest.as_str()),
                ("arm64", index.manifests[1].digest.as_str())
            ]
        );
        let configs: Vec<serde_json::Value> = index
            .manifests
            .iter()
            .map(|manifest| serde_json::from_slice(&manifest.config).unwrap())
            .collect();
        assert_eq!(configs[0]["architecture"], "amd64");
        assert_eq!(configs[1]["architecture"], "arm64");
        // The shared layer is one blob; each platform has its own config.
        assert_eq!(index.blobs().len(), 3);
    }

    #[test]
    fn the_archive_is_an_oci_layout_that_names_the_image() {
        let layer = contents().build(0).unwrap();
        let index = index(&layer);
        let archive = index.archive("example.test/tool:1.2.3").unwrap();
        let mut files = BTreeMap::new();
        for entry in tar::Archive::new(archive.as_slice()).entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().display().to_string();
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
            files.insert(path, bytes);
        }
        let layout: serde_json::Value = serde_json::from_slice(&files["index.json"]).unwrap();
        let index_ref = &layout["manifests"][0];
        assert_eq!(index_ref["digest"], index.digest.as_str());
        assert_eq!(index_ref["mediaType"], INDEX_MEDIA_TYPE);
        assert_eq!(
            index_ref["annotations"]["io.containerd.image.name"],
            "example.test/tool:1.2.3"
        );
        assert_eq!(
            index_ref["annotations"]["org.opencontainers.image.ref.name"],
            "1.2.3"
        );
        let blob = |digest: &str| {
            &files[&format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"))]
        };
        assert_eq!(blob(&index.digest), &index.bytes);
        let arm64 = &index.manifests[1];
        let manifest: serde_json::Value = serde_json::from_slice(blob(&arm64.digest)).unwrap();
        let config_digest = manifest["config"]["digest"].as_str().unwrap();
        let config: serde_json::Value = serde_json::from_slice(blob(config_digest)).unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], layer.diff_id.as_str());
        assert_eq!(config["config"]["User"], "65532:65532");
        assert_eq!(config["created"], "2023-11-14T22:13:20Z");
        assert_eq!(config["architecture"], "arm64");
        assert_eq!(manifest["layers"][0]["digest"], layer.digest.as_str());
        assert_eq!(blob(&layer.digest), &layer.compressed);
    }
}
