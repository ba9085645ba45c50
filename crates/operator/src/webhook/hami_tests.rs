use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

/// A cluster with one shared A100-40GB node, one shared H100-80GB node and one node whose A100 is not shared.
fn cluster() -> Vec<DraGpu> {
    let gpu = |node: &str, product: &str, mib: u64, index: u32, shared: bool| {
        dra_gpu(node, product, &format!("GPU-{node}-{index}"), mib, shared)
    };
    vec![
        gpu("a100", "NVIDIA A100-SXM4-40GB", 40960, 0, true),
        gpu("a100", "NVIDIA A100-SXM4-40GB", 40960, 1, true),
        gpu("h100", "NVIDIA H100 80GB HBM3", 81920, 0, true),
        gpu("h100", "NVIDIA H100 80GB HBM3", 81920, 1, true),
        gpu("whole", "NVIDIA A100-SXM4-40GB", 40960, 0, false),
    ]
}

/// GPU `uuid` of `node` as the DRA driver publishes it: device `gpu-<n>` with its type, UUID and product name, and
/// its memory (on a shared GPU consumable in MiB steps, all of it by default, beside its cores, none by default).
pub(super) fn dra_gpu(node: &str, product: &str, uuid: &str, mib: u64, shared: bool) -> DraGpu {
    let memory = if shared {
        json!({"value": format!("{mib}Mi"), "requestPolicy": {
            "default": format!("{mib}Mi"),
            "validRange": {"min": "1048576", "max": format!("{mib}Mi"), "step": "1048576"}}})
    } else {
        json!({"value": format!("{mib}Mi")})
    };
    let mut capacity = json!({"memory": memory});
    if shared {
        capacity["cores"] = json!({"value": "100", "requestPolicy": {
            "default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}});
    }
    let device = serde_json::from_value(json!({
        "name": format!("gpu-{}", uuid.rsplit('-').next().unwrap_or("0")),
        "attributes": {
            "type": {"string": "gpu"}, "uuid": {"string": uuid}, "productName": {"string": product},
        },
        "capacity": capacity,
        "allowMultipleAllocations": shared.then_some(true),
    }))
    .unwrap();
    DraGpu {
        node: node.into(),
        product_name: product.into(),
        uuid: uuid.into(),
        memory_bytes: mib << 20,
        shared,
        mig_on_demand: Vec::new(),
        device: Some(device),
    }
}

/// A pod of HAMi's examples (examples/nvidia in HAMi's repository), as HAMi publishes it but for its comments.
fn hami_pod(annotations: Value, limits: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "gpu-pod", "annotations": annotations},
        "spec": {"containers": [{
            "name": "ubuntu-container", "image": "ubuntu:22.04",
            "command": ["bash", "-c", "sleep 86400"],
            "resources": {"limits": limits},
        }]}
    }))
    .unwrap()
}

fn converted(pod: &Pod) -> Conversion {
    convert(pod, &cluster(), &ResourceNames::default())
        .unwrap()
        .expect("a HAMi pod")
}

fn json_of<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap()
}

#[test]
fn default_use_3000_mib_and_30_cores_becomes_one_shared_gpu_claim() {
    let pod = hami_pod(
        json!({}),
        json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}),
    );
    let conversion = converted(&pod);
    assert_eq!(conversion.templates.len(), 1);
    let template = json_of(&conversion.templates[0]);
    let request = &template["spec"]["spec"]["devices"]["requests"][0];
    assert_eq!(request["name"], "gpu");
    assert_eq!(
        request["exactly"],
        json!({"deviceClassName": "shared.gpu.nvidia.com", "count": 1,
               "capacity": {"requests": {"memory": "3000Mi", "cores": "30"}}})
    );
    assert!(
        template["spec"]["spec"]["devices"]
            .get("constraints")
            .is_none()
    );
    let name = template["metadata"]["name"].as_str().unwrap();
    assert!(
        name.starts_with("hami-gpu-") && name.len() == "hami-gpu-".len() + 16,
        "{name}"
    );

    let pod = json_of(&conversion.pod);
    assert_eq!(
        pod["spec"]["resourceClaims"],
        json!([{"name": "hami-ubuntu-container", "resourceClaimTemplateName": name}])
    );
    let resources = &pod["spec"]["containers"][0]["resources"];
    assert_eq!(
        resources["limits"],
        json!({}),
        "HAMi's resources leave the container"
    );
    assert_eq!(
        resources["claims"],
        json!([{"name": "hami-ubuntu-container"}])
    );
    assert_eq!(pod["metadata"]["labels"][CONVERTED_LABEL], "hami-dra");
    assert!(conversion.warnings.is_empty());
}

