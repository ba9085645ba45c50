//! The HTTP side: `/metrics` serves the latest collection, `/healthz` answers while the process runs. A scrape
//! only encodes what the collection loop published, so scrapes cost no GPU or kubelet calls however many
//! Prometheus replicas scrape.

use std::convert::Infallible;
use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::header::{CONTENT_TYPE as CONTENT_TYPE_HEADER, HeaderName};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::collect::Collector;
use super::config::Selection;
use super::families::{MetricFamily, encode};

/// The Prometheus text format, as dcgm-exporter serves it. prometheus-client writes OpenMetrics text, which is
/// the same for gauges; but an OpenMetrics counter's samples must end in `_total`, which would rename
/// `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` in every dashboard. The Prometheus text format allows counters without
/// the suffix, and reads the closing `# EOF` as a comment.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The latest collection, shared with the HTTP handlers.
type Latest = watch::Receiver<Arc<Vec<MetricFamily>>>;

/// `/metrics` and `/healthz` over the latest collection.
pub fn router(latest: Latest) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(latest)
}

async fn metrics(State(latest): State<Latest>) -> ([(HeaderName, &'static str); 1], String) {
    let families = latest.borrow().clone();
    ([(CONTENT_TYPE_HEADER, CONTENT_TYPE)], encode(families))
}

/// Collects every `interval`, and at once when the selection changes, publishing each collection.
async fn collect_forever(
    mut collector: Collector,
    mut selection: watch::Receiver<Arc<Selection>>,
    interval: Duration,
    publish: watch::Sender<Arc<Vec<MetricFamily>>>,
) -> Infallible {
    loop {
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            // Once the config follower is gone (no ConfigMap named), only the interval wakes the loop.
            Ok(()) = selection.changed() => {}
        }
        let current = selection.borrow_and_update().clone();
        publish.send_replace(Arc::new(collector.collect(&current).await));
    }
}

/// Serves `/metrics` and `/healthz` on `listener`, collecting with `collector` every `interval` under the latest
/// `selection`. The first collection is done before the first connection is accepted, so that no scrape sees an
/// empty exporter.
///
/// # Errors
/// When the server fails to accept connections.
pub async fn serve(
    listener: TcpListener,
    mut collector: Collector,
    mut selection: watch::Receiver<Arc<Selection>>,
    interval: Duration,
) -> std::io::Result<()> {
    let current = selection.borrow_and_update().clone();
    let first = collector.collect(&current).await;
    let (publish, latest) = watch::channel(Arc::new(first));
    let collecting = collect_forever(collector, selection, interval, publish);
    tokio::select! {
        served = axum::serve(listener, router(latest)).into_future() => served,
        never = collecting => match never {},
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Instant;

    use gpu::{GpuBackend, GpuProcess};
    use node_runtime::backend::Gpus;
    use node_runtime::testing::simulated;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;
    use crate::pod_resources::tests::{container, fake, serve as serve_kubelet};

    /// A plain HTTP/1.1 GET: the status line and headers, and the body.
    async fn get(address: SocketAddr, path: &str) -> (String, String) {
        let mut stream = TcpStream::connect(address).await.unwrap();
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: exporter\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        (head.to_owned(), body.to_owned())
    }

    /// The line of a metric whose labels contain every one of `labels`.
    fn sample<'t>(text: &'t str, metric: &str, labels: &[&str]) -> Option<&'t str> {
        text.lines().find(|line| {
            line.starts_with(&format!("{metric}{{")) && labels.iter().all(|l| line.contains(l))
        })
    }

    #[tokio::test]
    async fn two_pods_sharing_a_gpu_each_show_their_own_memory() {
        // Two pods, each one process, and a host process in no pod.
        let (text, uuid) = crate::exporter::accounted_scrape::scrape(
            "a100-40gb:1",
            &[],
            &[
                (4242, 3000, Some("notebook-a")),
                (4343, 5000, Some("notebook-b")),
                (4444, 1000, None),
            ],
        )
        .await;
        let mib: u64 = 1024 * 1024;
        for (pod, mib_used) in [("notebook-a", 3000), ("notebook-b", 5000)] {
            let line = sample(
                &text,
                "gpu_pod_memory_used_bytes",
                &[&format!("pod=\"{pod}\"")],
            )
            .unwrap_or_else(|| panic!("no series for {pod}:\n{text}"));
            assert!(line.contains(&format!("UUID=\"{uuid}\"")), "{line}");
            assert!(
                line.contains("namespace=\"ml\",container=\"main\""),
                "{line}"
            );
            assert!(line.ends_with(&format!(" {}", mib_used * mib)), "{line}");
        }
        let unattributed = sample(&text, "gpu_unattributed_memory_used_bytes", &["gpu=\"0\""])
            .unwrap_or_else(|| panic!("{text}"));
        assert!(
            unattributed.ends_with(&format!(" {}", 1000 * mib)),
            "{unattributed}"
        );
        assert!(!unattributed.contains("pod="), "{unattributed}");
    }

    #[tokio::test]
    async fn scrapes_see_the_simulated_gpus_with_pod_labels() {
        let (_dir, simulator) = simulated("a100-40gb:2", &[]);
        let uuid = simulator.gpu(1).unwrap().uuid;
        simulator
            .start_process(
                1,
                GpuProcess {
                    pid: 4242,
                    used_memory_mib: Some(3000),
                    gpu_instance_id: None,
                    compute_instance_id: None,
                },
            )
            .unwrap();
        let kubelet = tempfile::tempdir().unwrap();
        serve_kubelet(
            kubelet.path(),
            fake::ListPodResourcesResponse {
                pod_resources: vec![fake::PodResources {
                    name: "trainer".into(),
                    namespace: "ml".into(),
                    containers: vec![container(
                        "main",
                        &[("nvidia.com/gpu.shared", &[&format!("{uuid}::2")])],
                    )],
                }],
            },
        );

        let collector = Collector::new(
            Gpus::from_simulator(simulator.clone()),
            "node-1",
            kubelet.path().to_owned(),
            Duration::from_secs(300),
        );
        let (selections, selection) = watch::channel(Arc::new(Selection::default()));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        // An interval no test waits for: only a selection change makes it collect again.
        tokio::spawn(serve(
            listener,
            collector,
            selection,
            Duration::from_secs(3600),
        ));

        let (head, body) = get(address, "/metrics").await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
            "{head}"
        );
        let used = sample(&body, "DCGM_FI_DEV_FB_USED", &[&format!("UUID=\"{uuid}\"")])
            .unwrap_or_else(|| panic!("{body}"));
        assert_eq!(
            used,
            format!(
                "DCGM_FI_DEV_FB_USED{{gpu=\"1\",UUID=\"{uuid}\",pci_bus_id=\"00000000:11:00.0\",device=\"nvidia1\",\
                 modelName=\"NVIDIA A100-SXM4-40GB\",hostname=\"node-1\",DCGM_FI_DRIVER_VERSION=\"570.86.15\",\
                 pod=\"trainer\",namespace=\"ml\",container=\"main\"}} 3000"
            )
        );
        assert!(
            sample(&body, "DCGM_FI_DEV_GPU_UTIL", &["gpu=\"1\""])
                .is_some_and(|l| l.ends_with(" 100")),
            "{body}"
        );
        assert!(
            sample(&body, "DCGM_FI_DEV_POWER_USAGE", &["gpu=\"0\""])
                .is_some_and(|l| l.ends_with(" 60.0") && !l.contains("pod=")),
            "{body}"
        );
        assert!(
            body.contains("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"),
            "{body}"
        );
        assert_eq!(
            sample(&body, "DCGM_FI_DEV_XID_ERRORS", &["gpu=\"0\""]).map(|l| l.ends_with(" 0")),
            Some(true),
            "{body}"
        );

        // The process ends and an XID arrives; a new selection makes the exporter collect at once.
        simulator.stop_process(1, 4242).unwrap();
        simulator.inject_xid(0, 79).unwrap();
        selections.send_replace(Arc::new(
            Selection::parse(
                "DCGM_FI_DEV_XID_ERRORS, gauge, xid\nDCGM_FI_DEV_FB_USED, gauge, used\n",
            )
            .unwrap(),
        ));
        let deadline = Instant::now() + Duration::from_secs(10);
        let body = loop {
            let (_, body) = get(address, "/metrics").await;
            if sample(&body, "DCGM_FI_DEV_XID_ERRORS", &["gpu=\"0\""])
                .is_some_and(|l| l.ends_with(" 79"))
            {
                break body;
            }
            assert!(Instant::now() < deadline, "no XID 79 in time: {body}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(
            sample(&body, "DCGM_FI_DEV_FB_USED", &["pod=\"trainer\""])
                .is_some_and(|l| l.ends_with(" 0")),
            "{body}"
        );
        assert!(!body.contains("DCGM_FI_DEV_POWER_USAGE"), "{body}");
        assert!(
            body.contains("# HELP DCGM_FI_DEV_XID_ERRORS xid\n"),
            "{body}"
        );

        let (head, body) = get(address, "/healthz").await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(body, "ok");
    }
}
