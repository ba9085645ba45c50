//! What Prometheus does to our exporters' series between `/metrics` and the Grafana dashboard, as far as the
//! dashboard's labels depend on it, so that a test can show which series each panel gets:
//! - [`parse_exposition`]: the text exposition format, as Prometheus scrapes it;
//! - [`ScrapeTarget`]: the labels the Prometheus operator gives a ServiceMonitor endpoint's target, and how
//!   Prometheus merges them into each scraped series with `honor_labels` true or false;
//! - [`evaluate_dashboard`]: the dashboard's variables and panel queries evaluated on the stored series, to the
//!   label sets each returns (values are not computed). Queries are parsed with `promql-parser`; any construct the
//!   evaluator does not model is an error, never an empty or guessed result.
//!
//! The target labels are those of the Prometheus operator's generated scrape config for a ServiceMonitor endpoint
//! (role `endpoints`): `namespace`, `service`, `pod` and `container` from service discovery, `job` (the Service's
//! name, or its `jobLabel` label's value), `endpoint` (the port's name), and Prometheus' own `instance` (the target's
//! address).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result, anyhow, bail, ensure};
use promql_parser::label::{METRIC_NAME, Matcher};
use promql_parser::parser::{
    self, AggregateExpr, BinaryExpr, Call, Expr, LabelModifier, VectorSelector,
};
use serde_json::Value;

/// A series' labels, `__name__` included.
pub type Labels = BTreeMap<String, String>;

/// One sample of a scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: Labels,
    pub value: f64,
}

/// The samples of a text exposition (`name{label="value",...} value [timestamp]`); comments and blank lines are
/// skipped.
pub fn parse_exposition(text: &str) -> Result<Vec<Sample>> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty() && !line.trim_start().starts_with('#'))
        .map(|(at, line)| parse_sample(line).with_context(|| format!("line {}: {line}", at + 1)))
        .collect()
}

fn parse_sample(line: &str) -> Result<Sample> {
    let name_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    let name = &line[..name_end];
    ensure!(!name.is_empty(), "no metric name");
    let mut labels = Labels::from([(METRIC_NAME.to_owned(), name.to_owned())]);
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        rest = parse_labels(inner, &mut labels)?;
    }
    let mut fields = rest.split_whitespace();
    let value = fields.next().context("no value")?;
    let value = match value {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        number => number.parse().with_context(|| format!("value {number}"))?,
    };
    // An optional timestamp in milliseconds, then nothing.
    if let Some(timestamp) = fields.next() {
        timestamp
            .parse::<i64>()
            .with_context(|| format!("timestamp {timestamp}"))?;
    }
    ensure!(fields.next().is_none(), "text after the timestamp");
    Ok(Sample { labels, value })
}

/// Reads `label="value",...}` into `labels`; returns what follows the closing brace.
fn parse_labels<'a>(mut text: &'a str, labels: &mut Labels) -> Result<&'a str> {
    loop {
        text = text.trim_start();
        if let Some(rest) = text.strip_prefix('}') {
            return Ok(rest);
        }
        let (name, rest) = text.split_once('=').context("a label without `=`")?;
        let name = name.trim();
        ensure!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "bad label name {name:?}"
        );
        let mut chars = rest
            .trim_start()
            .strip_prefix('"')
            .context("an unquoted label value")?
            .char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    other => bail!("bad escape {other:?} in label {name}"),
                },
                Some((at, '"')) => break at,
                Some((_, c)) => value.push(c),
                None => bail!("label {name}'s value is not closed"),
            }
        };
        ensure!(
            labels.insert(name.to_owned(), value).is_none(),
            "label {name} twice"
        );
        let after = &rest.trim_start()[end + 2..];
        text = after.trim_start();
        text = text.strip_prefix(',').unwrap_or(text);
    }
}

/// A Prometheus scrape target as the Prometheus operator configures it for one ServiceMonitor endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeTarget {
    /// The target's labels, after the operator's relabelling.
    pub labels: Labels,
    /// The endpoint's `honorLabels` (the Prometheus operator's default is false).
    pub honor_labels: bool,
}

