//! Plain HTTPS downloads from the Go module proxy (the only place this needs to reach).

use std::time::Duration;

use anyhow::Context as _;

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
