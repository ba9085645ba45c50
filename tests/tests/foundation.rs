//! The foundation against a real kube-apiserver: the chart installs the CRDs and the default ClusterPolicy,
//! NVIDIA-shaped resources apply unchanged and read back whole, the guides' commands work verbatim, the CEL
//! rules reject bad input with their messages, `kubectl explain` and `kubectl get` show what users expect, and
//! the operator upgrades its CRDs at start with nothing but its own RBAC, and that RBAC has no wildcards, no
//! Secrets and no admin roles.

use std::time::Duration;

use e2e::*;
use serde_json::{Value, json};

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn helm_installs_crds_and_default_cluster_policy() {
    chart_installed();
    for crd in ["clusterpolicies.nvidia.com", "gpunodes.nvidia.com"] {
        let established = kubectl(&[
            "get",
            "crd",
            crd,
            "-o",
            "jsonpath={.status.conditions[?(@.type=='Established')].status}",
        ]);
        assert_eq!(established, "True", "{crd} is established");
    }
    let policy = kubectl_json(&["get", "clusterpolicy", "cluster-policy"]);
    assert_eq!(
        policy["spec"]["driver"]["enabled"],
        json!(false),
        "--set driver.enabled=false reached the CR"
    );
    assert_eq!(policy["spec"]["mig"]["strategy"], "single");
    assert_eq!(
        policy["spec"]["migManager"]["config"]["default"],
        "all-disabled"
    );
    assert_eq!(policy["spec"]["devicePlugin"]["image"], "gpu-device-plugin");
    let deployment = kubectl_json(&["get", "deployment", "gpu-operator", "-n", NAMESPACE]);
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["args"],
        json!(["run"])
    );
    assert_eq!(
        deployment["status"]["readyReplicas"],
        json!(1),
        "helm --wait saw the operator pod ready (kwok)"
    );
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn nvidia_shaped_policy_applies_unchanged_and_reads_back_whole() {
    chart_installed();
    let manifest = fixture("nvidia-clusterpolicy.yaml");
    let applied = kubectl_apply(&manifest, &["--validate=strict"]);
    assert!(
        applied.success,
        "NVIDIA-shaped ClusterPolicy rejected:\n{}",
        applied.stderr
    );
    assert!(
        applied.stderr.is_empty(),
        "kubectl warned about fields: {}",
        applied.stderr
    );

    let written: Value = serde_saphyr::from_str(&manifest).expect("fixture is YAML");
    let read = kubectl_json(&["get", "clusterpolicy", "nvidia-sample"]);
    let missing = missing_fields(&written["spec"], &read["spec"], "spec");
    assert!(
        missing.is_empty(),
        "fields lost or changed on the way through the API server: {missing:#?}"
    );

    // A field this version does not know (a newer NVIDIA field, or a typo) is kept, not pruned.
    kubectl(&[
        "patch",
        "clusterpolicy",
        "nvidia-sample",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"driver":{"futureField":{"x":1}}}}"#,
    ]);
    let read = kubectl_json(&["get", "clusterpolicy", "nvidia-sample"]);
    assert_eq!(read["spec"]["driver"]["futureField"], json!({"x": 1}));
    kubectl(&["delete", "clusterpolicy", "nvidia-sample"]);
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn guide_patch_commands_work_verbatim() {
    chart_installed();
    // The two commands from NVIDIA's guides, character for character (the -n flag is ignored for a
    // cluster-scoped resource, as it is with NVIDIA's operator).
    guide_patch(
        r#"{"spec": {"devicePlugin": {"config": {"name": "time-slicing-config-all", "default": "any"}}}}"#,
    );
    guide_patch(r#"{"spec": {"migManager": {"env": [{"name": "WITH_REBOOT", "value": "true"}]}}}"#);
    let policy = kubectl_json(&["get", "clusterpolicy", "cluster-policy"]);
    assert_eq!(
        policy["spec"]["devicePlugin"]["config"],
        json!({"name": "time-slicing-config-all", "default": "any"})
    );
    assert_eq!(
        policy["spec"]["migManager"]["env"],
        json!([{"name": "WITH_REBOOT", "value": "true"}])
    );
    // And the guide's way back: an empty config name removes time-slicing.
    kubectl(&[
        "patch",
        "clusterpolicy/cluster-policy",
        "--type",
        "merge",
        "-p",
        r#"{"spec": {"devicePlugin": {"config": {"name": "", "default": ""}}}}"#,
    ]);
}

/// Each rule with a bad policy fragment and the words its rejection must contain. Every rule refuses only what
/// NVIDIA's operator fails on too (crd::crds::tests::every_cel_rule_refuses_only_what_nvidia_fails_on); the
/// comment on each case says how NVIDIA's operator fails on the same input.
fn cel_cases() -> Vec<(&'static str, Value, &'static str)> {
    vec![
        (
            // NVIDIA: imagePath returns "invalid image specification: repository, image and version must all be set".
            "partial image triple",
            json!({"devicePlugin": {"repository": "nvcr.io/nvidia", "image": "k8s-device-plugin"}}),
            "spec.devicePlugin: Invalid value: repository, image and version must be set together",
        ),
        (
            // NVIDIA: the same imagePath error.
            "image triple without image",
            json!({"driver": {"repository": "nvcr.io/nvidia", "version": "570.172.08"}}),
            "spec.driver: Invalid value: repository, image and version must be set together",
        ),
        (
            // NVIDIA: its CRD's enum [none, single, mixed] refuses it.
            "mig strategy",
            json!({"mig": {"strategy": "both"}}),
            "mig.strategy must be none, single or mixed",
        ),
        (
            // NVIDIA: its CRD's enum [RollingUpdate, OnDelete] refuses it.
            "update strategy",
            json!({"daemonsets": {"updateStrategy": "Recreate"}}),
            "daemonsets.updateStrategy must be RollingUpdate or OnDelete",
        ),
        (
            // NVIDIA: applyUpdateStrategyConfig returns "failed to apply rolling update config" (not an integer).
            "max unavailable",
            json!({"daemonsets": {"rollingUpdate": {"maxUnavailable": "one"}}}),
            "daemonsets.rollingUpdate.maxUnavailable must be a whole number of nodes such as 1, or a percentage",
        ),
        (
            // NVIDIA: the DaemonSet it renders with maxUnavailable -1 is refused by the API server.
            "negative max unavailable",
            json!({"daemonsets": {"rollingUpdate": {"maxUnavailable": -1}}}),
            "daemonsets.rollingUpdate.maxUnavailable must be a whole number",
        ),
        (
            // NVIDIA: with autoUpgrade, the upgrade controller's GetScaledValueFromIntOrPercent errors on it.
            "driver upgrade max unavailable",
            json!({"driver": {"upgradePolicy": {"autoUpgrade": true, "maxUnavailable": "half"}}}),
            "driver.upgradePolicy.maxUnavailable must be a whole number",
        ),
        (
            // NVIDIA: its CRD's enum [auto, open, proprietary] refuses it.
            "kernel module type",
            json!({"driver": {"kernelModuleType": "closed"}}),
            "driver.kernelModuleType must be auto, open or proprietary",
        ),
        (
            // NVIDIA: its CRD's enum [all-disabled, ""] refuses it.
            "mig manager default",
            json!({"migManager": {"config": {"default": "all-1g.5gb"}}}),
            "migManager.config.default must be all-disabled or empty",
        ),
        (
            // Ours: NVIDIA has no watchdog section.
            "watchdog interval",
            json!({"watchdog": {"enabled": true, "intervalSeconds": 0}}),
            "watchdog.intervalSeconds must be between 1 and 300 seconds",
        ),
        (
            // Ours.
            "watchdog kill grace period",
            json!({"watchdog": {"killGracePeriodSeconds": 3601}}),
            "watchdog.killGracePeriodSeconds must be between 1 and 600 seconds",
        ),
        (
            // Ours.
            "watchdog default budget",
            json!({"watchdog": {"defaultBudget": "half"}}),
            "watchdog.defaultBudget must be replicaShare or none",
        ),
        (
            // Ours: NVIDIA has no DRA driver section.
            "DRA driver GPU set",
            json!({"draDriver": {"enabled": true, "gpus": "gpu0"}}),
            "draDriver.gpus must be all, none, or GPU indices and ranges such as 0,2-3",
        ),
        (
            // Ours.
            "DRA driver shared GPU set",
            json!({"draDriver": {"sharedGPUs": "1-"}}),
            "draDriver.sharedGPUs must be all, none, or GPU indices and ranges such as 0,2-3",
        ),
        (
            // Ours.
            "DRA driver dynamic MIG GPU set",
            json!({"draDriver": {"dynamicMIG": "some"}}),
            "draDriver.dynamicMIG must be all, none, or GPU indices and ranges such as 0,2-3",
        ),
    ]
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn cel_rules_reject_bad_input_with_their_message() {
    chart_installed();
    let mut failures = Vec::new();
    for (case, spec, message) in cel_cases() {
        let manifest = json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cel-check"}, "spec": spec});
        let result = kubectl_apply(&manifest.to_string(), &["--dry-run=server"]);
        if result.success || !result.stderr.contains(message) {
            failures.push(format!(
                "{case}: expected rejection containing {message:?}, got success={} stderr={}",
                result.success, result.stderr
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    // The same fragments made valid are accepted: the rules reject only what is wrong.
    let valid = json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cel-check"}, "spec": {
        "devicePlugin": {"repository": "nvcr.io/nvidia", "image": "k8s-device-plugin", "version": "v0.17.2", "config": {"name": "cfg", "default": "any"}},
        "driver": {"image": "registry.local/driver@sha256:0123", "upgradePolicy": {"maxUnavailable": 2}},
        "daemonsets": {"updateStrategy": "OnDelete", "rollingUpdate": {"maxUnavailable": "25%"}},
        "mig": {"strategy": "mixed"}, "migManager": {"config": {"default": ""}},
        "watchdog": {"enabled": true, "dryRun": true, "intervalSeconds": 1, "gracePeriodSeconds": 0, "killGracePeriodSeconds": 600, "defaultBudget": "none"},
        "draDriver": {"enabled": true, "gpus": "0,2-3", "sharedGPUs": "all", "dynamicMIG": "2-3"}
    }});
    let result = kubectl_apply(&valid.to_string(), &["--dry-run=server"]);
    assert!(result.success, "valid policy rejected: {}", result.stderr);
    // What NVIDIA's operator accepts and ignores is accepted too (the status warns): a default without a name,
    // an unknown pull policy (IfNotPresent), any defaultRuntime (unread), maxUnavailable where it is not read
    // (OnDelete, autoUpgrade false), a partial image triple in a disabled section (no image is resolved).
    let tolerated = json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cel-check"}, "spec": {
        "devicePlugin": {"config": {"name": "", "default": "any"}},
        "toolkit": {"imagePullPolicy": "Sometimes"},
        "operator": {"defaultRuntime": "podman"},
        "daemonsets": {"updateStrategy": "OnDelete", "rollingUpdate": {"maxUnavailable": "one"}},
        "driver": {"upgradePolicy": {"autoUpgrade": false, "maxUnavailable": "half"}},
        "gfd": {"enabled": false, "repository": "nvcr.io/nvidia"}
    }});
    let result = kubectl_apply(&tolerated.to_string(), &["--dry-run=server"]);
    assert!(
        result.success,
        "tolerated policy rejected: {}",
        result.stderr
    );
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn chart_rejects_embedded_sharing_configs_with_too_few_replicas() {
    let chart = chart_dir();
    let bad = run(
        "helm",
        &[
            "template",
            "gpu-operator",
            &chart,
            "--set",
            "devicePlugin.config.create=true",
            "--set",
            "devicePlugin.config.name=sharing",
            "--set-string",
            "devicePlugin.config.data.slice-1=version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 1\n",
        ],
    );
    assert!(!bad.success);
    assert!(
        bad.stderr.contains("devicePlugin.config.data.slice-1: sharing.timeSlicing.resources[0].replicas is 1; replicas must be at least 2"),
        "{}", bad.stderr
    );
    let good = ok(
        "helm",
        &[
            "template",
            "gpu-operator",
            &chart,
            "--set",
            "devicePlugin.config.create=true",
            "--set",
            "devicePlugin.config.name=sharing",
            "--set",
            "devicePlugin.config.default=slice-4",
            "--set-string",
            "devicePlugin.config.data.slice-4=version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
        ],
    );
    assert!(
        good.contains("kind: ConfigMap") && good.contains("replicas: 4"),
        "{good}"
    );
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn the_chart_ships_the_grafana_dashboard_only_when_asked() {
    let chart = chart_dir();
    let default = ok("helm", &["template", "gpu-operator", &chart]);
    assert!(!default.contains("grafana_dashboard"), "off by default");
    let rendered = ok(
        "helm",
        &[
            "template",
            "gpu-operator",
            &chart,
            "--set",
            "dashboard.enabled=true",
            "--set",
            "dashboard.namespace=monitoring",
            "--show-only",
            "templates/dashboard.yaml",
        ],
    );
    let config_map: Value = serde_saphyr::from_str(&rendered).expect("a ConfigMap");
    assert_eq!(config_map["metadata"]["namespace"], "monitoring");
    assert_eq!(config_map["metadata"]["labels"]["grafana_dashboard"], "1");
    let dashboard: Value = serde_json::from_str(
        config_map["data"]["gpu-operator.json"]
            .as_str()
            .expect("the JSON"),
    )
    .expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "gpu-operator-rs");
    assert!(
        dashboard["panels"]
            .as_array()
            .is_some_and(|panels| panels.len() > 10)
    );
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn kubectl_explain_shows_our_descriptions() {
    chart_installed();
    let explained = eventually(Duration::from_secs(30), || {
        let out = run(
            "kubectl",
            &["explain", "clusterpolicy.spec.devicePlugin.config"],
        );
        Ok((out.success && out.stdout.contains("FIELDS")).then_some(out.stdout))
    })
    .expect("kubectl explain answered");
    for words in [
        "Named device-plugin configurations (time-slicing, MPS, MIG strategy) kept in a ConfigMap",
        "Key of the ConfigMap used on nodes without the nvidia.com/device-plugin.config label. Ignored without a name, as in NVIDIA's operator (the status warns).",
        "whose keys are device-plugin configurations, one version v1 file per key",
    ] {
        // kubectl wraps descriptions to the terminal; compare with whitespace collapsed.
        let flowing = explained.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            flowing.contains(words),
            "`kubectl explain` lacks {words:?}:\n{explained}"
        );
    }
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn kubectl_get_shows_the_columns() {
    chart_installed();
    let table = kubectl(&["get", "clusterpolicy"]);
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "STATUS", "READY", "GPU", "NODES", "AGE"],
        "{table}"
    );
    assert!(table.contains("cluster-policy"));
    // Other tests' GPUNodes may still be on their way out (garbage collection follows Node deletion), so this
    // checks that the listing works, not that it is empty.
    let gpunodes = run("kubectl", &["get", "gpunodes"]);
    assert!(gpunodes.success, "{gpunodes:?}");
    let columns = kubectl_json(&["get", "crd", "gpunodes.nvidia.com"]);
    let names: Vec<&str> = columns["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|column| column["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "Product",
            "GPUs",
            "MIG Config",
            "MIG State",
            "Health",
            "Driver Upgrade",
            "Age"
        ]
    );
    let short = run("kubectl", &["get", "gpun"]);
    assert!(short.success, "short name gpun: {}", short.stderr);
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn operator_upgrades_crds_that_helm_upgrade_leaves_alone() {
    chart_installed();
    // An older release's CRD: without this version's daemonsets.nodeSelector field.
    let path = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/daemonsets/properties/nodeSelector";
    kubectl(&[
        "patch",
        "crd",
        "clusterpolicies.nvidia.com",
        "--type",
        "json",
        "-p",
        &json!([{"op": "remove", "path": path}]).to_string(),
    ]);
    let has_field = || {
        let crd = kubectl_json(&["get", "crd", "clusterpolicies.nvidia.com"]);
        !crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            ["daemonsets"]["properties"]["nodeSelector"]
            .is_null()
    };
    assert!(!has_field());

    // helm upgrade never touches crds/: the old schema stays. `--force-conflicts`: earlier suites `kubectl patch`
    // fields the chart's ClusterPolicy sets (driver.version, as docs/driver-upgrades.md has users do), and Helm 4's
    // server-side apply refuses to take them back without it (docs/install.md#upgrade). No `--wait`: taking a field
    // back changes the ClusterPolicy, and Helm 4 would wait for its status to observe that generation, which needs
    // the operator this test starts only afterwards.
    ok(
        "helm",
        &[
            "upgrade",
            RELEASE,
            "-n",
            NAMESPACE,
            &chart_dir(),
            "--reuse-values",
            "--force-conflicts",
        ],
    );
    assert!(!has_field(), "helm upgrade unexpectedly updated the CRD");

    // The operator, started as the chart's Deployment starts it and with only the chart's RBAC, brings the
    // schema up to date once it leads (only the leader writes CRDs).
    let _operator = Operator::start("crd-upgrade");
    eventually(Duration::from_secs(60), || Ok(has_field().then_some(())))
        .expect("the operator restores daemonsets.nodeSelector in the CRD");
    let managers = kubectl(&[
        "get",
        "crd",
        "clusterpolicies.nvidia.com",
        "--show-managed-fields",
        "-o",
        "jsonpath={.metadata.managedFields[*].manager}",
    ]);
    assert!(managers.contains("gpu-operator"), "managers: {managers}");
}