impl ScrapeTarget {
    /// The target Prometheus scrapes for `monitor`'s endpoint on the pod `pod_name` (at `pod_ip`) of `daemon_set`,
    /// behind `service`. Fails when the monitor does not select the Service or uses a field this model does not
    /// follow (relabelings, target labels, several endpoints, selectors by expression).
    pub fn of_service_monitor(
        monitor: &Value,
        service: &Value,
        daemon_set: &Value,
        pod_name: &str,
        pod_ip: &str,
    ) -> Result<Self> {
        let spec = &monitor["spec"];
        for unmodelled in ["targetLabels", "podTargetLabels"] {
            ensure!(
                spec[unmodelled].as_array().is_none_or(Vec::is_empty),
                "the ServiceMonitor's {unmodelled} is not modelled"
            );
        }
        ensure!(
            spec["selector"]["matchExpressions"]
                .as_array()
                .is_none_or(Vec::is_empty),
            "the ServiceMonitor's selector.matchExpressions is not modelled"
        );
        let service_labels = &service["metadata"]["labels"];
        for (key, value) in spec["selector"]["matchLabels"]
            .as_object()
            .context("the ServiceMonitor selects by no matchLabels")?
        {
            ensure!(
                &service_labels[key] == value,
                "the ServiceMonitor's selector {key}={value} does not select the Service (labels {service_labels})"
            );
        }
        let namespace = service["metadata"]["namespace"]
            .as_str()
            .context("the Service's namespace")?;
        let namespaces = &spec["namespaceSelector"];
        let selected = if namespaces["any"] == true {
            true
        } else if let Some(names) = namespaces["matchNames"].as_array() {
            names.iter().any(|name| name == namespace)
        } else {
            // No namespaceSelector: the ServiceMonitor's own namespace.
            monitor["metadata"]["namespace"].as_str() == Some(namespace)
        };
        ensure!(
            selected,
            "the ServiceMonitor's namespaceSelector {namespaces} leaves out {namespace}"
        );

        let endpoints = spec["endpoints"]
            .as_array()
            .context("the ServiceMonitor's endpoints")?;
        let [endpoint] = endpoints.as_slice() else {
            bail!("{} endpoints; one is modelled", endpoints.len());
        };
        for unmodelled in ["relabelings", "metricRelabelings"] {
            ensure!(
                endpoint[unmodelled].as_array().is_none_or(Vec::is_empty),
                "the endpoint's {unmodelled} are not modelled"
            );
        }
        let port_name = endpoint["port"]
            .as_str()
            .context("the endpoint names no Service port (targetPort is not modelled)")?;
        let service_port = service["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|port| port["name"] == port_name)
            .with_context(|| format!("the Service has no port {port_name}"))?;
        let target_port = &service_port["targetPort"];
        let (container, container_port) = daemon_set["spec"]["template"]["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|container| {
                let port = container["ports"].as_array()?.iter().find(|port| {
                    &port["name"] == target_port || &port["containerPort"] == target_port
                })?;
                Some((container["name"].as_str()?, port["containerPort"].as_i64()?))
            })
            .with_context(|| format!("no container of the DaemonSet has the port {target_port}"))?;
        let service_name = service["metadata"]["name"]
            .as_str()
            .context("the Service's name")?;
        let job = match spec["jobLabel"].as_str().filter(|label| !label.is_empty()) {
            Some(label) => service_labels[label]
                .as_str()
                .with_context(|| format!("the Service has no jobLabel {label}"))?,
            None => service_name,
        };
        let labels = [
            ("instance", format!("{pod_ip}:{container_port}")),
            ("job", job.to_owned()),
            ("namespace", namespace.to_owned()),
            ("service", service_name.to_owned()),
            ("pod", pod_name.to_owned()),
            ("container", container.to_owned()),
            ("endpoint", port_name.to_owned()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
        let honor_labels = match &endpoint["honorLabels"] {
            Value::Null => false,
            Value::Bool(honor) => *honor,
            other => bail!("honorLabels {other}"),
        };
        Ok(Self {
            labels,
            honor_labels,
        })
    }

    /// The series Prometheus stores from a scrape of this target. With `honor_labels` a scraped label wins over
    /// the target's label of the same name; without, the scraped one is kept as `exported_<name>` (prefixed again
    /// while that name is taken) and the target's value is set. Labels with empty values are then dropped, as
    /// Prometheus stores no empty label.
    #[must_use]
    pub fn store(&self, scraped: &[Sample]) -> Vec<Sample> {
        scraped
            .iter()
            .map(|sample| {
                let mut labels = sample.labels.clone();
                if self.honor_labels {
                    for (name, value) in &self.labels {
                        labels.entry(name.clone()).or_insert_with(|| value.clone());
                    }
                } else {
                    let mut clashing: Vec<(String, String)> = Vec::new();
                    for (name, value) in &self.labels {
                        if let Some(scraped) = labels.insert(name.clone(), value.clone())
                            && !scraped.is_empty()
                        {
                            clashing.push((name.clone(), scraped));
                        }
                    }
                    // Shorter names first, as Prometheus resolves them.
                    clashing.sort_by_key(|(name, _)| name.len());
                    for (name, value) in clashing {
                        let mut exported = name;
                        loop {
                            exported = format!("exported_{exported}");
                            if labels.get(&exported).is_none_or(String::is_empty) {
                                break;
                            }
                        }
                        labels.insert(exported, value);
                    }
                }
                labels.retain(|_, value| !value.is_empty());
                Sample {
                    labels,
                    value: sample.value,
                }
            })
            .collect()
    }
}

/// One panel query of a dashboard and the label sets it returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PanelResult {
    pub panel: String,
    pub expr: String,
    pub legend: String,
    pub series: BTreeSet<Labels>,
}

/// A dashboard evaluated on stored series: each query variable's values, and each panel query's series with the
/// variables at Grafana's default selection (All, which is the variable's `allValue`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DashboardResult {
    pub variables: BTreeMap<String, BTreeSet<String>>,
    pub panels: Vec<PanelResult>,
}

