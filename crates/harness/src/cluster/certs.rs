//! The cluster's PKI, made fresh for every `cluster up`: a CA, the apiserver's serving certificate, one client
//! certificate per identity, and the service-account signing key.

use std::net::IpAddr;

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// A certificate and its private key, both PEM.
#[derive(Debug, Clone)]
pub struct CertAndKey {
    pub cert_pem: String,
    pub key_pem: String,
}

/// Who a client certificate says its holder is: Kubernetes takes the user from the CN and groups from the O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// Also the file-name stem of its kubeconfig.
    pub name: &'static str,
    pub user: &'static str,
    pub group: Option<&'static str>,
}

/// Full access: for people, kubectl, helm, the tests and kwok (which writes the status of every node and pod).
pub const ADMIN: Identity = Identity {
    name: "admin",
    user: "admin",
    group: Some("system:masters"),
};
/// The bootstrap RBAC roles of the controller manager and the scheduler are bound to these users.
pub const CONTROLLER_MANAGER: Identity = Identity {
    name: "controller-manager",
    user: "system:kube-controller-manager",
    group: None,
};
pub const SCHEDULER: Identity = Identity {
    name: "scheduler",
    user: "system:kube-scheduler",
    group: None,
};

/// Everything `cluster up` writes as PEM files.
#[derive(Debug)]
pub struct Pki {
    pub ca: CertAndKey,
    pub apiserver: CertAndKey,
    pub clients: Vec<(Identity, CertAndKey)>,
    /// Signs service-account tokens (apiserver) and is given to the controller manager.
    pub service_account_key_pem: String,
    /// Verifies service-account tokens.
    pub service_account_public_pem: String,
}

/// Makes a CA, a serving certificate for the apiserver (loopback, `localhost`, the in-cluster names and
/// `service_ip`, the first address of the service range), and client certificates for `identities`.
pub fn generate(service_ip: IpAddr, identities: &[Identity]) -> anyhow::Result<Pki> {
    let ca_key = KeyPair::generate().context("generating the CA key")?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = name("gpu-operator-rs local cluster CA", None);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .context("signing the CA certificate")?;
    let ca = CertAndKey {
        cert_pem: ca_cert.pem(),
        key_pem: ca_key.serialize_pem(),
    };
    let issuer = Issuer::new(ca_params, ca_key);

    let dns = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ];
    let mut serving =
        CertificateParams::new(dns.map(String::from).to_vec()).context("apiserver SANs")?;
    serving
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::from([127, 0, 0, 1])));
    serving
        .subject_alt_names
        .push(SanType::IpAddress(service_ip));
    serving.distinguished_name = name("kube-apiserver", None);
    serving.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let apiserver = sign(&serving, &issuer).context("signing the apiserver certificate")?;

    let clients = identities
        .iter()
        .map(|identity| {
            let mut params = CertificateParams::default();
            params.distinguished_name = name(identity.user, identity.group);
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let cert = sign(&params, &issuer)
                .with_context(|| format!("signing the {} certificate", identity.name))?;
            Ok((*identity, cert))
        })
        .collect::<anyhow::Result<_>>()?;

    let service_account = KeyPair::generate().context("generating the service-account key")?;
    Ok(Pki {
        ca,
        apiserver,
        clients,
        service_account_key_pem: service_account.serialize_pem(),
        service_account_public_pem: service_account.public_key_pem(),
    })
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    if let Some(organization) = organization {
        name.push(DnType::OrganizationName, organization);
    }
    name
}

fn sign(params: &CertificateParams, issuer: &Issuer<'_, KeyPair>) -> anyhow::Result<CertAndKey> {
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    Ok(CertAndKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::extensions::GeneralName;
    use x509_parser::pem::parse_x509_pem;

    /// Parses a PEM certificate and hands it to `check`.
    fn with_cert(pem: &str, check: impl FnOnce(&x509_parser::certificate::X509Certificate<'_>)) {
        let (_, pem) = parse_x509_pem(pem.as_bytes()).unwrap();
        check(&pem.parse_x509().unwrap());
    }

    #[test]
    fn makes_a_serving_certificate_for_loopback_and_client_identities() {
        let service_ip = IpAddr::from([10, 96, 0, 1]);
        let pki = generate(service_ip, &[ADMIN, SCHEDULER]).unwrap();

        let (_, ca_pem) = parse_x509_pem(pki.ca.cert_pem.as_bytes()).unwrap();
        let ca = ca_pem.parse_x509().unwrap();
        assert!(ca.is_ca());

        with_cert(&pki.apiserver.cert_pem, |cert| {
            cert.verify_signature(Some(ca.public_key())).unwrap();
            let names = &cert
                .subject_alternative_name()
                .unwrap()
                .unwrap()
                .value
                .general_names;
            for wanted in [
                GeneralName::IPAddress(&[127, 0, 0, 1]),
                GeneralName::IPAddress(&[10, 96, 0, 1]),
                GeneralName::DNSName("localhost"),
                GeneralName::DNSName("kubernetes.default.svc"),
            ] {
                assert!(names.contains(&wanted), "{wanted:?} missing from {names:?}");
            }
        });

        let client = |identity| {
            pki.clients
                .iter()
                .find(|(made, _)| *made == identity)
                .map(|(_, cert)| cert)
        };
        with_cert(&client(ADMIN).unwrap().cert_pem, |cert| {
            cert.verify_signature(Some(ca.public_key())).unwrap();
            assert_eq!(cert.subject().to_string(), "CN=admin, O=system:masters");
        });
        with_cert(&client(SCHEDULER).unwrap().cert_pem, |cert| {
            assert_eq!(cert.subject().to_string(), "CN=system:kube-scheduler");
        });
        assert!(client(CONTROLLER_MANAGER).is_none());
        assert!(pki.service_account_key_pem.contains("PRIVATE KEY"));
        assert!(pki.service_account_public_pem.contains("PUBLIC KEY"));
    }
}
