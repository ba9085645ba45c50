//! `cargo xtask chart`: the Helm chart's checks that need only the helm binary, no cluster. `helm lint --strict`
//! and `helm template` with every values file users start from (none, NVIDIA's complete values file, ours in
//! examples/); a misspelled key refused by the values schema (lint, template and install), with the key named; DRA
//! objects only where the API server serves resource.k8s.io/v1; Kubernetes versions below Chart.yaml's kubeVersion
//! refused; Helm's standard labels on every object the chart renders.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail, ensure};
use serde_json::Value;

/// The chart, relative to the workspace root.
const CHART: &str = "charts/gpu-operator";
/// NVIDIA's complete values file, which must keep installing.
const NVIDIA_VALUES: &str = "tests/fixtures/nvidia/values-v26.7.0.yaml";

/// The API versions a server of each release serves for Dynamic Resource Allocation, as Helm lists a server's
/// capabilities: each group/version, and each group/version/kind. 1.33 serves DRA's beta versions only (where
/// enabled), 1.34 adds v1.
const DRA_APIS_1_33: &[&str] = &[
    "resource.k8s.io/v1beta1",
    "resource.k8s.io/v1beta1/DeviceClass",
    "resource.k8s.io/v1beta1/ResourceSlice",
    "resource.k8s.io/v1beta2",
    "resource.k8s.io/v1beta2/DeviceClass",
    "resource.k8s.io/v1beta2/ResourceSlice",
];
const DRA_APIS_1_34: &[&str] = &[
    "resource.k8s.io/v1",
    "resource.k8s.io/v1/DeviceClass",
    "resource.k8s.io/v1/ResourceSlice",
    "resource.k8s.io/v1beta2",
    "resource.k8s.io/v1beta2/DeviceClass",
    "resource.k8s.io/v1beta2/ResourceSlice",
];

/// The labels Helm's conventions give every object of a chart.
const STANDARD_LABELS: &[&str] = &[
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/component",
    "helm.sh/chart",
];

/// Runs every check with the helm found on the `PATH` of `env`.
pub fn check(root: &Path, env: &[(String, String)]) -> anyhow::Result<()> {
    let helm = Helm {
        env,
        chart: root.join(CHART).display().to_string(),
    };
    for values in user_values_files(root)? {
        let file = values.display().to_string();
        helm.ok(&["lint", "--strict", &helm.chart, "-f", &file])?;
        helm.ok(&["template", "gpu-operator", &helm.chart, "-f", &file])?;
        println!("{file}: lint and template pass");
    }
    refuses_misspelled_keys(&helm)?;
    dra_objects_follow_the_served_apis(&helm)?;
    every_object_has_the_standard_labels(&helm)?;
    network_policy_admits_only_the_operators_ports(&helm)
}

/// The values files users install with: the chart's defaults (none), NVIDIA's complete file, and every
/// `*values.yaml` in examples/.
fn user_values_files(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = vec![
        root.join(CHART).join("values.yaml"),
        root.join(NVIDIA_VALUES),
    ];
    let examples = root.join("examples");
    for entry in
        std::fs::read_dir(&examples).with_context(|| format!("listing {}", examples.display()))?
    {
        let path = entry?.path();
        if path
            .file_name()
            .is_some_and(|name| name.to_string_lossy().ends_with("values.yaml"))
        {
            files.push(path);
        }
    }
    Ok(files)
}