/// Evaluates `dashboard` (Grafana's JSON model) on `stored`.
pub fn evaluate_dashboard(dashboard: &Value, stored: &[Sample]) -> Result<DashboardResult> {
    let mut variables = BTreeMap::new();
    let mut selections = BTreeMap::new();
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = variable["name"]
            .as_str()
            .context("a variable without a name")?;
        match variable["type"].as_str() {
            // The data source names a plugin, not series.
            Some("datasource") => continue,
            Some("query") => {}
            other => bail!("variable {name}: type {other:?} is not modelled"),
        }
        let query = match &variable["query"] {
            Value::String(query) => query.as_str(),
            Value::Object(query) => query["query"]
                .as_str()
                .context("a query variable's query")?,
            other => bail!("variable {name}: query {other}"),
        };
        let query = substitute(query, &selections)?;
        let values =
            label_values(&query, stored).with_context(|| format!("variable {name}: {query}"))?;
        let selection = match (
            variable["includeAll"].as_bool(),
            variable["allValue"].as_str(),
        ) {
            (Some(true), Some(all)) => all.to_owned(),
            // All without an allValue: every value, as Grafana writes a multi-value selection into a regex.
            (Some(true), None) => format!(
                "({})",
                values
                    .iter()
                    .map(|value| regex::escape(value))
                    .collect::<Vec<_>>()
                    .join("|")
            ),
            _ => regex::escape(
                values
                    .first()
                    .with_context(|| format!("variable {name} has no value"))?,
            ),
        };
        selections.insert(name.to_owned(), selection);
        variables.insert(name.to_owned(), values);
    }
    let mut panels = Vec::new();
    panel_queries(dashboard, "", &mut |panel, target| {
        let expr = target["expr"].as_str().context("a target without expr")?;
        let substituted = substitute(expr, &selections)?;
        let series =
            evaluate(&substituted, stored).with_context(|| format!("panel {panel:?}: {expr}"))?;
        panels.push(PanelResult {
            panel: panel.to_owned(),
            expr: expr.to_owned(),
            legend: target["legendFormat"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            series,
        });
        Ok(())
    })?;
    Ok(DashboardResult { variables, panels })
}

/// Calls `each` with every panel's (and row's panels') title and targets.
fn panel_queries(
    value: &Value,
    title: &str,
    each: &mut impl FnMut(&str, &Value) -> Result<()>,
) -> Result<()> {
    for panel in value["panels"].as_array().into_iter().flatten() {
        let title = panel["title"].as_str().unwrap_or(title);
        for target in panel["targets"].as_array().into_iter().flatten() {
            each(title, target)?;
        }
        panel_queries(panel, title, each)?;
    }
    Ok(())
}

