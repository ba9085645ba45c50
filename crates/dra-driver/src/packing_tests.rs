use std::collections::BTreeSet;

use super::*;

fn h100() -> &'static GpuModel {
    crd::mig::model_by_simulator_name("h100-80gb").unwrap()
}

fn profile(name: &str) -> &'static GpuInstanceProfile {
    h100().profile(name.parse().unwrap()).unwrap()
}

fn setup(gpus: u32, gpus_per_node: u32) -> Setup {
    Setup {
        model: h100(),
        gpus,
        gpus_per_node,
    }
}

fn h100_gpu(index: u32) -> DynamicGpu {
    DynamicGpu {
        index,
        model: h100(),
        profiles: h100().profiles.iter().collect(),
    }
}

/// The pattern of the bench: H100-80GB, 1g.10gb 40 %, 2g.20gb 25 %, 3g.40gb 20 %, 4g.40gb 10 %, 7g.80gb 5 %.
fn bench_mix() -> Vec<(&'static GpuInstanceProfile, u32)> {
    mix(
        h100(),
        &[
            ("1g.10gb", 40),
            ("2g.20gb", 25),
            ("3g.40gb", 20),
            ("4g.40gb", 10),
            ("7g.80gb", 5),
        ],
    )
    .unwrap()
}

fn arrivals(events: &[(u32, &str)]) -> Trace {
    Trace {
        events: events
            .iter()
            .map(|&(pod, name)| {
                if name.is_empty() {
                    Event::Depart { pod }
                } else {
                    Event::Arrive {
                        pod,
                        profile: profile(name),
                    }
                }
            })
            .collect(),
        warmup: 0,
    }
}

#[test]
fn nvidia_names_its_devices_as_its_driver_does() {
    let devices = dynamic_mig::placements(&h100_gpu(3));
    let names: BTreeSet<String> = devices.iter().map(nvidia_device_name).collect();
    for name in [
        "gpu-3-mig-1g10gb-19-0",
        "gpu-3-mig-1g10gb-19-6",
        "gpu-3-mig-1g10gb-me-20-2",
        "gpu-3-mig-1g20gb-15-6",
        "gpu-3-mig-2g20gb-14-4",
        "gpu-3-mig-3g40gb-9-4",
        "gpu-3-mig-4g40gb-5-0",
        "gpu-3-mig-7g80gb-0-0",
    ] {
        assert!(names.contains(name), "{name} in {names:?}");
    }
    assert_eq!(names.len(), devices.len(), "names are unique");
}