fn refuses_misspelled_keys(helm: &Helm) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("gpu-operator-chart-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let typo = dir.join("misspelled-values.yaml");
    std::fs::write(&typo, "devicePlugin:\n  enabeld: true\n")?;
    let typo = typo.display().to_string();
    // `install --dry-run=client` validates as `install` does, without a cluster.
    let commands: [&[&str]; 3] = [
        &["lint", "--strict", &helm.chart],
        &["template", "gpu-operator", &helm.chart],
        &["install", "gpu-operator", &helm.chart, "--dry-run=client"],
    ];
    for command_line in commands {
        let command = command_line[0];
        let mut args = command_line.to_vec();
        args.extend(["-f", &typo]);
        let outcome = helm.outcome(&args)?;
        ensure!(
            !outcome.success,
            "helm {command} accepted devicePlugin.enabeld:\n{}",
            outcome.output
        );
        ensure!(
            outcome.output.contains("/devicePlugin")
                && outcome.output.contains("'enabeld' not allowed"),
            "helm {command} refused the misspelled key without naming it:\n{}",
            outcome.output
        );
        println!(
            "helm {command} refuses devicePlugin.enabeld: {}",
            outcome
                .output
                .lines()
                .find(|line| line.contains("enabeld"))
                .unwrap_or_default()
                .trim()
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

fn dra_objects_follow_the_served_apis(helm: &Helm) -> anyhow::Result<()> {
    let render = |kube_version: &str, apis: &[&str]| -> anyhow::Result<Vec<Value>> {
        let mut args = vec![
            "template",
            "gpu-operator",
            &helm.chart,
            "--kube-version",
            kube_version,
        ];
        for api in apis {
            args.extend(["--api-versions", api]);
        }
        objects(&helm.ok(&args)?)
    };
    let on_1_33 = render("1.33.0", DRA_APIS_1_33)?;
    ensure!(
        dra_objects(&on_1_33).is_empty() && hami_webhook(&on_1_33) == Some("false"),
        "DRA objects or the HAMi webhook (which makes DRA claims) for Kubernetes 1.33, which does not serve resource.k8s.io/v1: {:?}, HAMI_WEBHOOK={:?}",
        dra_objects(&on_1_33),
        hami_webhook(&on_1_33)
    );
    let on_1_34 = render("1.34.0", DRA_APIS_1_34)?;
    let dra_1_34 = dra_objects(&on_1_34);
    ensure!(
        dra_1_34
            .iter()
            .any(|object| object == "DeviceClass gpu.nvidia.com")
            && hami_webhook(&on_1_34) == Some("true"),
        "no DeviceClass or no HAMi webhook for Kubernetes 1.34: {dra_1_34:?}, HAMI_WEBHOOK={:?}",
        hami_webhook(&on_1_34)
    );
    println!("DRA: nothing for Kubernetes 1.33; {dra_1_34:?} and the HAMi webhook for 1.34");
    let below = helm.outcome(&[
        "template",
        "gpu-operator",
        &helm.chart,
        "--kube-version",
        "1.32.0",
    ])?;
    ensure!(
        !below.success && below.output.contains("kubeVersion"),
        "Kubernetes 1.32 is below Chart.yaml's kubeVersion but the chart rendered:\n{}",
        below.output
    );
    Ok(())
}

fn every_object_has_the_standard_labels(helm: &Helm) -> anyhow::Result<()> {
    // Every optional object switched on, the DeviceClasses included.
    let mut args = vec!["template", "gpu-operator", &helm.chart];
    for value in [
        "dashboard.enabled=true",
        "prometheusRule.enabled=true",
        "operator.serviceMonitor.enabled=true",
        "operator.networkPolicy.enabled=true",
    ] {
        args.extend(["--set", value]);
    }
    for api in DRA_APIS_1_34 {
        args.extend(["--api-versions", api]);
    }
    let rendered = helm.ok(&args)?;
    let missing = objects_missing_labels(&rendered)?;
    ensure!(
        missing.is_empty(),
        "objects without Helm's standard labels: {missing:#?}"
    );
    println!("every rendered object has {}", STANDARD_LABELS.join(", "));
    Ok(())
}

/// `operator.networkPolicy`: the policy selects the operator's pods, admits exactly the ports its container
/// names (webhook and health), and the webhook only from the peers the values give.
fn network_policy_admits_only_the_operators_ports(helm: &Helm) -> anyhow::Result<()> {
    let api_server = "192.0.2.0/24";
    let rendered = helm.ok(&[
        "template",
        "gpu-operator",
        &helm.chart,
        "--set",
        "operator.networkPolicy.enabled=true",
        "--set",
        &format!("operator.networkPolicy.webhookFrom[0].ipBlock.cidr={api_server}"),
    ])?;
    let objects = objects(&rendered)?;
    let find = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .with_context(|| format!("no {kind} {name} rendered"))
    };
    let policy = find("NetworkPolicy", "gpu-operator")?;
    let deployment = find("Deployment", "gpu-operator")?;
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let selected = policy["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .context("the policy selects pods by labels")?;
    ensure!(
        selected
            .iter()
            .all(|(key, value)| &pod_labels[key] == value),
        "the policy selects {selected:?}, the operator's pods carry {pod_labels}"
    );
    let container_ports: BTreeSet<&str> =
        deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
            .as_array()
            .context("the operator container's ports")?
            .iter()
            .filter_map(|port| port["name"].as_str())
            .collect();
    let rules = policy["spec"]["ingress"]
        .as_array()
        .context("ingress rules")?;
    let admitted: BTreeSet<&str> = rules
        .iter()
        .flat_map(|rule| rule["ports"].as_array().into_iter().flatten())
        .filter_map(|port| port["port"].as_str())
        .collect();
    ensure!(
        admitted == container_ports,
        "the policy admits {admitted:?}, the operator listens on {container_ports:?}"
    );
    let webhook_rule = rules
        .iter()
        .find(|rule| rule["ports"][0]["port"] == "webhook")
        .context("a rule for the webhook")?;
    ensure!(
        webhook_rule["from"] == serde_json::json!([{"ipBlock": {"cidr": api_server}}]),
        "the webhook rule admits {} instead of the API server's {api_server}",
        webhook_rule["from"]
    );
    println!("operator.networkPolicy admits {admitted:?}, the webhook only from {api_server}");
    Ok(())
}

/// `kind name` of each object in the group resource.k8s.io.
fn dra_objects(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .filter(|object| {
            object["apiVersion"]
                .as_str()
                .is_some_and(|api| api.starts_with("resource.k8s.io/"))
        })
        .map(describe)
        .collect()
}

/// The operator Deployment's HAMI_WEBHOOK setting.
fn hami_webhook(objects: &[Value]) -> Option<&str> {
    let deployment = objects
        .iter()
        .find(|object| object["kind"] == "Deployment")?;
    deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()?
        .iter()
        .find(|variable| variable["name"] == "HAMI_WEBHOOK")?["value"]
        .as_str()
}

/// `kind name: missing labels` of each object of `rendered` without every one of [`STANDARD_LABELS`].
fn objects_missing_labels(rendered: &str) -> anyhow::Result<Vec<String>> {
    Ok(objects(rendered)?
        .iter()
        .filter_map(|object| {
            let labels = &object["metadata"]["labels"];
            let missing: Vec<&str> = STANDARD_LABELS
                .iter()
                .copied()
                .filter(|label| labels[*label].as_str().is_none_or(str::is_empty))
                .collect();
            (!missing.is_empty()).then(|| format!("{}: {}", describe(object), missing.join(", ")))
        })
        .collect())
}

fn objects(rendered: &str) -> anyhow::Result<Vec<Value>> {
    Ok(serde_saphyr::from_multiple::<Value>(rendered)
        .context("helm template printed YAML that does not parse")?
        .into_iter()
        .filter(|object| !object.is_null())
        .collect())
}

fn describe(object: &Value) -> String {
    format!(
        "{} {}",
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

struct Helm<'a> {
    env: &'a [(String, String)],
    chart: String,
}

/// Whether a helm command succeeded, and what it printed (standard output and error).
struct Outcome {
    success: bool,
    output: String,
}

impl Helm<'_> {
    fn run(&self, args: &[&str]) -> anyhow::Result<std::process::Output> {
        Command::new("helm")
            .args(args)
            .envs(self.env.iter().map(|(key, value)| (key, value)))
            .output()
            .context("cannot start helm")
    }

    fn outcome(&self, args: &[&str]) -> anyhow::Result<Outcome> {
        let output = self.run(args)?;
        Ok(Outcome {
            success: output.status.success(),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }

    /// Standard output of a command that must succeed.
    fn ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let output = self.run(args)?;
        if !output.status.success() {
            bail!(
                "`helm {}` failed:\n{}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RENDERED: &str = "---\n# Source: a.yaml\napiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n  name: gpu.nvidia.com\n  labels:\n    app.kubernetes.io/name: gpu-operator\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: plain\n  labels:\n    app.kubernetes.io/name: gpu-operator\n    app.kubernetes.io/instance: x\n    app.kubernetes.io/version: \"0.1.0\"\n    app.kubernetes.io/managed-by: Helm\n    app.kubernetes.io/component: config\n    helm.sh/chart: gpu-operator-0.1.0\n";

    #[test]
    fn dra_objects_are_those_of_the_resource_group() {
        assert_eq!(
            dra_objects(&objects(RENDERED).expect("parses")),
            ["DeviceClass gpu.nvidia.com"]
        );
    }

    #[test]
    fn objects_missing_labels_names_object_and_labels() {
        let missing = objects_missing_labels(RENDERED).expect("parses");
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(
            missing[0].starts_with("DeviceClass gpu.nvidia.com: app.kubernetes.io/instance,"),
            "{missing:?}"
        );
        assert!(missing[0].ends_with("helm.sh/chart"), "{missing:?}");
    }
}