/// Grafana's variables in `query`: `$name` and `${name}` by `selections`, the interval macros by 5m (any range
/// returns the same labels).
fn substitute(query: &str, selections: &BTreeMap<String, String>) -> Result<String> {
    let mut out = String::new();
    let mut rest = query;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, next) = match after.strip_prefix('{') {
            Some(braced) => {
                let end = braced.find('}').context("an unclosed ${")?;
                (&braced[..end], &braced[end + 1..])
            }
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], &after[end..])
            }
        };
        match name {
            "__rate_interval" | "__interval" | "__range" => out.push_str("5m"),
            _ => out.push_str(
                selections
                    .get(name)
                    .ok_or_else(|| anyhow!("unknown Grafana variable ${name} in {query}"))?,
            ),
        }
        rest = next;
    }
    out.push_str(rest);
    Ok(out)
}

/// The values of Grafana's `label_values(selector, label)` (or `label_values(label)`, over every series), sorted.
fn label_values(query: &str, stored: &[Sample]) -> Result<BTreeSet<String>> {
    let arguments = query
        .trim()
        .strip_prefix("label_values(")
        .and_then(|arguments| arguments.strip_suffix(')'))
        .with_context(|| {
            format!("only label_values(...) variable queries are modelled: {query}")
        })?;
    let (series, label) = match arguments.rsplit_once(',') {
        Some((selector, label)) => (evaluate(selector, stored)?, label.trim()),
        None => (
            stored.iter().map(|sample| sample.labels.clone()).collect(),
            arguments.trim(),
        ),
    };
    Ok(series
        .into_iter()
        .filter_map(|labels| labels.get(label).cloned())
        .collect())
}

/// The label sets a PromQL expression returns on `stored`.
pub fn evaluate(expr: &str, stored: &[Sample]) -> Result<BTreeSet<Labels>> {
    let parsed = parser::parse(expr).map_err(|error| anyhow!("parsing {expr}: {error}"))?;
    eval(&parsed, stored)
}

fn eval(expr: &Expr, stored: &[Sample]) -> Result<BTreeSet<Labels>> {
    match expr {
        Expr::VectorSelector(selector) => select(selector, stored),
        Expr::MatrixSelector(matrix) => select(&matrix.vs, stored),
        Expr::Paren(paren) => eval(&paren.expr, stored),
        Expr::Call(call) => call_labels(call, stored),
        Expr::Aggregate(aggregate) => aggregate_labels(aggregate, stored),
        Expr::Binary(binary) => binary_labels(binary, stored),
        other => bail!("not modelled: {other}"),
    }
}

fn select(selector: &VectorSelector, stored: &[Sample]) -> Result<BTreeSet<Labels>> {
    ensure!(
        selector.offset.is_none() && selector.at.is_none(),
        "offset and @ are not modelled: {selector}"
    );
    ensure!(
        selector.matchers.or_matchers.is_empty(),
        "`or` inside a selector is not modelled: {selector}"
    );
    // A label a series lacks matches as the empty string, as in Prometheus.
    let matches = |labels: &Labels, matcher: &Matcher| {
        matcher.is_match(labels.get(&matcher.name).map_or("", String::as_str))
    };
    Ok(stored
        .iter()
        .filter(|sample| {
            selector
                .name
                .as_ref()
                .is_none_or(|name| sample.labels.get(METRIC_NAME) == Some(name))
        })
        .filter(|sample| {
            selector
                .matchers
                .matchers
                .iter()
                .all(|matcher| matches(&sample.labels, matcher))
        })
        .map(|sample| sample.labels.clone())
        .collect())
}

/// Functions that keep each series' labels but its name.
const LABEL_KEEPING: [&str; 12] = [
    "rate",
    "irate",
    "increase",
    "delta",
    "idelta",
    "deriv",
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "count_over_time",
    "abs",
];

fn call_labels(call: &Call, stored: &[Sample]) -> Result<BTreeSet<Labels>> {
    ensure!(
        LABEL_KEEPING.contains(&call.func.name),
        "function {} is not modelled",
        call.func.name
    );
    let [argument] = call.args.args.as_slice() else {
        bail!(
            "{} with {} arguments is not modelled",
            call.func.name,
            call.args.args.len()
        );
    };
    Ok(without_name(eval(argument, stored)?))
}

