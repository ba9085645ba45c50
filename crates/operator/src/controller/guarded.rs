//! Watches that survive objects they cannot read. One stored object that does not deserialise (a field out of its
//! Rust type's range, written before the CRD bounded it, or a type another version wrote) would fail the whole list
//! of its watch: the cache would never fill and no reconcile would run again. Each object is read through kube's
//! [`DeserializeGuard`] instead; one that is not a valid `K` is logged, counted and left out, so that the caches
//! keep their types and the rest of the controller only ever sees objects it can read.

use std::fmt::Debug;
use std::future::ready;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tracing::warn;

use crate::health::Health;
use crate::metrics::Metrics;

/// [`watcher::watcher`] of `K` that leaves out, and reports, the objects that are not a valid `K`, and tells
/// `health` whether it succeeds (liveness fails on a watch that has failed for long).
pub fn watcher<K>(
    api: Api<DeserializeGuard<K>>,
    config: watcher::Config,
    metrics: &Arc<Metrics>,
    health: &Arc<Health>,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + use<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let health = health.clone();
    readable(watcher::watcher(api, config), metrics.clone())
        .inspect(move |event| health.observe_watch(&kind, event))
        .backoff(WatchRetry::default())
}

/// How a failed watch retries: after 0.5 s, doubling to at most [`WatchRetry::MAX`], and from the start again
/// after any success. kube's default grows to 30 s, so after an API server outage of half a minute the operator
/// would wait up to another 30 s (seen: 44 s) before it noticed the API server was back; one operator's watches
/// retrying every few seconds cost the API server nothing.
#[derive(Debug)]
struct WatchRetry {
    next: Duration,
}

impl WatchRetry {
    const FIRST: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(4);
}

impl Default for WatchRetry {
    fn default() -> Self {
        Self { next: Self::FIRST }
    }
}

impl Iterator for WatchRetry {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.next;
        self.next = (delay * 2).min(Self::MAX);
        Some(delay)
    }
}

impl Backoff for WatchRetry {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// The controller's backoff over its trigger streams: none, since each trigger is a [`watcher`] that backs off by
/// itself. kube's default would add a second backoff over all of them together, so that each error of one watch
/// pauses every watch, growing with each: when a connection reset dropped the seven watches at once, the operator
/// saw a ClusterPolicy change only two minutes later.
#[derive(Debug, Default)]
pub struct WatchesBackOffThemselves;

impl Iterator for WatchesBackOffThemselves {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl Backoff for WatchesBackOffThemselves {
    fn reset(&mut self) {}
}

/// `events` with the unreadable objects left out. Leaving out a changed object that can no longer be read keeps
/// the last version that could be in the cache: the controller goes on with what it last knew rather than taking
/// the object for deleted. A deletion of an object unreadable by then has nothing to name it by in `K`, so such a
/// cached earlier version stays until the watch lists again.
fn readable<K, S>(
    events: S,
    metrics: Arc<Metrics>,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + use<K, S>
where
    K: Resource + Send,
    K::DynamicType: Default,
    S: Stream<Item = watcher::Result<Event<DeserializeGuard<K>>>> + Send,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let read = move |guard: DeserializeGuard<K>| match guard.0 {
        Ok(object) => Some(object),
        Err(invalid) => {
            report(&kind, &invalid, &metrics);
            None
        }
    };
    events.filter_map(move |event| {
        ready(match event {
            Ok(Event::Apply(guard)) => read(guard).map(|object| Ok(Event::Apply(object))),
            Ok(Event::InitApply(guard)) => read(guard).map(|object| Ok(Event::InitApply(object))),
            Ok(Event::Delete(guard)) => read(guard).map(|object| Ok(Event::Delete(object))),
            Ok(Event::Init) => Some(Ok(Event::Init)),
            Ok(Event::InitDone) => Some(Ok(Event::InitDone)),
            Err(error) => Some(Err(error)),
        })
    })
}

fn report(kind: &str, invalid: &InvalidObject, metrics: &Metrics) {
    let name = invalid.metadata.name.as_deref().unwrap_or_default();
    let namespace = invalid.metadata.namespace.as_deref().unwrap_or_default();
    warn!(
        kind,
        name,
        namespace,
        error = %invalid.error,
        "left out an object that cannot be read; fix or delete it"
    );
    metrics.count_unreadable(kind);
}

#[cfg(test)]
mod tests {
    use std::io::{self, Write};
    use std::sync::Mutex;

