//! The watchdog's Events against the fake API server, through the Event on a pod whose memory-limit annotation
//! is bad (told once while it stays bad): the four standard tests.

use api_test_kit::standard::{self, Retry};
use api_test_kit::{FakeApi, logs};
use http::Method;

use super::*;
use crate::accounting::ContainerRef;

const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/team/events";

fn watchdog() -> (Watchdog, FakeApi) {
    let (api, client) = FakeApi::start();
    let watchdog = Watchdog {
        decider: Decider::new(Settings {
            grace: std::time::Duration::from_secs(30),
            kill_grace: std::time::Duration::from_secs(10),
            dry_run: false,
        }),
        events: Recorder::new(
            client.clone(),
            Reporter {
                controller: CONTROLLER.to_owned(),
                instance: Some("node-1".to_owned()),
            },
        ),
        claims: dra::Claims::new(client, "node-1"),
        told_processes: BTreeSet::new(),
        told_annotations: BTreeSet::new(),
        last_problem: None,
    };
    (watchdog, api)
}

/// A pass that finds pod `team/cuda`'s annotation bad.
fn bad_annotation() -> Assessment {
    let pod = ContainerRef {
        pod_uid: "uid-cuda".into(),
        namespace: "team".into(),
        pod: "cuda".into(),
        container: "main".into(),
    };
    let error = budget::parse_quantity("lots").unwrap_err();
    Assessment {
        bad_annotations: vec![(pod, error)],
        ..Assessment::default()
    }
}

/// The Events recorded in `team`, as (reason, the pod they are about).
fn events(api: &FakeApi) -> Vec<(String, String)> {
    api.objects(EVENTS)
        .iter()
        .map(|event| {
            let text = |value: &serde_json::Value| value.as_str().unwrap_or_default().to_owned();
            (text(&event["reason"]), text(&event["regarding"]["name"]))
        })
        .collect()
}

fn told() -> Vec<(String, String)> {
    vec![(BAD_ANNOTATION_REASON.to_owned(), "cuda".to_owned())]
}

#[tokio::test]
async fn standard_an_annotation_still_bad_is_not_told_again() {
    let (mut watchdog, api) = watchdog();
    standard::unchanged_is_not_written(&api, async || {
        watchdog.tell_once(&bad_annotation()).await;
        Ok(())
    })
    .await;
    assert_eq!(events(&api), told());
}

#[tokio::test]
async fn standard_a_missing_event_is_created_on_the_pod() {
    let (mut watchdog, api) = watchdog();
    assert!(events(&api).is_empty());
    watchdog.tell_once(&bad_annotation()).await;
    assert_eq!(events(&api), told());
}

/// The watchdog's loop retries: a pass whose Event was refused does not take the pod as told, so the next pass
/// records it and nothing is lost.
#[tokio::test]
async fn standard_a_conflicting_event_is_recorded_by_the_next_pass() {
    let (mut watchdog, api) = watchdog();
    standard::conflict_is_retried(&api, Method::POST, EVENTS, Retry::NextPass, async || {
        watchdog.tell_once(&bad_annotation()).await;
        match events(&api).is_empty() {
            true => Err("no Event recorded".to_owned()),
            false => Ok(()),
        }
    })
    .await;
    assert_eq!(events(&api), told());
}

/// A refused Event is logged (an Event is never worth failing the work it tells of), naming the pod and the
/// API server's answer.
#[tokio::test]
async fn standard_a_refused_event_is_logged_with_the_pod_and_the_reason() {
    for code in [403, 422] {
        let (mut watchdog, api) = watchdog();
        let (_, logged) = logs::warnings(standard::refusal_is_reported(
            &api,
            Method::POST,
            EVENTS,
            code,
            async || {
                watchdog.tell_once(&bad_annotation()).await;
                Ok(())
            },
        ))
        .await;
        let line = logged
            .lines()
            .find(|line| line.contains("cannot record the event"))
            .unwrap_or_else(|| panic!("no log line of the refusal: {logged}"));
        standard::assert_names(line, "pod=cuda", code);
    }
}