/// A pod whose init container prepares data on the GPU before the main container runs, as a pod spec is
/// commonly written (HAMi's examples have no init container).
fn pod_with_init(init: Value, main: Value, sidecar: Option<Value>) -> Pod {
    let container = |name: &str, limits: &Value| json!({"name": name, "image": "ubuntu:22.04", "resources": {"limits": limits}});
    let mut init_containers = vec![container("prepare", &init)];
    if let Some(limits) = sidecar {
        let mut sidecar = container("log-shipper", &limits);
        sidecar["restartPolicy"] = json!("Always");
        init_containers.insert(0, sidecar);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train"},
        "spec": {"initContainers": init_containers, "containers": [container("main", &main)]}
    }))
    .unwrap()
}

fn claim_names(container: &Value) -> Value {
    container["resources"]["claims"].clone()
}

#[test]
fn an_init_container_shares_the_main_containers_claim_as_kubernetes_counts_init_containers() {
    let conversion = converted(&pod_with_init(
        json!({"nvidia.com/gpumem": 2000}),
        json!({"nvidia.com/gpumem": 3000}),
        None,
    ));
    let pod = json_of(&conversion.pod);
    assert_eq!(conversion.templates.len(), 1);
    let template = json_of(&conversion.templates[0]);
    assert_eq!(
        template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"],
        "3000Mi",
        "max(init, main) held, not 2000 + 3000"
    );
    assert_eq!(
        pod["spec"]["resourceClaims"],
        json!([{"name": "hami-main", "resourceClaimTemplateName": template["metadata"]["name"]}])
    );
    assert_eq!(
        claim_names(&pod["spec"]["initContainers"][0]),
        json!([{"name": "hami-main"}])
    );
    assert_eq!(
        claim_names(&pod["spec"]["containers"][0]),
        json!([{"name": "hami-main"}])
    );

    // An init container asking more: the one claim holds its ask.
    let conversion = converted(&pod_with_init(
        json!({"nvidia.com/gpumem": 5000}),
        json!({"nvidia.com/gpumem": 3000}),
        None,
    ));
    assert_eq!(conversion.templates.len(), 1);
    assert_eq!(
        json_of(&conversion.templates[0])["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]
            ["requests"]["memory"],
        "5000Mi"
    );
}

#[test]
fn a_sidecar_keeps_its_own_claim_and_an_init_container_never_shares_it() {
    let conversion = converted(&pod_with_init(
        json!({"nvidia.com/gpumem": 2000}),
        json!({"nvidia.com/gpumem-percentage": 50}),
        Some(json!({"nvidia.com/gpumem": 4000})),
    ));
    let pod = json_of(&conversion.pod);
    let claims: Vec<&str> = pod["spec"]["resourceClaims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|claim| claim["name"].as_str().unwrap())
        .collect();
    // The sidecar runs beside the init container and holds more; the main container's percentage cannot be
    // compared with MiB before the scheduler picks a GPU: three claims.
    assert_eq!(claims, ["hami-log-shipper", "hami-prepare", "hami-main"]);
    assert_eq!(
        claim_names(&pod["spec"]["initContainers"][1]),
        json!([{"name": "hami-prepare"}])
    );
}

#[test]
fn an_init_container_asking_too_much_is_refused_by_its_own_name() {
    let pod = pod_with_init(
        json!({"nvidia.com/gpumem": 900000}),
        json!({"nvidia.com/gpumem": 3000}),
        None,
    );
    let error = convert(&pod, &cluster(), &ResourceNames::default())
        .unwrap_err()
        .to_string();
    assert!(error.starts_with("container prepare:"), "{error}");
}

#[test]
fn memory_fraction_50_percent_asks_half_of_each_memory_size_with_two_distinct_gpus() {
    let pod = hami_pod(
        json!({}),
        json!({"nvidia.com/gpu": 2, "nvidia.com/gpumem-percentage": 50, "nvidia.com/gpucores": 30}),
    );
    let template = json_of(&converted(&pod).templates[0]);
    let devices = &template["spec"]["spec"]["devices"];
    let options = devices["requests"][0]["firstAvailable"].as_array().unwrap();
    let summary: Vec<(Value, Value, Value)> = options
        .iter()
        .map(|option| {
            (
                option["name"].clone(),
                option["capacity"]["requests"]["memory"].clone(),
                option["selectors"][0]["cel"]["expression"].clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                json!("mem-81920mi"),
                json!("40960Mi"),
                json!(
                    r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("85899345920")) == 0"#
                )
            ),
            (
                json!("mem-40960mi"),
                json!("20480Mi"),
                json!(
                    r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("42949672960")) == 0"#
                )
            ),
        ]
    );
    assert_eq!(options[0]["count"], 2);
    assert_eq!(options[0]["capacity"]["requests"]["cores"], "30");
    assert_eq!(
        devices["constraints"],
        json!([{"requests": ["gpu"], "distinctAttribute": "gpu.nvidia.com/uuid"}])
    );
}