    use crd::{ClusterPolicy, GPUNode};
    use futures::stream;
    use http::Method;
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
    use kube::ResourceExt;
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn failed_watches_retry_within_seconds_and_start_over_after_a_success() {
        let mut retry = WatchRetry::default();
        let delays: Vec<u128> = retry.by_ref().take(6).map(|d| d.as_millis()).collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 4000, 4000]);
        retry.reset();
        assert_eq!(retry.next(), Some(Duration::from_millis(500)));
    }

    #[test]
    fn the_controller_adds_no_pause_of_its_own_to_a_watch_error() {
        let mut controller = WatchesBackOffThemselves;
        assert!(controller.by_ref().take(10).all(|pause| pause.is_zero()));
    }
    use api_test_kit::{Answer, FakeApi, expect};

    /// A log sink the test reads back.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().expect("the sink").write(bytes)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Each event as `Variant name`, for comparing.
    fn described<K: Resource>(events: &[watcher::Result<Event<K>>]) -> Vec<String> {
        events
            .iter()
            .map(|event| match event {
                Ok(Event::Init) => "Init".to_owned(),
                Ok(Event::InitApply(object)) => format!("InitApply {}", object.name_any()),
                Ok(Event::InitDone) => "InitDone".to_owned(),
                Ok(Event::Apply(object)) => format!("Apply {}", object.name_any()),
                Ok(Event::Delete(object)) => format!("Delete {}", object.name_any()),
                Err(error) => format!("Err {error}"),
            })
            .collect()
    }

