//! HAMi's MIG pods through the webhook: `nvidia.com/vgpu-mode: mig` onto MIG instances made on demand, and
//! `nvidia.com/mig-<profile>` left to the device plugin (or the chart's DeviceClass mapping).

use super::*;

/// The cluster of [`cluster`] plus a node of two H100-80GB served as MIG on demand (the H100's profiles).
fn cluster_with_mig_on_demand() -> Vec<DraGpu> {
    let profiles: Vec<u64> = [9984, 20096, 20096, 40448, 40448, 81152]
        .iter()
        .map(|mib| mib << 20)
        .collect();
    let mut gpus = cluster();
    for index in 0..2 {
        gpus.push(DraGpu {
            node: "mig".into(),
            product_name: "NVIDIA H100 80GB HBM3".into(),
            uuid: format!("GPU-mig-{index}"),
            memory_bytes: 81152 << 20,
            shared: false,
            mig_on_demand: profiles.clone(),
            device: None,
        });
    }
    gpus
}

/// HAMi's dynamic_mig_example.yaml (HAMi commit 41563e0), unchanged: the pod asks for a MIG instance of its own on
/// each of 2 GPUs. Where GPUs are served as MIG on demand it gets two instances whose memory holds its 8000 MiB, on
/// distinct GPUs (the driver's smallest-first order makes that the smallest such profile); where none is, it is
/// refused: an MPS-limited share instead would silently lose the isolation it asked for.
/// The limits of the pod's first container.
fn limits(pod: &mut Pod) -> &mut BTreeMap<String, Quantity> {
    let container = &mut pod.spec.as_mut().unwrap().containers[0];
    container
        .resources
        .as_mut()
        .unwrap()
        .limits
        .as_mut()
        .unwrap()
}

/// The spec of the one claim template `pod` is converted to on [`cluster_with_mig_on_demand`], as JSON.
fn claim_spec(pod: &Pod) -> Value {
    let conversion = convert(
        pod,
        &cluster_with_mig_on_demand(),
        &ResourceNames::default(),
    )
    .unwrap()
    .unwrap();
    let template = conversion.templates[0].spec.as_ref().unwrap();
    serde_json::to_value(template.spec.as_ref().unwrap()).unwrap()
}

#[test]
fn hamis_dynamic_mig_pod_gets_instances_made_on_demand_or_is_refused_with_the_way_to_them() {
    let [pod] = hami_examples("dynamic_mig_example.yaml")
        .try_into()
        .expect("one pod");
    let spec = claim_spec(&pod);
    let request = &spec["devices"]["requests"][0]["exactly"];
    assert_eq!(request["deviceClassName"], "mig.nvidia.com");
    assert_eq!(request["count"], 2);
    assert_eq!(
        request["selectors"][0]["cel"]["expression"],
        "device.capacity[\"gpu.nvidia.com\"].memory.compareTo(quantity(\"8000Mi\")) >= 0"
    );
    assert_eq!(
        spec["devices"]["constraints"][0]["distinctAttribute"],
        "gpu.nvidia.com/parentUUID"
    );

    let error = convert(&pod, &cluster(), &ResourceNames::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("nvidia.com/vgpu-mode mig asks for a MIG instance made for the pod"),
        "{error}"
    );
    assert!(error.contains("draDriver.dynamicMIG"), "{error}");
    assert!(error.contains("remove the annotation"), "{error}");
    assert!(error.contains("hamiMigWithoutDynamicMIG=share"), "{error}");

    // A cluster whose policy says share: an MPS-limited share of a whole GPU, annotation kept, and warned. Where a
    // GPU is served on demand, the policy changes nothing.
    let shared = convert_under(
        &pod,
        &cluster(),
        &ResourceNames::default(),
        MigWithoutDynamicMig::Share,
    )
    .unwrap()
    .unwrap();
    let template = serde_json::to_value(&shared.templates[0]).unwrap();
    assert_eq!(
        template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"],
        "shared.gpu.nvidia.com",
        "{template:#}"
    );
    assert_eq!(
        shared.pod.metadata.annotations.as_ref().unwrap()[VGPU_MODE],
        "mig"
    );
    assert!(
        shared
            .warnings
            .iter()
            .any(|warning| warning.contains("does not isolate memory faults")),
        "{:?}",
        shared.warnings
    );
    assert!(matches!(
        convert_under(
            &pod,
            &cluster(),
            &ResourceNames::default(),
            MigWithoutDynamicMig::Refuse
        ),
        Err(HamiError::NoMigOnDemand { .. })
    ));
    assert_eq!(
        convert_under(
            &pod,
            &cluster_with_mig_on_demand(),
            &ResourceNames::default(),
            MigWithoutDynamicMig::Share
        ),
        convert(
            &pod,
            &cluster_with_mig_on_demand(),
            &ResourceNames::default()
        )
    );

    // More memory than any profile holds, and a type no GPU served on demand is.
    let mut big = pod.clone();
    limits(&mut big).insert(GPUMEM.into(), Quantity("90000".into()));
    let error = convert(
        &big,
        &cluster_with_mig_on_demand(),
        &ResourceNames::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("at most 81152 MiB"), "{error}");
    let mut a100 = pod.clone();
    a100.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(USE_GPUTYPE.into(), "A100".into());
    assert!(
        convert(
            &a100,
            &cluster_with_mig_on_demand(),
            &ResourceNames::default()
        )
        .is_err(),
        "no A100 is served on demand"
    );

    // Without gpumem, the whole GPU: each model's largest profile.
    let mut whole = pod.clone();
    limits(&mut whole).remove(GPUMEM);
    whole
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(USE_GPUTYPE.into(), "H100".into());
    let spec = claim_spec(&whole);
    let expressions = spec["devices"]["requests"][0]["firstAvailable"][0]["selectors"].to_string();
    assert!(
        expressions.contains("quantity(\\\"81152Mi\\\")) >= 0"),
        "{expressions}"
    );

    // The modes an MPS-limited share does give, and one HAMi does not have.
    let with_mode = |mode: &str| {
        let mut pod = pod.clone();
        pod.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(VGPU_MODE.to_owned(), mode.to_owned());
        convert(&pod, &cluster(), &ResourceNames::default())
    };
    for mode in ["hami-core", "mps", "MPS"] {
        assert!(with_mode(mode).unwrap().is_some(), "{mode}");
    }
    let error = with_mode("vgpu").unwrap_err().to_string();
    assert_eq!(
        error,
        "annotation nvidia.com/vgpu-mode \"vgpu\": HAMi's modes are hami-core, mps and mig"
    );
    // A share converted in MPS mode never lands on a GPU served as MIG on demand.
    let mps = with_mode("mps").unwrap().unwrap();
    let template = serde_json::to_string(&mps.templates[0]).unwrap();
    assert!(!template.contains("mig.nvidia.com"), "{template}");
}

/// HAMi's mig_example.yaml (HAMi commit e717e18), unchanged: a MIG device of a geometry the MIG manager applied, as
/// the device plugin advertises it with the mixed strategy; not the webhook's.
#[test]
fn hamis_mig_resource_pod_is_left_to_the_device_plugin() {
    for pod in hami_examples("mig_example.yaml") {
        assert_eq!(
            convert(&pod, &cluster(), &ResourceNames::default()).unwrap(),
            None
        );
    }
}
