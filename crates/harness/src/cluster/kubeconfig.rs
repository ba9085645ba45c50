//! kubeconfig files with the certificates embedded, so a copy works anywhere on the machine.

use base64::Engine as _;
use serde::Serialize;

use super::certs::CertAndKey;

/// The cluster and context name in every kubeconfig we write.
pub const CLUSTER_NAME: &str = "gpu-operator-rs";

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct File<'a> {
    api_version: &'a str,
    kind: &'a str,
    clusters: [Named<'a, Cluster<'a>>; 1],
    users: [Named<'a, User>; 1],
    contexts: [Named<'a, Context<'a>>; 1],
    current_context: &'a str,
}

#[derive(Serialize)]
struct Named<'a, T> {
    name: &'a str,
    #[serde(flatten)]
    value: T,
}

#[derive(Serialize)]
struct Cluster<'a> {
    cluster: ClusterFields<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct ClusterFields<'a> {
    server: &'a str,
    certificate_authority_data: String,
}

#[derive(Serialize)]
struct User {
    user: UserFields,
}

/// How the user authenticates: a client certificate (the cluster's own identities) or a bearer token (a
/// ServiceAccount's, so a process runs with exactly that account's RBAC).
#[derive(Serialize)]
#[serde(untagged, rename_all = "kebab-case")]
enum UserFields {
    #[serde(rename_all = "kebab-case")]
    Certificate {
        client_certificate_data: String,
        client_key_data: String,
    },
    Token {
        token: String,
    },
}

#[derive(Serialize)]
struct Context<'a> {
    context: ContextFields<'a>,
}

#[derive(Serialize)]
struct ContextFields<'a> {
    cluster: &'a str,
    user: &'a str,
}

/// A kubeconfig for `server` that trusts `ca_pem` and authenticates as `user` with `client`.
pub fn render(
    server: &str,
    ca_pem: &str,
    user: &str,
    client: &CertAndKey,
) -> anyhow::Result<String> {
    let encode = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
    let credentials = UserFields::Certificate {
        client_certificate_data: encode(&client.cert_pem),
        client_key_data: encode(&client.key_pem),
    };
    render_with(server, ca_pem, user, credentials)
}

/// A kubeconfig for `server` that trusts `ca_pem` and authenticates as `user` with a bearer token.
pub fn render_token(server: &str, ca_pem: &str, user: &str, token: &str) -> anyhow::Result<String> {
    render_with(
        server,
        ca_pem,
        user,
        UserFields::Token {
            token: token.into(),
        },
    )
}

fn render_with(
    server: &str,
    ca_pem: &str,
    user: &str,
    credentials: UserFields,
) -> anyhow::Result<String> {
    let encode = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
    let file = File {
        api_version: "v1",
        kind: "Config",
        clusters: [Named {
            name: CLUSTER_NAME,
            value: Cluster {
                cluster: ClusterFields {
                    server,
                    certificate_authority_data: encode(ca_pem),
                },
            },
        }],
        users: [Named {
            name: user,
            value: User { user: credentials },
        }],
        contexts: [Named {
            name: CLUSTER_NAME,
            value: Context {
                context: ContextFields {
                    cluster: CLUSTER_NAME,
                    user,
                },
            },
        }],
        current_context: CLUSTER_NAME,
    };
    Ok(serde_saphyr::to_string(&file)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_token_kubeconfig_that_kube_reads() {
        let text =
            render_token("https://127.0.0.1:6443", "CA", "operator", "secret-token").unwrap();
        let parsed = kube::config::Kubeconfig::from_yaml(&text).unwrap();
        let user = parsed.auth_infos[0].auth_info.as_ref().unwrap();
        assert!(user.token.is_some());
        assert!(user.client_certificate_data.is_none());
    }

    #[test]
    fn renders_a_kubeconfig_that_kube_reads() {
        let client = CertAndKey {
            cert_pem: "CERT".into(),
            key_pem: "KEY".into(),
        };
        let text = render("https://127.0.0.1:6443", "CA", "admin", &client).unwrap();
        let parsed = kube::config::Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(parsed.current_context.as_deref(), Some(CLUSTER_NAME));
        let cluster = parsed.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0E="));
        let user = parsed.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(user.client_certificate_data.as_deref(), Some("Q0VSVA=="));
        let context = parsed.contexts[0].context.as_ref().unwrap();
        assert_eq!(
            (context.cluster.as_str(), context.user.as_deref()),
            (CLUSTER_NAME, Some("admin"))
        );
    }
}
