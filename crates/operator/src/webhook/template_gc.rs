//! Garbage collection of the webhook's ResourceClaimTemplates. A template is created at admission, before the pod
//! exists, so nothing can own it; the claims made from it belong to their pods, but the template would stay in its
//! namespace for ever. The leader sweeps them: a template that no converted pod of its namespace names and that no
//! admission has used for [`UNUSED_FOR`] is deleted, on the condition that it is still the version the sweep read.
//!
//! The race with an admission that reuses a template (the webhook found it, the sweep has not seen the new pod yet)
//! is closed by the webhook marking the template used ([`LAST_USED_ANNOTATION`], written again once the mark is a
//! twelfth of [`UNUSED_FOR`] old): a mark newer than the sweep's read makes the conditional delete fail, and a template deleted
//! before the mark is created again by the webhook.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::{Client, ResourceExt};
use tracing::{debug, info, warn};

use super::hami::CONVERTED_LABEL;
use crate::render::{MANAGED_BY_LABEL, MANAGER};

/// When the webhook last found a template it needed (RFC 3339).
pub const LAST_USED_ANNOTATION: &str = "nvidia.com/hami-template-last-used";
/// How long a template no pod names is kept after its last use, by default.
pub const UNUSED_FOR: Duration = Duration::from_secs(3600);
/// Time between sweeps, by default.
pub const SWEEP_EVERY: Duration = Duration::from_secs(600);
/// How old the webhook lets the mark get before it writes it again, as a part of the time a template is kept
/// unused: far less, so a template in use is never a candidate, and seldom enough that a Deployment's replicas do
/// not each write it (5 minutes of the default hour).
const MARKS_PER_UNUSED_TIME: u32 = 12;

/// When `template` was last used: its mark, else its creation.
fn last_used(template: &ResourceClaimTemplate) -> Option<Timestamp> {
    template
        .annotations()
        .get(LAST_USED_ANNOTATION)
        .and_then(|mark| mark.parse().ok())
        .or_else(|| {
            template
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|time| time.0)
        })
}

/// Whether `template`'s mark is missing or, at `now`, older than a twelfth of `unused_for` (the sweep's), so the
/// webhook writes it again.
#[must_use]
pub fn needs_mark(template: &ResourceClaimTemplate, now: Timestamp, unused_for: Duration) -> bool {
    template
        .annotations()
        .get(LAST_USED_ANNOTATION)
        .and_then(|mark| mark.parse::<Timestamp>().ok())
        .is_none_or(|mark| older_than(mark, now, unused_for / MARKS_PER_UNUSED_TIME))
}

fn older_than(then: Timestamp, now: Timestamp, age: Duration) -> bool {
    now.duration_since(then)
        .try_into()
        .is_ok_and(|elapsed: Duration| elapsed > age)
}

/// The templates among `templates` (one namespace's, the webhook's) that no pod of `pods` names and that were last
/// used more than `unused_for` before `now` (pure).
#[must_use]
pub fn unused<'a>(
    templates: &'a [ResourceClaimTemplate],
    pods: &[Pod],
    now: Timestamp,
    unused_for: Duration,
) -> Vec<&'a ResourceClaimTemplate> {
    let named: BTreeSet<&str> = pods
        .iter()
        .filter_map(|pod| pod.spec.as_ref())
        .flat_map(|spec| spec.resource_claims.iter().flatten())
        .filter_map(|claim| claim.resource_claim_template_name.as_deref())
        .collect();
    templates
        .iter()
        .filter(|template| !named.contains(template.name_any().as_str()))
        .filter(|template| template.metadata.deletion_timestamp.is_none())
        .filter(|template| {
            last_used(template).is_some_and(|used| older_than(used, now, unused_for))
        })
        .collect()
}

/// One sweep over the cluster: lists the webhook's templates, and the converted pods of each namespace that has a
/// candidate, and deletes the unused ones. Returns how many were deleted.
///
/// # Errors
/// When a list is refused; a refused delete is logged (a conflict, someone used or changed the template since,
/// at debug level), and tried again by the next sweep.
pub async fn sweep(client: &Client, unused_for: Duration) -> Result<usize, kube::Error> {
    let now = Timestamp::now();
    let ours = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGER}"));
    let mut by_namespace: BTreeMap<String, Vec<ResourceClaimTemplate>> = BTreeMap::new();
    for template in Api::<ResourceClaimTemplate>::all(client.clone())
        .list(&ours)
        .await?
    {
        let stale = last_used(&template).is_some_and(|used| older_than(used, now, unused_for));
        if stale {
            by_namespace
                .entry(template.namespace().unwrap_or_default())
                .or_default()
                .push(template);
        }
    }
    let mut deleted = 0;
    let converted = ListParams::default().labels(&format!("{CONVERTED_LABEL}=hami-dra"));
    for (namespace, templates) in &by_namespace {
        let pods = Api::<Pod>::namespaced(client.clone(), namespace)
            .list(&converted)
            .await?
            .items;
        let api = Api::<ResourceClaimTemplate>::namespaced(client.clone(), namespace);
        for template in unused(templates, &pods, now, unused_for) {
            let name = template.name_any();
            let unchanged = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: template.uid(),
                    resource_version: template.resource_version(),
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &unchanged).await {
                Ok(_) => {
                    deleted += 1;
                    info!(%namespace, template = %name, "deleted a HAMi ResourceClaimTemplate no pod uses");
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    debug!(%namespace, template = %name, %status, "template kept: used or changed since the sweep read it");
                }
                // Not the expected race: said where an operator on call looks, the next sweep tries again.
                Err(error) => {
                    warn!(%namespace, template = %name, %error, "cannot delete an unused HAMi ResourceClaimTemplate");
                }
            }
        }
    }
    Ok(deleted)
}

