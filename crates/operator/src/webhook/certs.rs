//! The webhook's TLS material (pure but for the clock and the random keys): a CA of its own and a serving
//! certificate it signs, valid for a year and renewed a month before they expire. The API server trusts the CA
//! through the webhook configuration's `caBundle`.

use std::net::IpAddr;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::crypto::ring::default_provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use time::{Duration, OffsetDateTime};
use x509_parser::certificate::X509Certificate;

/// How long a certificate is valid.
const VALIDITY: Duration = Duration::days(365);
/// How long before it expires a certificate is renewed.
pub const RENEW_BEFORE: Duration = Duration::days(30);

/// The PEM files the webhook serves with and the API server trusts.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsMaterial {
    /// The CA certificate (the `caBundle`).
    pub ca_pem: String,
    /// The serving certificate.
    pub cert_pem: String,
    /// The serving certificate's private key.
    pub key_pem: String,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial").finish_non_exhaustive()
    }
}

/// Why TLS material cannot be made or read.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A certificate could not be generated.
    #[error("cannot generate the webhook certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// Stored material cannot be served: not PEM, not a certificate or key, a key of another certificate, a
    /// certificate the CA did not sign.
    #[error("{0}")]
    Unusable(String),
}

/// A new CA and a serving certificate for `hosts` (DNS names or IP addresses), valid from `now` for a year.
///
/// # Errors
/// When a key or certificate cannot be generated.
pub fn generate(hosts: &[String], now: OffsetDateTime) -> Result<TlsMaterial, CertError> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name = name("gpu-operator webhook CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = now - Duration::minutes(5);
    ca.not_after = now + VALIDITY;
    let ca_pem = ca.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca, ca_key);

    let mut serving = CertificateParams::default();
    serving.distinguished_name = name("gpu-operator webhook");
    serving.subject_alt_names = hosts
        .iter()
        .map(|host| match host.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => Ok(SanType::DnsName(host.as_str().try_into()?)),
        })
        .collect::<Result<_, rcgen::Error>>()?;
    serving.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    serving.not_before = now - Duration::minutes(5);
    serving.not_after = now + VALIDITY;
    let key = KeyPair::generate()?;
    let cert_pem = serving.signed_by(&key, &issuer)?.pem();
    Ok(TlsMaterial {
        ca_pem,
        cert_pem,
        key_pem: key.serialize_pem(),
    })
}

