//! Plain HTTPS downloads from the Go module proxy (the only place this needs to reach), and the digest check that
//! an archive passes before it is unpacked.

use std::time::Duration;

use anyhow::Context as _;
use sha2::{Digest as _, Sha256};

/// The most a download may be: the Go toolchain zip is about 80 MiB.
const MAX_BODY: u64 = 512 * 1024 * 1024;

fn agent() -> ureq::Agent {
    // The machine's trust store, not a built-in list: networks that inspect TLS install their CA there.
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_global(Some(Duration::from_secs(900)))
        .build()
        .into()
}

/// GETs `url` and returns its body.
pub fn get_bytes(url: &str) -> anyhow::Result<Vec<u8>> {
    let mut response = agent()
        .get(url)
        .call()
        .with_context(|| format!("GET {url}"))?;
    response
        .body_mut()
        .with_config()
        .limit(MAX_BODY)
        .read_to_vec()
        .with_context(|| format!("reading {url}"))
}

/// GETs `url` and returns its body as text.
pub fn get_text(url: &str) -> anyhow::Result<String> {
    String::from_utf8(get_bytes(url)?).with_context(|| format!("{url} is not UTF-8 text"))
}

/// Fails unless `bytes`, the download `name`, have the SHA-256 `expected` (lower-case hex). TLS only vouches for
/// the server; the pinned digest makes a changed or tampered archive an error instead of something we unpack.
pub fn verify_sha256(name: &str, bytes: &[u8], expected: &str) -> anyhow::Result<()> {
    let actual: String = Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    anyhow::ensure!(
        actual == expected,
        "{name} has SHA-256 {actual}, but {expected} is pinned for it (crates/harness/src/cluster/versions.rs); refusing to \
         unpack it"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_the_pinned_digest() {
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        verify_sha256("abc.zip", b"abc", abc).unwrap();
        let error = verify_sha256("abd.zip", b"abd", abc)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(
                "abd.zip has SHA-256 a52d159f262b2c6ddb724a61840befc36eb30c88877a4030b65cbe86298449c9,"
            ),
            "{error}"
        );
        assert!(error.contains(abc), "{error}");
    }
}