fn without_name(series: BTreeSet<Labels>) -> BTreeSet<Labels> {
    series
        .into_iter()
        .map(|mut labels| {
            labels.remove(METRIC_NAME);
            labels
        })
        .collect()
}

fn aggregate_labels(aggregate: &AggregateExpr, stored: &[Sample]) -> Result<BTreeSet<Labels>> {
    let op = aggregate.op.to_string();
    ensure!(
        matches!(
            op.as_str(),
            "sum" | "min" | "max" | "avg" | "count" | "group"
        ) && aggregate.param.is_none(),
        "aggregation {op} is not modelled"
    );
    let inner = eval(&aggregate.expr, stored)?;
    Ok(inner
        .into_iter()
        .map(|labels| match &aggregate.modifier {
            None => Labels::new(),
            Some(LabelModifier::Include(by)) => labels
                .into_iter()
                .filter(|(name, _)| by.labels.contains(name))
                .collect(),
            Some(LabelModifier::Exclude(without)) => labels
                .into_iter()
                .filter(|(name, _)| name != METRIC_NAME && !without.labels.contains(name))
                .collect(),
        })
        .collect())
}

/// The set operators: `and`, `or`, `unless`, matching on all labels but the name, `on(...)` or `ignoring(...)`.
fn binary_labels(binary: &BinaryExpr, stored: &[Sample]) -> Result<BTreeSet<Labels>> {
    let op = binary.op.to_string();
    ensure!(
        binary.op.is_set_operator(),
        "binary operator {op} is not modelled"
    );
    let lhs = eval(&binary.lhs, stored)?;
    let rhs = eval(&binary.rhs, stored)?;
    let matching = binary
        .modifier
        .as_ref()
        .and_then(|modifier| modifier.matching.as_ref());
    let signature = |labels: &Labels| -> Labels {
        labels
            .iter()
            .filter(|(name, _)| match matching {
                Some(LabelModifier::Include(on)) => on.labels.contains(name),
                Some(LabelModifier::Exclude(ignoring)) => {
                    name.as_str() != METRIC_NAME && !ignoring.labels.contains(name)
                }
                None => name.as_str() != METRIC_NAME,
            })
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect()
    };
    let right: BTreeSet<Labels> = rhs.iter().map(signature).collect();
    Ok(match op.as_str() {
        "and" => lhs
            .into_iter()
            .filter(|labels| right.contains(&signature(labels)))
            .collect(),
        "unless" => lhs
            .into_iter()
            .filter(|labels| !right.contains(&signature(labels)))
            .collect(),
        _ => {
            let left: BTreeSet<Labels> = lhs.iter().map(signature).collect();
            lhs.into_iter()
                .chain(
                    rhs.into_iter()
                        .filter(|labels| !left.contains(&signature(labels))),
                )
                .collect()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn exposition_lines_with_escapes_comments_and_timestamps() {
        let samples = parse_exposition(
            "# HELP up Whether.\n# TYPE up gauge\nup 1\n\
             m{a=\"x \\\"y\\\" \\\\ z\\n\", b = \"\",} -Inf 1700000000000\nn{} NaN\n",
        )
        .unwrap();
        assert_eq!(samples.len(), 3);
        assert_eq!(samples[0].labels, labels(&[("__name__", "up")]));
        assert_eq!(
            samples[1].labels,
            labels(&[("__name__", "m"), ("a", "x \"y\" \\ z\n"), ("b", "")])
        );
        assert_eq!(samples[1].value, f64::NEG_INFINITY);
        assert!(samples[2].value.is_nan());
        for bad in [
            "m{a=x} 1",
            "m{a=\"x} 1",
            "m 1 2 3",
            "{a=\"x\"} 1",
            "m{a=\"\\t\"} 1",
        ] {
            assert!(parse_exposition(bad).is_err(), "{bad}");
        }
    }

    fn target(honor_labels: bool) -> ScrapeTarget {
        ScrapeTarget {
            labels: labels(&[
                ("namespace", "monitoring"),
                ("pod", "exporter-x"),
                ("job", "exporter"),
            ]),
            honor_labels,
        }
    }

    #[test]
    fn honoured_labels_win_and_others_are_exported() {
        let scraped = [Sample {
            labels: labels(&[
                ("__name__", "m"),
                ("namespace", "ml"),
                ("pod", "trainer"),
                ("exported_pod", "taken"),
                ("job", ""),
            ]),
            value: 1.0,
        }];
        assert_eq!(
            target(true).store(&scraped)[0].labels,
            labels(&[
                ("__name__", "m"),
                ("namespace", "ml"),
                ("pod", "trainer"),
                ("exported_pod", "taken"),
            ])
        );
        // An empty scraped label is no clash: the target's job is set, nothing exported.
        assert_eq!(
            target(false).store(&scraped)[0].labels,
            labels(&[
                ("__name__", "m"),
                ("namespace", "monitoring"),
                ("exported_namespace", "ml"),
                ("pod", "exporter-x"),
                ("exported_pod", "taken"),
                ("exported_exported_pod", "trainer"),
                ("job", "exporter"),
            ])
        );
    }

    #[test]
    fn queries_return_the_label_sets_prometheus_would() {
        let stored: Vec<Sample> = [
            labels(&[
                ("__name__", "used"),
                ("gpu", "0"),
                ("namespace", "ml"),
                ("pod", "a"),
            ]),
            labels(&[
                ("__name__", "used"),
                ("gpu", "1"),
                ("namespace", "ml"),
                ("pod", "b"),
            ]),
            labels(&[
                ("__name__", "used"),
                ("gpu", "1"),
                ("namespace", "web"),
                ("pod", "c"),
            ]),
            labels(&[
                ("__name__", "budget"),
                ("gpu", "1"),
                ("namespace", "ml"),
                ("pod", "b"),
                ("source", "dra-claim"),
            ]),
        ]
        .into_iter()
        .map(|labels| Sample { labels, value: 1.0 })
        .collect();
        let eval = |expr: &str| evaluate(expr, &stored).unwrap();
        assert_eq!(
            eval(r#"sum by (namespace) (increase(used{namespace=~"m.*", pod!="a"}[5m]))"#),
            BTreeSet::from([labels(&[("namespace", "ml")])])
        );
        assert_eq!(eval("sum(used)"), BTreeSet::from([Labels::new()]));
        assert_eq!(
            eval("max without (pod, namespace) (used)"),
            BTreeSet::from([labels(&[("gpu", "0")]), labels(&[("gpu", "1")])])
        );
        assert_eq!(
            eval(r#"used and on (gpu, pod) budget{source="dra-claim"}"#),
            BTreeSet::from([stored[1].labels.clone()])
        );
        assert_eq!(eval(r#"used{missing=""}"#).len(), 3);
        for unmodelled in [
            "used * 2",
            "topk(1, used)",
            "label_replace(used, \"a\", \"b\", \"c\", \"d\")",
            "used offset 5m",
        ] {
            let error = evaluate(unmodelled, &stored).unwrap_err().to_string();
            assert!(error.contains("not modelled"), "{unmodelled}: {error}");
        }
    }

    #[test]
    fn dashboard_variables_select_as_grafana_does() {
        let stored = [Sample {
            labels: labels(&[("__name__", "used"), ("namespace", "ml"), ("pod", "a")]),
            value: 1.0,
        }];
        let dashboard = json!({
            "templating": {"list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus"},
                {"name": "namespace", "type": "query", "includeAll": true, "allValue": ".*",
                 "query": "label_values(used, namespace)"},
            ]},
            "panels": [{"title": "row", "panels": [{"title": "per pod", "targets": [
                {"expr": "sum by (pod) (rate(used{namespace=~\"$namespace\"}[$__rate_interval]))", "legendFormat": "{{pod}}"},
            ]}]}],
        });
        let result = evaluate_dashboard(&dashboard, &stored).unwrap();
        assert_eq!(
            result.variables["namespace"],
            BTreeSet::from(["ml".to_owned()])
        );
        assert_eq!(result.panels.len(), 1);
        assert_eq!(result.panels[0].panel, "per pod");
        assert_eq!(
            result.panels[0].series,
            BTreeSet::from([labels(&[("pod", "a")])])
        );

        let unknown =
            json!({"panels": [{"title": "p", "targets": [{"expr": "used{pod=\"$nope\"}"}]}]});
        let error = format!("{:#}", evaluate_dashboard(&unknown, &stored).unwrap_err());
        assert!(error.contains("unknown Grafana variable $nope"), "{error}");
    }
}
