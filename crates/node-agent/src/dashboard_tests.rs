//! The chart's Grafana dashboard asks only for metrics our exporters serve: every metric name in its queries (and
//! its variables' queries) appears in a scrape of the exporter (a MIG node and a time-sliced node with pods) and
//! of the watchdog (with a pod over its budget).

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpu::HostProcess;
use promql_parser::parser::Expr;
use promql_parser::util::{ExprVisitor, walk_expr};
use serde_json::Value;

use crate::accounting::pods::{PodIndex, running_pod};
use crate::accounting::{AccountedGpu, Accounting, MIB, ProcessUse, cgroup};
use crate::exporter::accounted_scrape;
use crate::watchdog::budget::DefaultBudget;
use crate::watchdog::decide::{Decider, Settings};
use crate::watchdog::metrics::WatchdogMetrics;
use crate::watchdog::{assess, judge};

fn dashboard() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../charts/gpu-operator/files/dashboards/gpu-operator.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// Every query of the dashboard: panels' (and rows' panels') `targets[].expr`, and the query variables' `query`.
fn queries(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(object) => {
            for (key, inner) in object {
                match (key.as_str(), inner) {
                    ("expr", Value::String(expr)) => found.push(expr.clone()),
                    // A variable's query; a `datasource` variable's names a plugin, not metrics.
                    ("query", Value::String(query))
                        if object.get("type").and_then(Value::as_str) == Some("query") =>
                    {
                        found.push(query.clone());
                    }
                    _ => queries(inner, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| queries(item, found)),
        _ => {}
    }
}

/// The metric names a PromQL expression reads, from the syntax tree of the maintained PromQL parser (the
/// Prometheus evaluation of the dashboard in the e2e library parses with the same crate). Grafana's variables in
/// label values are plain text to PromQL; its interval macros stand where a duration must, so they are replaced.
fn metric_names(expr: &str) -> BTreeSet<String> {
    struct Names(BTreeSet<String>);
    impl ExprVisitor for Names {
        type Error = Infallible;
        fn pre_visit(&mut self, expr: &Expr) -> Result<bool, Infallible> {
            let selector = match expr {
                Expr::VectorSelector(selector) => Some(selector),
                Expr::MatrixSelector(matrix) => Some(&matrix.vs),
                _ => None,
            };
            self.0
                .extend(selector.and_then(|selector| selector.name.clone()));
            Ok(true)
        }
    }
    let expr = ["$__rate_interval", "$__interval", "$__range"]
        .iter()
        .fold(expr.to_owned(), |expr, grafana_macro| {
            expr.replace(grafana_macro, "5m")
        });
    let parsed = promql_parser::parser::parse(&expr)
        .unwrap_or_else(|error| panic!("the dashboard's query {expr}: {error}"));
    let mut names = Names(BTreeSet::new());
    let Ok(_) = walk_expr(&mut names, &parsed);
    names.0
}

/// The metric names a dashboard query reads: Grafana's `label_values(metric, label)` names its metric first (and
/// `label_values(label)` none); anything else is PromQL.
fn names_in_query(query: &str) -> BTreeSet<String> {
    match query
        .trim()
        .strip_prefix("label_values(")
        .and_then(|arguments| arguments.strip_suffix(')'))
    {
        Some(arguments) => arguments
            .rsplit_once(',')
            .map(|(selector, _label)| metric_names(selector))
            .unwrap_or_default(),
        None => metric_names(query),
    }
}

/// The metric names of a text exposition.
fn served(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// A scrape of the exporter on a node of `spec` (with MIG `devices`), with a pod's process and a host process.
async fn exporter_scrape(spec: &str, devices: &[(&str, u32)]) -> String {
    let processes = [(4242, 1000, Some("trainer")), (4343, 1000, None)];
    accounted_scrape::scrape(spec, devices, &processes).await.0
}

/// A scrape of the watchdog after a pod stayed over its budget (a dry run: nothing is signalled).
fn watchdog_scrape() -> String {
    let uid = "00000000-0000-4000-8000-000000000002";
    let container_id = format!("{:064x}", 2);
    let pods = PodIndex::new([&running_pod("ml", "notebook", uid, &container_id)]);
    let accounting = Accounting {
        gpus: vec![AccountedGpu {
            index: 0,
            uuid: "GPU-0".into(),
            model_name: "NVIDIA A100-SXM4-40GB".into(),
            memory_bytes: 40_960 * MIB,
            mig: false,
        }],
        processes: vec![
            ProcessUse {
                gpu: 0,
                mig_device: None,
                process: Some(HostProcess {
                    pid: 1_000_001,
                    start_time: 1,
                }),
                pid: 1_000_001,
                used_bytes: Some(20_000 * MIB),
                cgroup_owner: cgroup::owner(&format!(
                    "0::/kubepods/besteffort/pod{uid}/{container_id}\n"
                )),
            },
            ProcessUse {
                gpu: 0,
                mig_device: None,
                process: None,
                pid: 1_000_002,
                used_bytes: Some(100 * MIB),
                cgroup_owner: None,
            },
        ],
    };
    let held = assess::holdings(
        &[crate::pod_resources::PodDevices {
            pod: "ml/notebook".into(),
            containers: vec![crate::pod_resources::ContainerDevices {
                name: "main".into(),
                devices: [("nvidia.com/gpu".to_owned(), ["GPU-0::1".to_owned()].into())].into(),
                claims: Vec::new(),
            }],
        }],
        &[(
            "nvidia.com/gpu".to_owned(),
            (0..4).map(|replica| format!("GPU-0::{replica}")).collect(),
        )]
        .into(),
        &[],
    );
    let metrics = WatchdogMetrics::new("node-1");
    let mut decider = Decider::new(Settings {
        grace: Duration::ZERO,
        kill_grace: Duration::ZERO,
        dry_run: true,
    });
    let (assessment, actions) = judge(
        &mut decider,
        &accounting,
        &pods,
        &held,
        DefaultBudget::ReplicaShare,
        Instant::now(),
    );
    assert_eq!(actions.len(), 1);
    metrics.show(&accounting, &assessment);
    metrics.count(&actions[0]);
    metrics.encode()
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_is_served() {
    let mut served_names = served(&exporter_scrape("a100-40gb:1", &[("1g.5gb", 7)]).await);
    served_names.extend(served(&exporter_scrape("h100-80gb:1", &[]).await));
    served_names.extend(served(&watchdog_scrape()));

    let mut found = Vec::new();
    queries(&dashboard(), &mut found);
    assert!(
        found.len() >= 10,
        "the dashboard has only {} queries",
        found.len()
    );
    let asked: BTreeSet<String> = found
        .iter()
        .flat_map(|query| names_in_query(query))
        .collect();
    for ours in [
        "gpu_pod_memory_used_bytes",
        "gpu_watchdog_kills_total",
        "gpu_watchdog_pod_budget_bytes",
    ] {
        assert!(
            asked.contains(ours),
            "the dashboard has no panel on {ours}: {asked:?}"
        );
    }
    let missing: Vec<&String> = asked.difference(&served_names).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics no exporter serves: {missing:?}\nserved: {served_names:?}"
    );
}

#[test]
fn metric_names_are_told_from_functions_labels_and_variables() {
    let names = metric_names(
        r#"sum by (namespace, pod) (increase(gpu_watchdog_kills_total{hostname=~"$Hostname", signal="SIGTERM"}[$__rate_interval])) / on(gpu) group_left(modelName) max by (gpu) (DCGM_FI_DEV_FB_USED offset 5m) > 1e3"#,
    );
    assert_eq!(
        names,
        BTreeSet::from([
            "gpu_watchdog_kills_total".to_owned(),
            "DCGM_FI_DEV_FB_USED".to_owned()
        ])
    );
    assert_eq!(
        names_in_query(r#"label_values(DCGM_FI_DEV_GPU_TEMP{hostname="$Hostname"}, gpu)"#),
        BTreeSet::from(["DCGM_FI_DEV_GPU_TEMP".to_owned()])
    );
    assert_eq!(names_in_query("label_values(namespace)"), BTreeSet::new());
}