#[test]
fn gpu_types_select_case_insensitive_substrings_as_hami_does() {
    let pod = hami_pod(
        json!({"nvidia.com/use-gputype": "A100,V100"}),
        json!({"nvidia.com/gpu": 2}),
    );
    let template = json_of(&converted(&pod).templates[0]);
    let exactly = &template["spec"]["spec"]["devices"]["requests"][0]["exactly"];
    assert_eq!(
        exactly["deviceClassName"], "gpu.nvidia.com",
        "whole GPUs of the chosen model"
    );
    assert_eq!(
        exactly["selectors"][0]["cel"]["expression"],
        r#"device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("a100") || device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("v100")"#
    );
    assert!(exactly.get("capacity").is_none());

    let avoid = hami_pod(
        json!({"nvidia.com/nouse-gputype": "A100"}),
        json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}),
    );
    let template = json_of(&converted(&avoid).templates[0]);
    assert_eq!(
        template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"],
        r#"!(device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("a100"))"#
    );

    let uuids = hami_pod(
        json!({"nvidia.com/use-gpuuuid": "GPU-h100-0, GPU-h100-1", "nvidia.com/nouse-gpuuuid": "GPU-a100-0"}),
        json!({"nvidia.com/gpu": 1}),
    );
    let template = json_of(&converted(&uuids).templates[0]);
    let selectors = &template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"];
    assert_eq!(
        selectors[0]["cel"]["expression"],
        r#"device.attributes["gpu.nvidia.com"].uuid in ["GPU-h100-0", "GPU-h100-1"]"#
    );
    assert_eq!(
        selectors[1]["cel"]["expression"],
        r#"!(device.attributes["gpu.nvidia.com"].uuid in ["GPU-a100-0"])"#
    );
}

#[test]
fn a_plain_gpu_pod_stays_the_device_plugins() {
    let normal = hami_pod(json!({}), json!({"nvidia.com/gpu": 1}));
    assert_eq!(
        convert(&normal, &cluster(), &ResourceNames::default()),
        Ok(None)
    );
    let policy_only = hami_pod(
        json!({"hami.io/gpu-scheduler-policy": "binpack"}),
        json!({"nvidia.com/gpu": 1}),
    );
    assert_eq!(
        convert(&policy_only, &cluster(), &ResourceNames::default()),
        Ok(None)
    );
    let no_gpu = hami_pod(
        json!({"nvidia.com/use-gputype": "A100"}),
        json!({"cpu": "1"}),
    );
    assert_eq!(
        convert(&no_gpu, &cluster(), &ResourceNames::default()),
        Ok(None)
    );
}