/// Whether stored material must be replaced at `now`: it expires within [`RENEW_BEFORE`], or its serving
/// certificate does not name every host (the Service or URL changed).
///
/// # Errors
/// [`CertError::Unusable`] when the material cannot be served as it is: the CA or the serving certificate is not
/// a PEM certificate, the CA did not sign the serving certificate (the API server would not trust it), or the
/// key is not a private key of the serving certificate (no handshake would succeed).
pub fn needs_renewal(
    material: &TlsMaterial,
    hosts: &[String],
    now: OffsetDateTime,
) -> Result<bool, CertError> {
    let ca_pem = parse_pem(&material.ca_pem, "the CA")?;
    let ca = parse_certificate(&ca_pem, "the CA")?;
    if !ca.is_ca() {
        return Err(CertError::Unusable("the CA is not a CA certificate".into()));
    }
    let cert_pem = parse_pem(&material.cert_pem, "the serving certificate")?;
    let cert = parse_certificate(&cert_pem, "the serving certificate")?;
    if cert.verify_signature(Some(ca.public_key())).is_err() {
        return Err(CertError::Unusable(
            "the serving certificate is not signed by the CA".into(),
        ));
    }
    certified_key(material)?;
    let expires = cert.validity().not_after.timestamp();
    if expires - (now + RENEW_BEFORE).unix_timestamp() <= 0 {
        return Ok(true);
    }
    let named: Vec<String> = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|names| {
            names
                .value
                .general_names
                .iter()
                .map(|name| match name {
                    x509_parser::extensions::GeneralName::DNSName(dns) => (*dns).to_owned(),
                    x509_parser::extensions::GeneralName::IPAddress(bytes) => match bytes.len() {
                        4 => IpAddr::from(<[u8; 4]>::try_from(*bytes).unwrap_or_default())
                            .to_string(),
                        16 => IpAddr::from(<[u8; 16]>::try_from(*bytes).unwrap_or_default())
                            .to_string(),
                        _ => String::new(),
                    },
                    other => other.to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(hosts.iter().any(|host| !named.contains(host)))
}

/// The serving certificate and its key as rustls presents them.
///
/// # Errors
/// [`CertError::Unusable`] when the certificate or key is not PEM, or the key is not the certificate's.
pub fn certified_key(material: &TlsMaterial) -> Result<Arc<CertifiedKey>, CertError> {
    let unusable =
        |what: &str, error: &dyn std::fmt::Display| CertError::Unusable(format!("{what}: {error}"));
    let chain = CertificateDer::pem_slice_iter(material.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| unusable("the serving certificate is not PEM", &error))?;
    let key = PrivateKeyDer::from_pem_slice(material.key_pem.as_bytes())
        .map_err(|error| unusable("the private key is not a PEM private key", &error))?;
    // `from_der` compares the key's public half with the certificate's, so a key of another certificate is
    // refused here rather than in every handshake.
    CertifiedKey::from_der(chain, key, &default_provider())
        .map(Arc::new)
        .map_err(|error| {
            unusable(
                "the private key does not fit the serving certificate",
                &error,
            )
        })
}

fn parse_pem(pem: &str, what: &str) -> Result<x509_parser::pem::Pem, CertError> {
    x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map(|(_, pem)| pem)
        .map_err(|error| CertError::Unusable(format!("{what} is not PEM: {error}")))
}

fn parse_certificate<'a>(
    pem: &'a x509_parser::pem::Pem,
    what: &str,
) -> Result<X509Certificate<'a>, CertError> {
    pem.parse_x509()
        .map_err(|error| CertError::Unusable(format!("{what} is not a certificate: {error}")))
}

fn name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts() -> Vec<String> {
        vec![
            "gpu-operator-webhook.gpu-operator.svc".into(),
            "127.0.0.1".into(),
        ]
    }

    #[test]
    fn material_is_renewed_a_month_before_it_expires_or_when_the_hosts_change() {
        let issued = OffsetDateTime::now_utc();
        let material = generate(&hosts(), issued).unwrap();
        assert!(material.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(material.key_pem.contains("PRIVATE KEY"));
        assert!(!needs_renewal(&material, &hosts(), issued).unwrap());
        assert!(!needs_renewal(&material, &hosts(), issued + Duration::days(334)).unwrap());
        assert!(needs_renewal(&material, &hosts(), issued + Duration::days(336)).unwrap());
        let moved = vec!["other.gpu-operator.svc".to_owned()];
        assert!(needs_renewal(&material, &moved, issued).unwrap());
    }

    #[test]
    fn the_serving_certificate_is_signed_by_the_ca_and_names_its_hosts() {
        let material = generate(&hosts(), OffsetDateTime::now_utc()).unwrap();
        let (_, ca) = x509_parser::pem::parse_x509_pem(material.ca_pem.as_bytes()).unwrap();
        let ca = ca.parse_x509().unwrap();
        let (_, serving) = x509_parser::pem::parse_x509_pem(material.cert_pem.as_bytes()).unwrap();
        let serving = serving.parse_x509().unwrap();
        assert_eq!(serving.issuer(), ca.subject());
        assert!(serving.verify_signature(Some(ca.public_key())).is_ok());
        assert!(ca.is_ca());
    }

    /// Why `needs_renewal` refuses `material`, which must not be served.
    fn unusable(material: &TlsMaterial) -> String {
        match needs_renewal(material, &hosts(), OffsetDateTime::now_utc()) {
            Err(CertError::Unusable(why)) => why,
            other => panic!("served as it is: {other:?}"),
        }
    }

    #[test]
    fn garbage_is_unusable_not_a_renewal() {
        let now = OffsetDateTime::now_utc();
        let good = generate(&hosts(), now).unwrap();

        let mut material = good.clone();
        material.cert_pem = "not a certificate".into();
        assert!(unusable(&material).starts_with("the serving certificate is not PEM"));

        let mut material = good.clone();
        material.ca_pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".into();
        assert!(unusable(&material).starts_with("the CA is not a certificate"));

        let mut material = good.clone();
        material.ca_pem = good.cert_pem.clone();
        assert_eq!(unusable(&material), "the CA is not a CA certificate");

        let mut material = good.clone();
        material.key_pem = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".into();
        assert!(
            unusable(&material).starts_with("the private key does not fit"),
            "{}",
            unusable(&material)
        );

        let mut material = good.clone();
        material.key_pem = "no key here".into();
        assert!(unusable(&material).starts_with("the private key is not a PEM private key"));
    }

    #[test]
    fn a_key_of_another_certificate_is_unusable() {
        let now = OffsetDateTime::now_utc();
        let mut material = generate(&hosts(), now).unwrap();
        material.key_pem = generate(&hosts(), now).unwrap().key_pem;
        assert!(
            unusable(&material).starts_with("the private key does not fit the serving certificate"),
            "{}",
            unusable(&material)
        );
        assert!(certified_key(&material).is_err());
    }

    #[test]
    fn a_certificate_another_ca_signed_is_unusable() {
        let now = OffsetDateTime::now_utc();
        let mut material = generate(&hosts(), now).unwrap();
        material.ca_pem = generate(&hosts(), now).unwrap().ca_pem;
        assert_eq!(
            unusable(&material),
            "the serving certificate is not signed by the CA"
        );
    }

    #[test]
    fn generated_material_is_served_as_it_is() {
        let material = generate(&hosts(), OffsetDateTime::now_utc()).unwrap();
        let key = certified_key(&material).unwrap();
        assert_eq!(key.cert.len(), 1);
        assert!(key.keys_match().is_ok());
    }
}
