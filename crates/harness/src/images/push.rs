//! `cargo xtask images --push REGISTRY/PREFIX`: every image to a registry with the OCI distribution protocol
//! (oci-client): the blobs the registry lacks, each platform's manifest by digest, then the image index under the
//! version's tag. The manifests and the index are pushed as the bytes that were built, so the registry serves the
//! digests `images.json` records; the tag is read back to check that.

use std::str::FromStr;

use anyhow::Context as _;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};

use super::oci::{INDEX_MEDIA_TYPE, ImageIndex, MANIFEST_MEDIA_TYPE};
use super::say;

/// Where `--push` puts the images: a registry host (with its port, if any) and a path prefix in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub registry: String,
    /// Without leading or trailing `/`; may be empty (images at the registry's top level).
    pub prefix: String,
}

impl FromStr for Destination {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> anyhow::Result<Self> {
        let text = text.trim().trim_end_matches('/');
        anyhow::ensure!(
            !text.contains("://"),
            "{text}: name the registry without a scheme (REGISTRY/PREFIX, e.g. registry.example.com/gpu-operator-rs); \
             --insecure selects plain HTTP"
        );
        let (registry, prefix) = text.split_once('/').unwrap_or((text, ""));
        anyhow::ensure!(
            !registry.is_empty(),
            "{text}: no registry (REGISTRY/PREFIX)"
        );
        Ok(Self {
            registry: registry.to_owned(),
            prefix: prefix.to_owned(),
        })
    }
}

impl Destination {
    /// The repository of image `name` in the registry (without the registry).
    pub fn repository(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{}/{name}", self.prefix)
        }
    }

    /// Whether the registry is on this machine, where registries commonly run without TLS (as the test
    /// cluster's does).
    fn is_local(&self) -> bool {
        let host = self
            .registry
            .rsplit_once(':')
            .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
            .map_or(self.registry.as_str(), |(host, _)| host);
        matches!(host, "localhost" | "127.0.0.1" | "[::1]")
    }
}

/// Pushes each `(name, index)` as `<destination>/<name>:<version>`; returns those references, in order.
pub fn push(
    destination: &Destination,
    insecure: bool,
    version: &str,
    indexes: &[(&str, ImageIndex)],
) -> anyhow::Result<Vec<String>> {
    // The workspace's one TLS provider; reqwest is built without one of its own.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let protocol = if insecure || destination.is_local() {
        ClientProtocol::Http
    } else {
        ClientProtocol::Https
    };
    let client = Client::new(ClientConfig {
        protocol,
        ..ClientConfig::default()
    });
    let auth = match (
        std::env::var("REGISTRY_USERNAME"),
        std::env::var("REGISTRY_PASSWORD"),
    ) {
        (Ok(user), Ok(password)) => RegistryAuth::Basic(user, password),
        _ => RegistryAuth::Anonymous,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let mut pushed = Vec::new();
    for (name, index) in indexes {
        let reference = Reference::with_tag(
            destination.registry.clone(),
            destination.repository(name),
            version.to_owned(),
        );
        runtime
            .block_on(push_index(&client, &auth, &reference, index))
            .with_context(|| format!("cannot push {reference}"))?;
        say(format!("pushed {reference} ({})", index.digest));
        pushed.push(reference.whole());
    }
    Ok(pushed)
}

async fn push_index(
    client: &Client,
    auth: &RegistryAuth,
    reference: &Reference,
    index: &ImageIndex,
) -> anyhow::Result<()> {
    client
        .auth(reference, auth, RegistryOperation::Push)
        .await
        .context("the registry refused the credentials (REGISTRY_USERNAME, REGISTRY_PASSWORD)")?;
    for (digest, contents) in index.blobs() {
        if client.blob_exists(reference, digest).await? {
            continue;
        }
        match client.push_blob(reference, contents.to_vec(), digest).await {
            // go-containerregistry's registry (the test cluster's) answers a finished upload with 201 Created but
            // without the Location the distribution spec asks for; the blob is stored all the same, which the check
            // below confirms.
            Ok(_) | Err(OciDistributionError::RegistryNoLocationError) => {}
            Err(error) => return Err(error).with_context(|| format!("blob {digest}")),
        }
        anyhow::ensure!(
            client.blob_exists(reference, digest).await?,
            "the registry accepted blob {digest} but does not have it"
        );
    }
    // Each platform's manifest goes under its own tag, `<version>-<architecture>`, before the index that names it
    // by digest. Not by digest: oci-client panics when a registry answers a manifest pushed by digest without a
    // Location header (go-containerregistry's registry, the test cluster's, and Amazon ECR do), and the tags let
    // a user pull one platform's image by name.
    let version = reference.tag().context("the index reference has a tag")?;
    let platform_reference = |architecture: &str| {
        Reference::with_tag(
            reference.registry().to_owned(),
            reference.repository().to_owned(),
            format!("{version}-{architecture}"),
        )
    };
    for manifest in &index.manifests {
        client
            .push_manifest_raw(
                &platform_reference(manifest.architecture),
                manifest.bytes.clone(),
                http::HeaderValue::from_static(MANIFEST_MEDIA_TYPE),
            )
            .await
            .with_context(|| format!("the linux/{} manifest", manifest.architecture))?;
    }
    client
        .push_manifest_raw(
            reference,
            index.bytes.clone(),
            http::HeaderValue::from_static(INDEX_MEDIA_TYPE),
        )
        .await
        .context("the image index")?;
    let (_, served) = client
        .pull_manifest_raw(reference, auth, &[INDEX_MEDIA_TYPE])
        .await
        .context("reading the pushed index back")?;
    anyhow::ensure!(
        served == index.digest,
        "the registry serves {served} for the tag, not the pushed index {}",
        index.digest
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_registry_and_prefix() {
        let destination: Destination = "127.0.0.1:5000/gpu-operator-rs".parse().unwrap();
        assert_eq!(destination.registry, "127.0.0.1:5000");
        assert_eq!(destination.repository("pause"), "gpu-operator-rs/pause");
        assert!(destination.is_local());
        let destination: Destination = "registry.example.com/team/gpu/".parse().unwrap();
        assert_eq!(
            destination.repository("gpu-operator"),
            "team/gpu/gpu-operator"
        );
        assert!(!destination.is_local());
        let destination: Destination = "localhost:5000".parse().unwrap();
        assert_eq!(destination.repository("testapp"), "testapp");
        assert!(destination.is_local());
        assert!(
            "https://registry.example.com/x"
                .parse::<Destination>()
                .is_err()
        );
        assert!("/x".parse::<Destination>().is_err());
    }
}