#[test]
#[ignore = "needs the local cluster: run `cargo xtask e2e`"]
fn chart_rbac_has_no_wildcards_no_secrets_but_the_webhook_certificate_and_no_admin() {
    chart_installed();
    let selector = format!("app.kubernetes.io/instance={RELEASE}");
    let roles = kubectl_json(&["get", "clusterroles,roles", "-A", "-l", &selector]);
    let roles = roles["items"].as_array().cloned().unwrap_or_default();
    assert!(
        roles.len() >= 4,
        "the chart's roles carry its labels: {roles:#?}"
    );
    let mut findings = Vec::new();
    for role in &roles {
        let name = format!(
            "{} {}",
            role["kind"].as_str().unwrap_or_default(),
            role["metadata"]["name"].as_str().unwrap_or_default()
        );
        for rule in role["rules"].as_array().into_iter().flatten() {
            for key in [
                "apiGroups",
                "resources",
                "verbs",
                "resourceNames",
                "nonResourceURLs",
            ] {
                let values = rule[key].as_array().into_iter().flatten();
                if values.filter_map(Value::as_str).any(|v| v.contains('*')) {
                    findings.push(format!("{name}: wildcard in {key}: {rule}"));
                }
            }
            let resources = rule["resources"].as_array().into_iter().flatten();
            let verbs: Vec<&str> = rule["verbs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            // The operator's webhook certificate: it may create its Secret, then read and renew that one only.
            let webhook_certificate = name == "Role gpu-operator"
                && (verbs == ["create"]
                    || (rule["resourceNames"] == json!(["gpu-operator-webhook-tls"])
                        && verbs.iter().all(|verb| ["get", "update"].contains(verb))));
            if resources
                .filter_map(Value::as_str)
                .any(|r| r.starts_with("secrets"))
                && !webhook_certificate
            {
                findings.push(format!("{name}: grants Secrets: {rule}"));
            }
            let verbs = rule["verbs"].as_array().into_iter().flatten();
            if verbs
                .filter_map(Value::as_str)
                .any(|v| ["escalate", "bind", "impersonate"].contains(&v))
            {
                findings.push(format!("{name}: may grant or assume rights: {rule}"));
            }
        }
    }
    let bindings = kubectl_json(&[
        "get",
        "clusterrolebindings,rolebindings",
        "-A",
        "-l",
        &selector,
    ]);
    for binding in bindings["items"].as_array().into_iter().flatten() {
        let role = binding["roleRef"]["name"].as_str().unwrap_or_default();
        if ["cluster-admin", "admin", "edit"].contains(&role) {
            let name = binding["metadata"]["name"].as_str().unwrap_or_default();
            findings.push(format!("{name} binds {role}"));
        }
    }
    assert!(findings.is_empty(), "{findings:#?}");

    // The API server agrees, for every ServiceAccount the chart creates: none may read Secrets or do everything.
    let accounts = kubectl_json(&["get", "serviceaccounts", "-n", NAMESPACE, "-l", &selector]);
    let accounts: Vec<String> = accounts["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    assert!(
        accounts.contains(&"gpu-operator".to_string()) && accounts.len() >= 2,
        "{accounts:?}"
    );
    for account in &accounts {
        let user = format!("--as=system:serviceaccount:{NAMESPACE}:{account}");
        for (verb, resource) in [("get", "secrets"), ("list", "secrets"), ("*", "*")] {
            let answer = run("kubectl", &["auth", "can-i", verb, resource, "-A", &user]);
            assert_eq!(
                answer.stdout.trim(),
                "no",
                "{account} can {verb} {resource}: {answer:?}"
            );
        }
    }
    let operator = format!("--as=system:serviceaccount:{NAMESPACE}:gpu-operator");
    let own = run(
        "kubectl",
        &[
            "auth",
            "can-i",
            "get",
            "secrets/gpu-operator-webhook-tls",
            "-n",
            NAMESPACE,
            &operator,
        ],
    );
    assert_eq!(
        own.stdout.trim(),
        "yes",
        "the operator reads its webhook certificate: {own:?}"
    );
    // Driver upgrades: workload pods only through the Eviction API (PodDisruptionBudgets hold); pods deleted
    // outright only in the operator's namespace (the old driver pod and validator pod); nodes patched, never deleted.
    for (verb, resource, namespace, allowed) in [
        ("create", "pods/eviction", "default", "yes"),
        ("delete", "pods", "default", "no"),
        ("delete", "pods", NAMESPACE, "yes"),
        ("patch", "pods", NAMESPACE, "no"),
        ("delete", "nodes", "", "no"),
        ("patch", "gpunodes.nvidia.com/status", "", "yes"),
        ("watch", "controllerrevisions.apps", NAMESPACE, "yes"),
        ("watch", "controllerrevisions.apps", "default", "no"),
    ] {
        // `kubectl auth can-i VERB pods/eviction` would ask about a pod named "eviction": a subresource is named
        // with --subresource.
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        let subresource = format!("--subresource={subresource}");
        let mut args = vec!["auth", "can-i", verb, resource, operator.as_str()];
        if subresource != "--subresource=" {
            args.push(&subresource);
        }
        if !namespace.is_empty() {
            args.extend(["-n", namespace]);
        }
        let answer = run("kubectl", &args);
        assert_eq!(
            answer.stdout.trim(),
            allowed,
            "the operator {verb} {resource} in {namespace:?}: {answer:?}"
        );
    }
}