#[test]
fn identical_asks_share_a_template_and_different_ones_do_not() {
    let a = converted(&hami_pod(json!({}), json!({"nvidia.com/gpumem": 3000})));
    let b = converted(&hami_pod(
        json!({}),
        // As the API server writes 3000 back.
        json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": "3k"}),
    ));
    let c = converted(&hami_pod(json!({}), json!({"nvidia.com/gpumem": 3001})));
    assert_eq!(
        a.templates, b.templates,
        "nvidia.com/gpu defaults to 1, as HAMi's defaultGPUNum"
    );
    assert_ne!(a.templates[0].metadata.name, c.templates[0].metadata.name);
}

#[test]
fn hami_defaults_and_clamps_are_kept_with_warnings() {
    let both = converted(&hami_pod(
        json!({"hami.io/gpu-scheduler-policy": "spread", "hami.io/node-scheduler-policy": "binpack"}),
        json!({"nvidia.com/gpumem": 2000, "nvidia.com/gpumem-percentage": 50, "nvidia.com/priority": 1}),
    ));
    let template = json_of(&both.templates[0]);
    assert_eq!(
        template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"],
        json!({"memory": "2000Mi"}),
        "gpumem wins over the percentage; no cores asked"
    );
    let warnings = both.warnings.join("\n");
    for expected in [
        "nvidia.com/gpumem is used",
        "spread cannot be expressed",
        "hami.io/node-scheduler-policy is ignored",
        "nvidia.com/priority is ignored",
    ] {
        assert!(warnings.contains(expected), "{expected} in {warnings}");
    }
    let limits = &json_of(&both.pod)["spec"]["containers"][0]["resources"]["limits"];
    assert_eq!(limits, &json!({}));

    let clamped = converted(&hami_pod(
        json!({}),
        json!({"nvidia.com/gpumem-percentage": 150}),
    ));
    let template = json_of(&clamped.templates[0]);
    assert_eq!(
        template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][1]["capacity"]["requests"]
            ["memory"],
        "40960Mi"
    );
    assert!(clamped.warnings[0].contains("taken as 100"));

    // A binary suffix names bytes (HAMi would read 3Gi as 3221225472 MiB); the canonical `3k` is 3000 MiB.
    for (written, asked) in [("3Gi", "3072Mi"), ("3k", "3000Mi")] {
        let quantity = converted(&hami_pod(json!({}), json!({"nvidia.com/gpumem": written})));
        let template = json_of(&quantity.templates[0]);
        assert_eq!(
            template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"],
            json!({"memory": asked}),
            "{written}"
        );
    }

    let whole_memory = converted(&hami_pod(json!({}), json!({"nvidia.com/gpucores": 40})));
    let template = json_of(&whole_memory.templates[0]);
    assert_eq!(
        template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"],
        json!({"cores": "40"}),
        "no memory asked: the device's default, all of it"
    );
}