    /// Feeds a list holding `bad` between two good objects (`good-1`, `good-2`), then `bad` changed and deleted,
    /// and checks that only the good ones arrive and that `bad` is logged by kind and name with `error` (a part
    /// of the serde message) and counted.
    fn assert_left_out<K>(good: Value, bad: Value, error: &str)
    where
        K: Resource + DeserializeOwned + Send + 'static,
        K::DynamicType: Default,
    {
        let guarded = |value: &Value, name: &str| {
            let mut value = value.clone();
            value["metadata"]["name"] = json!(name);
            serde_json::from_value::<DeserializeGuard<K>>(value).expect("metadata readable")
        };
        let events = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(guarded(&good, "good-1"))),
            Ok(Event::InitApply(guarded(&bad, "bad"))),
            Ok(Event::InitApply(guarded(&good, "good-2"))),
            Ok(Event::InitDone),
            Ok(Event::Apply(guarded(&bad, "bad"))),
            Ok(Event::Delete(guarded(&bad, "bad"))),
            Ok(Event::Apply(guarded(&good, "good-1"))),
        ];
        let metrics = Metrics::shared();
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let read: Vec<_> = tracing::subscriber::with_default(subscriber, || {
            futures::executor::block_on(readable(stream::iter(events), metrics.clone()).collect())
        });
        assert_eq!(
            described(&read),
            [
                "Init",
                "InitApply good-1",
                "InitApply good-2",
                "InitDone",
                "Apply good-1"
            ]
        );
        let logged = String::from_utf8(sink.0.lock().expect("the sink").clone()).expect("text");
        let kind = K::kind(&K::DynamicType::default()).into_owned();
        let reports: Vec<&str> = logged
            .lines()
            .filter(|line| line.contains("left out an object that cannot be read"))
            .collect();
        assert_eq!(reports.len(), 3, "{logged}");
        for line in reports {
            assert!(line.contains("WARN"), "{line}");
            assert!(line.contains(&format!("kind=\"{kind}\"")), "{line}");
            assert!(line.contains("name=\"bad\""), "{line}");
            assert!(line.contains(error), "{line}");
        }
        let text = metrics.encode();
        assert!(
            text.contains(&format!(
                "gpu_operator_unreadable_objects_total{{kind=\"{kind}\"}} 3"
            )),
            "{text}"
        );
    }

    #[test]
    fn a_gpu_node_out_of_range_is_left_out() {
        let good = json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUNode", "metadata": {}, "spec": {},
            "status": {"gpuCount": 2}});
        let mut bad = good.clone();
        bad["status"]["gpuCount"] = json!(4_294_967_296_u64);
        assert_left_out::<GPUNode>(good, bad, "4294967296");
    }

    #[test]
    fn a_cluster_policy_with_a_wrong_type_is_left_out() {
        let good = json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {},
            "spec": {"devicePlugin": {"enabled": true}}});
        let mut bad = good.clone();
        bad["spec"]["devicePlugin"]["enabled"] = json!("yes");
        assert_left_out::<ClusterPolicy>(good, bad, "Expected a boolean");
    }

    #[test]
    fn a_config_map_with_non_string_data_is_left_out() {
        let good = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": "gpu-operator"},
            "data": {"config.yaml": "version: v1"}});
        let mut bad = good.clone();
        bad["data"]["config.yaml"] = json!(1);
        assert_left_out::<ConfigMap>(good, bad, "Expected a string");
    }

    #[test]
    fn a_node_with_a_wrong_type_is_left_out() {
        let good = json!({"apiVersion": "v1", "kind": "Node", "metadata": {}, "spec": {"unschedulable": false}});
        let mut bad = good.clone();
        bad["spec"]["unschedulable"] = json!("no");
        assert_left_out::<Node>(good, bad, "Expected a boolean");
    }

    #[test]
    fn a_daemonset_with_a_wrong_type_is_left_out() {
        let good = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"namespace": "gpu-operator"},
            "status": {"currentNumberScheduled": 1, "desiredNumberScheduled": 1, "numberMisscheduled": 0,
                "numberReady": 1}});
        let mut bad = good.clone();
        bad["status"]["numberReady"] = json!("one");
        assert_left_out::<DaemonSet>(good, bad, "Expected i32");
    }

    #[test]
    fn a_service_with_a_wrong_type_is_left_out() {
        let good = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "gpu-operator"},
            "spec": {"ports": [{"port": 9400}]}});
        let mut bad = good.clone();
        bad["spec"]["ports"][0]["port"] = json!("metrics");
        assert_left_out::<Service>(good, bad, "Expected i32");
    }

    /// A GPUNode list, as the API server answers it, with `gpu-b` out of range between two good ones.
    fn gpu_node_list() -> Value {
        let item = |name: &str, gpu_count: u64| {
            json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUNode", "metadata": {"name": name},
                "spec": {}, "status": {"gpuCount": gpu_count}})
        };
        json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUNodeList", "metadata": {"resourceVersion": "7"},
            "items": [item("gpu-a", 1), item("gpu-b", 4_294_967_296), item("gpu-c", 8)]})
    }

    /// The list is the first request of a watch; what follows it (the watch itself) is not needed here, so the
    /// stream is read only up to the end of the list and the watch request is never sent.
    async fn until_listed<K: Resource>(
        events: impl Stream<Item = watcher::Result<Event<K>>>,
    ) -> Vec<String> {
        let mut listed = Vec::new();
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            let done = !matches!(event, Ok(Event::Init | Event::InitApply(_)));
            listed.extend(described(&[event]));
            if done {
                break;
            }
        }
        listed
    }

    #[tokio::test]
    async fn a_listed_gpu_node_out_of_range_leaves_the_others_readable() {
        let list = || {
            vec![expect(
                Method::GET,
                "/apis/nvidia.com/v1alpha1/gpunodes",
                Answer::Json(200, gpu_node_list()),
            )]
        };
        // Why the guard: the plain watcher fails the whole list on the one bad item.
        let (scenario, client) = FakeApi::scripted(list());
        let plain = until_listed(watcher::watcher(
            Api::<GPUNode>::all(client),
            watcher::Config::default(),
        ))
        .await;
        scenario.finish();
        assert_eq!(plain.len(), 2, "{plain:?}");
        assert_eq!(plain[0], "Init");
        assert!(
            plain[1].starts_with("Err failed to perform initial object list")
                && plain[1].contains("4294967296"),
            "{plain:?}"
        );

        let (scenario, client) = FakeApi::scripted(list());
        let metrics = Metrics::shared();
        let guarded = until_listed(watcher(
            Api::<DeserializeGuard<GPUNode>>::all(client),
            watcher::Config::default(),
            &metrics,
            &Health::new(false),
        ))
        .await;
        scenario.finish();
        assert_eq!(
            guarded,
            ["Init", "InitApply gpu-a", "InitApply gpu-c", "InitDone"]
        );
        assert!(
            metrics
                .encode()
                .contains("gpu_operator_unreadable_objects_total{kind=\"GPUNode\"} 1"),
            "{}",
            metrics.encode()
        );
    }
}