/// Sweeps every `every` for ever (the leader's task).
pub async fn run(client: Client, every: Duration, unused_for: Duration) {
    loop {
        tokio::time::sleep(every).await;
        if let Err(error) = sweep(&client, unused_for).await {
            warn!(%error, "cannot sweep the HAMi ResourceClaimTemplates; trying again at the next sweep");
        }
    }
}

#[cfg(test)]
mod tests {
    use http::Method;
    use serde_json::{Value, json};

    use super::*;
    use api_test_kit::{Answer, FakeApi, expect};

    const NOW: &str = "2026-11-26T12:00:00Z";

    fn now() -> Timestamp {
        NOW.parse().unwrap()
    }

    fn template_json(name: &str, created: &str, mark: Option<&str>) -> Value {
        let mut template = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": name, "namespace": "team", "uid": format!("uid-{name}"), "resourceVersion": "7",
                "creationTimestamp": created,
                "labels": {"app.kubernetes.io/managed-by": "gpu-operator"},
            },
            "spec": {"spec": {}},
        });
        if let Some(mark) = mark {
            template["metadata"]["annotations"] = json!({LAST_USED_ANNOTATION: mark});
        }
        template
    }

    fn template(name: &str, created: &str, mark: Option<&str>) -> ResourceClaimTemplate {
        serde_json::from_value(template_json(name, created, mark)).unwrap()
    }

    fn pod_json(template: &str) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("pod-of-{template}"), "namespace": "team"},
            "spec": {
                "containers": [{"name": "main"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            },
        })
    }

    fn pod(template: &str) -> Pod {
        serde_json::from_value(pod_json(template)).unwrap()
    }

    fn names(templates: &[&ResourceClaimTemplate]) -> Vec<String> {
        templates
            .iter()
            .map(|template| template.name_any())
            .collect()
    }

    #[test]
    fn a_template_a_pod_names_is_kept_however_old() {
        let templates = [template("hami-gpu-1", "2026-01-01T00:00:00Z", None)];
        assert!(unused(&templates, &[pod("hami-gpu-1")], now(), UNUSED_FOR).is_empty());
    }

    #[test]
    fn an_unnamed_template_is_unused_only_after_its_last_use_is_old_enough() {
        let templates = [
            template("hami-gpu-old", "2026-11-26T10:00:00Z", None),
            template("hami-gpu-new", "2026-11-26T11:30:00Z", None),
            template(
                "hami-gpu-marked",
                "2026-11-26T10:00:00Z",
                Some("2026-11-26T11:50:00Z"),
            ),
        ];
        assert_eq!(
            names(&unused(
                &templates,
                &[pod("hami-gpu-other")],
                now(),
                UNUSED_FOR
            )),
            ["hami-gpu-old"]
        );
    }

    #[test]
    fn the_mark_is_written_again_only_once_it_is_old() {
        let fresh = template("t", NOW, Some("2026-11-26T11:58:00Z"));
        let old = template("t", NOW, Some("2026-11-26T11:50:00Z"));
        let unmarked = template("t", NOW, None);
        assert!(!needs_mark(&fresh, now(), UNUSED_FOR));
        assert!(needs_mark(&old, now(), UNUSED_FOR));
        assert!(needs_mark(&unmarked, now(), UNUSED_FOR));
    }

    #[tokio::test]
    async fn a_sweep_deletes_the_unused_template_on_the_condition_that_it_is_unchanged() {
        let created = "2020-01-01T00:00:00Z";
        let (api, client) = FakeApi::scripted(vec![
            expect(
                Method::GET,
                "/apis/resource.k8s.io/v1/resourceclaimtemplates",
                Answer::Json(
                    200,
                    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplateList",
                    "metadata": {}, "items": [
                        template_json("hami-gpu-used", created, None),
                        template_json("hami-gpu-unused", created, None),
                    ]}),
                ),
            ),
            expect(
                Method::GET,
                "/api/v1/namespaces/team/pods",
                Answer::Json(
                    200,
                    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {},
                        "items": [pod_json("hami-gpu-used")]}),
                ),
            ),
            expect(
                Method::DELETE,
                "/apis/resource.k8s.io/v1/namespaces/team/resourceclaimtemplates/hami-gpu-unused",
                Answer::Json(200, template_json("hami-gpu-unused", created, None)),
            ),
        ]);
        assert_eq!(sweep(&client, UNUSED_FOR).await.unwrap(), 1);
        let received = api.finish();
        assert!(
            received[0]
                .query
                .contains("labelSelector=app.kubernetes.io%2Fmanaged-by%3Dgpu-operator"),
            "{}",
            received[0].query
        );
        assert!(
            received[1]
                .query
                .contains("labelSelector=nvidia.com%2Fgpu-sharing%3Dhami-dra"),
            "{}",
            received[1].query
        );
        assert_eq!(
            received[2].body["preconditions"],
            json!({"uid": "uid-hami-gpu-unused", "resourceVersion": "7"})
        );
    }
}