#[test]
fn what_cannot_be_satisfied_is_refused_with_the_reason_and_what_exists() {
    let error = |limits: Value, annotations: Value| {
        convert(
            &hami_pod(annotations, limits),
            &cluster(),
            &ResourceNames::default(),
        )
        .unwrap_err()
        .to_string()
    };
    let too_big = error(json!({"nvidia.com/gpumem": 90000}), json!({}));
    assert!(
        too_big.contains("90000 MiB is more than any matching shared GPU has (at most 81920 MiB)"),
        "{too_big}"
    );
    assert!(too_big.contains("virtual device memory"), "{too_big}");

    let no_model = error(
        json!({"nvidia.com/gpumem": 1000}),
        json!({"nvidia.com/use-gputype": "V100"}),
    );
    assert!(no_model.contains("no shared GPU matches"), "{no_model}");
    assert!(
        no_model.contains("2 × NVIDIA A100-SXM4-40GB (40960 MiB, shared)"),
        "{no_model}"
    );

    let too_many = error(
        json!({"nvidia.com/gpu": 3, "nvidia.com/gpumem": 1000}),
        json!({}),
    );
    assert!(too_many.contains("at most 2 do on one node"), "{too_many}");

    let cores = error(json!({"nvidia.com/gpucores": 130}), json!({}));
    assert!(
        cores.contains("nvidia.com/gpucores \"130\" is not valid"),
        "{cores}"
    );
    let milli = error(json!({"nvidia.com/gpumem": "3000m"}), json!({}));
    assert!(milli.contains("MiB as a whole number"), "{milli}");
    let zero = error(
        json!({"nvidia.com/gpu": 0, "nvidia.com/gpucores": 10}),
        json!({}),
    );
    assert!(zero.contains("at least 1"), "{zero}");
    let quote = error(
        json!({"nvidia.com/gpu": 1}),
        json!({"nvidia.com/use-gputype": "A100\")"}),
    );
    assert!(
        quote.contains("annotation nvidia.com/use-gputype"),
        "{quote}"
    );

    let none = convert(
        &hami_pod(json!({}), json!({"nvidia.com/gpumem": 1000})),
        &[],
        &ResourceNames::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(none.contains("draDriver.enabled"), "{none}");
}

#[test]
fn oversubscription_asked_through_the_environment_is_refused() {
    let mut pod = hami_pod(json!({}), json!({"nvidia.com/gpumem": 1000}));
    pod.spec.as_mut().unwrap().containers[0].env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
        name: "CUDA_OVERSUBSCRIBE".into(),
        value: Some("true".into()),
        value_from: None,
    }]);
    let error = convert(&pod, &cluster(), &ResourceNames::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("CUDA_OVERSUBSCRIBE=true") && error.contains("not offered"),
        "{error}"
    );
}

#[test]
fn a_whole_gpu_may_come_from_a_whole_or_a_shared_gpu_but_a_share_only_from_a_shared_one() {
    let whole_only = vec![dra_gpu(
        "n",
        "NVIDIA A100-SXM4-40GB",
        "GPU-1",
        40 << 10,
        false,
    )];
    let typed = hami_pod(
        json!({"nvidia.com/use-gputype": "a100"}),
        json!({"nvidia.com/gpu": 1}),
    );
    assert!(
        convert(&typed, &whole_only, &ResourceNames::default())
            .unwrap()
            .is_some()
    );
    let share = hami_pod(json!({}), json!({"nvidia.com/gpumem": 1000}));
    let error = convert(&share, &whole_only, &ResourceNames::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("1 × NVIDIA A100-SXM4-40GB (40960 MiB, whole)"),
        "{error}"
    );
}