#[test]
fn both_orders_are_the_same_devices_gpu_by_gpu_and_differ_in_the_placements_order() {
    let gpus = [h100_gpu(0), h100_gpu(1)];
    let ours = Order::Ours.devices(&gpus);
    let nvidia = Order::Nvidia.devices(&gpus);
    let key = |device: &PlacementDevice| {
        (
            device.on_demand.gpu,
            device.on_demand.profile_id,
            device.on_demand.placement,
        )
    };
    assert_eq!(
        ours.iter().map(key).collect::<BTreeSet<_>>(),
        nvidia.iter().map(key).collect::<BTreeSet<_>>(),
        "only the order differs"
    );
    assert_eq!(ours.len(), nvidia.len());
    for devices in [&ours, &nvidia] {
        let gpus: Vec<u32> = devices.iter().map(|device| device.on_demand.gpu).collect();
        assert!(gpus.is_sorted(), "GPU by GPU: {gpus:?}");
        let same: Vec<&PlacementDevice> = devices
            .iter()
            .filter(|device| device.profile.id == profile("1g.10gb").id)
            .collect();
        assert_eq!(same.len(), 14);
    }
    let starts = |devices: &[PlacementDevice], id: u32| -> Vec<u32> {
        devices
            .iter()
            .filter(|device| device.on_demand.gpu == 0 && device.on_demand.profile_id == id)
            .map(|device| device.on_demand.placement.start)
            .collect()
    };
    assert_eq!(starts(&ours, 19), [6, 5, 4, 3, 2, 1, 0]);
    assert_eq!(starts(&nvidia, 19), [0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(starts(&ours, 14), [4, 2, 0]);
    assert_eq!(starts(&nvidia, 14), [0, 2, 4]);
    assert_eq!(
        nvidia_device_name(&nvidia[0]),
        "gpu-0-mig-1g10gb-19-0",
        "NVIDIA's names sort the plain 1g.10gb first"
    );
}

#[test]
fn a_1g_on_top_leaves_the_4g_its_placement_where_nvidias_order_blocks_it() {
    // One GPU: a 1g.10gb, then a 4g.40gb (whose only placement starts at slice 0).
    let trace = arrivals(&[(1, "1g.10gb"), (2, "4g.40gb")]);
    let ours = replay(&setup(1, 8), Order::Ours, &trace);
    assert_eq!((ours.placed, ours.refused), (2, 0));
    let nvidia = replay(&setup(1, 8), Order::Nvidia, &trace);
    assert_eq!((nvidia.placed, nvidia.refused), (1, 1));
    assert_eq!(
        nvidia.refused_fragmented, 1,
        "7 slices, 6 compute slices free: only the 1g at slice 0 stands in the way"
    );
    assert_eq!(nvidia.refused_by_profile["4g.40gb"], 1);

    // Two GPUs: NVIDIA's order puts the 4g.40gb on a second GPU, ours keeps one.
    let ours = replay(&setup(2, 8), Order::Ours, &trace);
    let nvidia = replay(&setup(2, 8), Order::Nvidia, &trace);
    assert_eq!((ours.placed, nvidia.placed), (2, 2));
    assert_eq!(ours.gpus_used_max, 1);
    assert_eq!(nvidia.gpus_used_max, 2);
}

#[test]
fn both_orders_pack_small_instances_onto_the_first_gpu() {
    let trace = arrivals(&[(1, "1g.10gb"), (2, "1g.10gb"), (3, "2g.20gb")]);
    for order in Order::ALL {
        let mut cluster = Cluster::new(&setup(4, 8), order);
        let placed: Vec<Allocation> = trace
            .events
            .iter()
            .filter_map(|event| match event {
                Event::Arrive { profile, .. } => cluster.place(profile),
                Event::Depart { .. } => None,
            })
            .collect();
        assert!(
            placed
                .iter()
                .all(|allocation| allocation.node == 0 && allocation.on_demand.gpu == 0),
            "{order:?}: {placed:?}"
        );
        assert_eq!(cluster.gpus_in_use(), 1);
        let slices: Vec<u32> = placed
            .iter()
            .map(|allocation| allocation.on_demand.placement.start)
            .collect();
        match order {
            Order::Ours => assert_eq!(slices, [6, 5, 2]),
            Order::Nvidia => assert_eq!(slices, [0, 1, 2]),
        }
    }
}

#[test]
fn a_pod_goes_to_the_next_node_only_when_the_first_has_no_device() {
    let setup = setup(10, 8);
    let mut cluster = Cluster::new(&setup, Order::Ours);
    assert_eq!(cluster.nodes.len(), 2);
    assert_eq!(cluster.nodes[1].free.len(), 2, "the last node has the rest");
    for gpu in 0..8 {
        let allocation = cluster.place(profile("7g.80gb")).unwrap();
        assert_eq!((allocation.node, allocation.on_demand.gpu), (0, gpu));
    }
    let ninth = cluster.place(profile("7g.80gb")).unwrap();
    assert_eq!((ninth.node, ninth.on_demand.gpu), (1, 0));
    assert!(cluster.place(profile("7g.80gb")).is_some());
    assert!(
        cluster.place(profile("1g.10gb")).is_none(),
        "every GPU is whole-taken"
    );
    assert!(
        !cluster.fragmented(profile("1g.10gb")),
        "nothing is free at all"
    );
}

#[test]
fn the_media_extension_profile_is_limited_to_one_per_gpu_by_its_counter() {
    let mut cluster = Cluster::new(&setup(1, 8), Order::Ours);
    assert!(cluster.place(profile("1g.10gb+me")).is_some());
    assert!(cluster.place(profile("1g.10gb+me")).is_none());
    assert!(
        !cluster.fragmented(profile("1g.10gb+me")),
        "the instance limit, not the placement, refuses it"
    );
    assert_eq!(cluster.free(0, 0)["1g10gbme-instances"], 0);
}

#[test]
fn counters_are_never_over_consumed_and_all_come_back() {
    let spec = TraceSpec {
        seed: 7,
        arrivals: 3000,
        mean_lifetime: 90,
        warmup: 200,
        mix: bench_mix(),
    };
    let trace = trace(&spec);
    for order in Order::ALL {
        let mut cluster = Cluster::new(&setup(20, 8), order);
        let mut held = BTreeMap::new();
        let mut refused = 0;
        for event in &trace.events {
            match *event {
                Event::Arrive { pod, profile } => match cluster.place(profile) {
                    Some(allocation) => {
                        held.insert(pod, allocation);
                    }
                    None => refused += 1,
                },
                Event::Depart { pod } => {
                    if let Some(allocation) = held.remove(&pod) {
                        cluster.release(&allocation);
                    }
                }
            }
            cluster.check().unwrap();
        }
        assert!(refused > 0, "{order:?}: the trace fills the GPUs");
        assert!(held.is_empty());
        assert_eq!(cluster.gpus_in_use(), 0);
        for node in 0..cluster.nodes.len() {
            for gpu in 0..cluster.nodes[node].free.len() {
                let free = cluster.free(node, gpu);
                assert_eq!(free["compute-slices"], 7);
                assert_eq!(free["multiprocessors"], 132);
                assert!((0..8).all(|slice| free[&format!("memory-slice-{slice}")] == 1));
            }
        }
    }
}

#[test]
fn traces_are_deterministic_balanced_and_every_pod_leaves_once_after_it_came() {
    let spec = TraceSpec {
        seed: 1,
        arrivals: 20_000,
        mean_lifetime: 100,
        warmup: 300,
        mix: bench_mix(),
    };
    let trace = trace(&spec);
    assert_eq!(trace, super::trace(&spec), "the same seed, the same trace");
    assert_ne!(
        trace,
        super::trace(&TraceSpec {
            seed: 2,
            ..spec.clone()
        }),
        "another seed, another trace"
    );
    let mut arrived = BTreeSet::new();
    let mut departed = BTreeSet::new();
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    let mut live = 0i64;
    let mut live_sum = 0i64;
    for event in &trace.events {
        match event {
            Event::Arrive { pod, profile } => {
                assert!(arrived.insert(*pod));
                *counts.entry(profile.name.to_string()).or_default() += 1;
                live += 1;
                live_sum += live;
            }
            Event::Depart { pod } => {
                assert!(arrived.contains(pod), "pod {pod} leaves before it came");
                assert!(departed.insert(*pod), "pod {pod} leaves twice");
                live -= 1;
            }
        }
    }
    assert_eq!(arrived, departed);
    assert_eq!(arrived.len(), 20_000);
    let share = |name: &str| f64::from(counts[name]) / 20_000.0;
    assert!((share("1g.10gb") - 0.40).abs() < 0.02, "{counts:?}");
    assert!((share("2g.20gb") - 0.25).abs() < 0.02, "{counts:?}");
    assert!((share("7g.80gb") - 0.05).abs() < 0.01, "{counts:?}");
    let mean_live = live_sum as f64 / 20_000.0;
    assert!(
        (mean_live - 100.0).abs() < 10.0,
        "about mean_lifetime pods at once: {mean_live}"
    );
}

#[test]
fn the_replay_counts_what_it_did() {
    let spec = TraceSpec {
        seed: 3,
        arrivals: 2000,
        mean_lifetime: 70,
        warmup: 200,
        mix: bench_mix(),
    };
    let trace = trace(&spec);
    for order in Order::ALL {
        let outcome = replay(&setup(20, 8), order, &trace);
        assert_eq!(outcome.order, order);
        assert_eq!(outcome.arrivals, 2000);
        assert_eq!(outcome.placed + outcome.refused, 2000);
        assert!(outcome.refused_fragmented <= outcome.refused);
        assert_eq!(
            outcome.refused_by_profile.values().sum::<u32>(),
            outcome.refused
        );
        assert!(outcome.gpus_used_max <= 20);
        assert!(outcome.gpus_used_mean <= f64::from(outcome.gpus_used_max));
        assert!(
            outcome.busy_mean > 0.5 && outcome.busy_mean <= 1.0,
            "{outcome:?}"
        );
        assert_eq!(
            outcome.can_take_mean.keys().collect::<Vec<_>>(),
            ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
        );
    }
}

#[test]
fn mix_names_profiles_the_model_has() {
    assert!(
        mix(h100(), &[("1g.5gb", 1)])
            .unwrap_err()
            .contains("no MIG profile 1g.5gb")
    );
    assert!(mix(h100(), &[("one", 1)]).is_err());
    assert_eq!(mix(h100(), &[("1g.10gb+me", 3)]).unwrap()[0].0.id, 20);
}