#[test]
fn a_long_non_ascii_container_name_is_cut_on_a_character_boundary() {
    let claim_entry = |name: &str| {
        let mut pod = hami_pod(json!({}), json!({"nvidia.com/gpumem": 1000}));
        pod.spec.as_mut().unwrap().containers[0].name = name.into();
        let pod = json_of(&converted(&pod).pod);
        pod["spec"]["resourceClaims"][0]["name"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    // "hami-" and 49 bytes of two-byte characters: byte 54 falls inside one.
    let first = claim_entry(&"é".repeat(40));
    assert!(first.len() <= 63, "{first}");
    assert!(
        first.starts_with(&format!("hami-{}-", "é".repeat(24))),
        "{first}"
    );
    let second = claim_entry(&format!("{}x", "é".repeat(40)));
    assert_ne!(first, second, "long names are told apart by their hash");
}

#[test]
fn gpumem_whose_bytes_overflow_is_refused_not_wrapped() {
    // 2^44 MiB is 2^64 bytes: wrapped, it would be a request for 0 bytes, which every GPU fits.
    let pod = hami_pod(json!({}), json!({"nvidia.com/gpumem": "17592186044416"}));
    assert_eq!(
        convert(&pod, &cluster(), &ResourceNames::default()).unwrap_err(),
        HamiError::Value {
            container: "ubuntu-container".into(),
            resource: GPUMEM.into(),
            value: "17592186044416".into(),
            expected: crd::hami::EXPECT_MEMORY,
        }
    );
    let just_fits = hami_pod(json!({}), json!({"nvidia.com/gpumem": "17592186044415"}));
    let error = convert(&just_fits, &cluster(), &ResourceNames::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("17592186044415 MiB is more than any matching shared GPU has"),
        "{error}"
    );
}

proptest! {
    #[test]
    fn any_name_and_gpumem_is_converted_exactly_or_refused_naming_the_container(
        name in "\\PC{0,80}",
        mib in prop_oneof![0_u64..=100_000, any::<u64>()],
    ) {
        const LARGEST_MIB: u64 = 81920;
        let mut pod = hami_pod(json!({}), json!({"nvidia.com/gpumem": mib.to_string()}));
        pod.spec.as_mut().unwrap().containers[0].name = name.clone();
        match convert(&pod, &cluster(), &ResourceNames::default()) {
            Ok(Some(conversion)) => {
                prop_assert!(mib <= LARGEST_MIB);
                let pod = json_of(&conversion.pod);
                let entry = pod["spec"]["resourceClaims"][0]["name"].as_str().unwrap();
                prop_assert!(entry.len() <= 63, "{}", entry);
                let template = json_of(&conversion.templates[0]);
                let memory = &template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
                    ["capacity"]["requests"]["memory"];
                if mib == 0 {
                    prop_assert!(memory.is_null(), "{}", memory);
                } else {
                    prop_assert_eq!(memory, &json!(format!("{mib}Mi")));
                }
            }
            Ok(None) => prop_assert!(false, "a gpumem pod is HAMi's"),
            Err(error) => {
                prop_assert!(mib > LARGEST_MIB, "{}", error);
                prop_assert!(
                    error.to_string().starts_with(&format!("container {name}: ")),
                    "{}",
                    error
                );
                if mib >= 1 << 44 {
                    let is_value = matches!(&error, HamiError::Value { resource, .. } if resource == GPUMEM);
                    prop_assert!(is_value, "{}", error);
                }
            }
        }
    }
}

/// A HAMi resource value: the numbers HAMi's examples use, quantities as the API server writes them back, the
/// extremes, and anything.
fn hami_value() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => (0_u64..=3).prop_map(|value| value.to_string()),
        2 => (0_u64..=200).prop_map(|value| value.to_string()),
        1 => prop::sample::select(vec!["3k", "1.5", "40Gi", "1e3", "-1", "18446744073709551615", "0.0000001", ""])
            .prop_map(str::to_owned),
        1 => any::<u64>().prop_map(|value| value.to_string()),
        1 => "\\PC{0,12}",
    ]
}

/// One container: a name, some of HAMi's resources as limits or requests, and now and then HAMi's oversubscription
/// switch.
fn hami_container() -> impl Strategy<Value = Value> {
    let resources = prop::collection::btree_map(
        prop::sample::select(vec![GPU, GPUMEM, GPUMEM_PERCENTAGE, GPUCORES, PRIORITY]),
        hami_value(),
        1..4,
    );
    (
        resources,
        any::<bool>(),
        prop::option::weighted(0.1, Just("true")),
    )
        .prop_map(|(resources, as_limits, oversubscribe)| {
            let list = if as_limits { "limits" } else { "requests" };
            let mut container = json!({"image": "cuda", "resources": {list: resources}});
            if let Some(value) = oversubscribe {
                container["env"] = json!([{"name": OVERSUBSCRIBE_ENV, "value": value}]);
            }
            container
        })
}

/// A pod with one to three containers (names distinct, as the API server requires, and anything otherwise), an init
/// container now and then, and any of HAMi's annotations with good or arbitrary values.
fn hami_any_pod() -> impl Strategy<Value = Pod> {
    let annotation_value = prop_oneof![
        3 => prop::sample::select(vec!["A100", "a100,H100", "h100", "GPU-a100-0", "spread", "binpack"])
            .prop_map(str::to_owned),
        1 => prop::sample::select(vec![" ", ",", ""]).prop_map(str::to_owned),
        1 => "\\PC{0,40}",
    ];
    let annotations = prop::collection::btree_map(
        prop::sample::select(vec![
            USE_GPUTYPE,
            NOUSE_GPUTYPE,
            USE_GPUUUID,
            NOUSE_GPUUUID,
            GPU_POLICY,
            NODE_POLICY,
        ]),
        annotation_value,
        0..2,
    );
    let name = prop_oneof![3 => "[a-z][a-z0-9-]{0,12}", 1 => "\\PC{0,70}"];
    let names = prop::collection::btree_set(name, 1..4);
    (
        annotations,
        names,
        prop::collection::vec(hami_container(), 4),
        any::<bool>(),
    )
        .prop_map(|(annotations, names, mut containers, with_init)| {
            let mut named: Vec<Value> = names
                .into_iter()
                .zip(containers.drain(..))
                .map(|(name, mut container)| {
                    container["name"] = json!(name);
                    container
                })
                .collect();
            let init = if with_init && named.len() > 1 {
                vec![named.remove(0)]
            } else {
                Vec::new()
            };
            serde_json::from_value(json!({
                "metadata": {"name": "p", "annotations": annotations},
                "spec": {"containers": named, "initContainers": init},
            }))
            .unwrap()
        })
}

/// The CEL expressions of a request: its own selectors, or those of each `firstAvailable` sub-request.
fn cel_expressions(request: &Value) -> Vec<String> {
    let selectors = |request: &Value| -> Vec<String> {
        request["selectors"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|selector| selector["cel"]["expression"].as_str().map(str::to_owned))
            .collect()
    };
    let mut expressions = selectors(&request["exactly"]);
    for sub in request["firstAvailable"].as_array().into_iter().flatten() {
        expressions.extend(selectors(sub));
    }
    expressions
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any pod with any of HAMi's resources and annotations is converted, left alone or refused with the container or
    /// annotation at fault, never a panic. A converted pod holds none of HAMi's resources in a converted container,
    /// one claim of at most 63 bytes per converted container, and CEL selectors whose string literals cannot be
    /// broken out of.
    #[test]
    fn any_hami_pod_is_converted_left_alone_or_refused_by_name(pod in hami_any_pod()) {
        match convert(&pod, &cluster(), &ResourceNames::default()) {
            Ok(None) => {}
            Ok(Some(conversion)) => {
                let spec = conversion.pod.spec.clone().unwrap();
                let claims = spec.resource_claims.clone().unwrap_or_default();
                let containers: Vec<&Container> =
                    spec.init_containers.iter().flatten().chain(&spec.containers).collect();
                let converted: Vec<&&Container> = containers
                    .iter()
                    .filter(|container| {
                        container.resources.as_ref().and_then(|resources| resources.claims.as_ref()).is_some()
                    })
                    .collect();
                // Each converted container uses one of the pod's claims, and each claim is used (init containers
                // share claims with containers that never run beside them).
                let used: BTreeSet<String> = converted
                    .iter()
                    .flat_map(|container| container.resources.as_ref().and_then(|r| r.claims.clone()).unwrap_or_default())
                    .map(|claim| claim.name)
                    .collect();
                let named: BTreeSet<String> = claims.iter().map(|claim| claim.name.clone()).collect();
                prop_assert_eq!(used, named);
                prop_assert!(claims.len() <= converted.len());
                for container in converted {
                    let resources = container.resources.clone().unwrap();
                    for list in [resources.limits, resources.requests].into_iter().flatten() {
                        for resource in [GPU, GPUMEM, GPUMEM_PERCENTAGE, GPUCORES, PRIORITY] {
                            prop_assert!(!list.contains_key(resource), "{} kept {}", container.name, resource);
                        }
                    }
                }
                for claim in &claims {
                    prop_assert!(claim.name.len() <= 63, "{}", claim.name);
                }
                for template in &conversion.templates {
                    let requests = json_of(template)["spec"]["spec"]["devices"]["requests"].clone();
                    prop_assert!(requests.as_array().is_some_and(|requests| requests.len() == 1), "{}", requests);
                    for expression in cel_expressions(&requests[0]) {
                        prop_assert!(!expression.contains('\\'), "{}", expression);
                        prop_assert_eq!(expression.matches('"').count() % 2, 0, "{}", expression);
                    }
                }
            }
            Err(error) => {
                let text = error.to_string();
                prop_assert!(text.starts_with("container ") || text.starts_with("annotation "), "{}", text);
            }
        }
    }
}

/// The pods of one of HAMi's example files (examples/nvidia in HAMi's repository, `tests/fixtures/hami`).
fn hami_examples(file: &str) -> Vec<Pod> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/hami")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `pod` with each of HAMi's default resource names replaced by the name `names` gives it.
fn with_names(pod: &Pod, names: &ResourceNames) -> Pod {
    let defaults = ResourceNames::default();
    let mut text = serde_json::to_string(pod).unwrap();
    for (default, name) in defaults.all().iter().zip(names.all()) {
        text = text.replace(&format!("\"{default}\""), &format!("\"{name}\""));
    }
    serde_json::from_str(&text).unwrap()
}

#[test]
fn hamis_example_pods_under_renamed_resources_convert_as_under_hamis_own() {
    let names = ResourceNames::renamed_example();
    for file in [
        "default_use.yaml",
        "specify_card_type_not_use.yaml",
        "specify_card_type_to_use.yaml",
        "specify_scheduling_policy.yaml",
        "use_as_normal.yaml",
        "use_memory_fraction.yaml",
        "use_sharing_card.yaml",
    ] {
        for pod in hami_examples(file) {
            let expected = convert(&pod, &cluster(), &ResourceNames::default())
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            if expected.is_none() {
                // Whole GPUs without a selection: the device plugin's under HAMi's name, the webhook's under a
                // renamed one (below).
                continue;
            }
            let renamed_pod = with_names(&pod, &names);
            let got =
                convert(&renamed_pod, &cluster(), &names).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(
                got.as_ref().map(|c| (&c.templates, &c.warnings)),
                expected.as_ref().map(|c| (&c.templates, &c.warnings)),
                "{file}: the same claims"
            );
            let Some(got) = got else { continue };
            let text = serde_json::to_string(&got.pod).unwrap();
            for name in names.all() {
                assert!(
                    !text.contains(&format!("\"{name}\"")),
                    "{file}: {name} is stripped: {text}"
                );
            }
            // On that cluster HAMi's default names are not HAMi's: a pod asking for a share by them is left alone
            // (the webhook's match condition does not even send it).
            let shares = ResourceNames::default();
            let asks_share = serde_json::to_string(&pod).is_ok_and(|text| {
                shares
                    .shares()
                    .iter()
                    .any(|s| text.contains(&format!("\"{s}\"")))
            });
            if asks_share && pod.metadata.annotations.is_none() {
                assert_eq!(convert(&pod, &cluster(), &names), Ok(None), "{file}");
            }
        }
    }
}

#[test]
fn hamis_plain_gpu_pods_under_a_renamed_gpu_become_whole_gpu_claims() {
    let names = ResourceNames::renamed_example();
    for pod in hami_examples("use_as_normal.yaml") {
        assert_eq!(
            convert(&pod, &cluster(), &ResourceNames::default()),
            Ok(None)
        );
        let conversion = convert(&with_names(&pod, &names), &cluster(), &names)
            .unwrap()
            .expect("no device plugin advertises the renamed GPU: the webhook's");
        let template = json_of(&conversion.templates[0]);
        assert_eq!(
            template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"],
            "gpu.nvidia.com"
        );
    }
}

/// HAMi's MIG pods: dynamic MIG through instances made on demand, MIG resources left to the device plugin.
#[path = "hami_mig_tests.rs"]
mod mig;
