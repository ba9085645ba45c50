use std::collections::BTreeMap;
use std::path::Path;

use super::nfd::{self, NFD_MANAGED_ANNOTATION, OWNED_ANNOTATION};
use node_runtime::host::{self, HostFacts, PciDevice};

fn write(root: &Path, path: &str, text: &str) {
    let path = root.join(path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

const UBUNTU: &str = "PRETTY_NAME=\"Ubuntu 22.04.4 LTS\"\nNAME=\"Ubuntu\"\nVERSION_ID=\"22.04\"\n\
    VERSION=\"22.04.4 LTS (Jammy Jellyfish)\"\nID=ubuntu\nID_LIKE=debian\n# a comment\n\nnot a field\n";

/// A host with an A100 (3D controller), an NVIDIA audio function, an Intel NIC and a device with no class file.
fn sysfs(root: &Path) -> std::path::PathBuf {
    for (address, vendor, class) in [
        ("0000:3b:00.0", "0x10de\n", "0x030200\n"),
        ("0000:3b:00.1", "0x10de\n", "0x040300\n"),
        ("0000:5e:00.0", "0x8086\n", "0x020000\n"),
    ] {
        write(
            root,
            &format!("sys/bus/pci/devices/{address}/vendor"),
            vendor,
        );
        write(root, &format!("sys/bus/pci/devices/{address}/class"), class);
    }
    write(root, "sys/bus/pci/devices/0000:00:1f.0/vendor", "0x8086\n");
    root.join("sys/bus/pci/devices")
}

#[test]
fn sysfs_devices_are_read_with_vendor_and_class() {
    let dir = tempfile::tempdir().unwrap();
    let devices = host::read_pci_devices(&sysfs(dir.path())).unwrap();
    assert_eq!(
        devices,
        [
            PciDevice {
                address: "0000:3b:00.0".into(),
                vendor: 0x10de,
                class: 0x030200
            },
            PciDevice {
                address: "0000:3b:00.1".into(),
                vendor: 0x10de,
                class: 0x040300
            },
            PciDevice {
                address: "0000:5e:00.0".into(),
                vendor: 0x8086,
                class: 0x020000
            },
        ],
        "sorted by address; the device without a class file is left out"
    );
    assert_eq!(
        host::nvidia_classes(&devices),
        BTreeMap::from([
            ("0000:3b:00.0".to_owned(), 0x0302),
            ("0000:3b:00.1".to_owned(), 0x0403)
        ])
    );
    assert!(host::read_pci_devices(&dir.path().join("nope")).is_err());
}

#[test]
fn os_release_is_read_from_etc_then_usr_lib() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "usr/lib/os-release",
        "ID=rhel\nVERSION_ID='9.4'\n",
    );
    let fallback = host::read_os_release(dir.path()).unwrap();
    assert_eq!(fallback, map(&[("ID", "rhel"), ("VERSION_ID", "9.4")]));
    write(dir.path(), "etc/os-release", UBUNTU);
    let ubuntu = host::read_os_release(dir.path()).unwrap();
    assert_eq!(ubuntu["ID"], "ubuntu");
    assert_eq!(ubuntu["VERSION_ID"], "22.04");
    assert_eq!(ubuntu["PRETTY_NAME"], "Ubuntu 22.04.4 LTS");
    assert!(!ubuntu.contains_key("not a field"));
    assert!(host::read_os_release(&dir.path().join("nope")).is_err());
    assert_eq!(
        host::parse_os_release("NAME=\"Say \\\"hi\\\"\"\nlower=x\n"),
        map(&[("NAME", "Say \"hi\"")])
    );
}

#[test]
fn hex_numbers_as_sysfs_writes_them() {
    assert_eq!(host::parse_hex("0x10de\n"), Some(0x10de));
    assert_eq!(host::parse_hex("030200"), Some(0x030200));
    assert_eq!(host::parse_hex("0xzz"), None);
}

fn facts(root: &Path) -> HostFacts {
    HostFacts {
        os_release: host::read_os_release(root).unwrap(),
        kernel: Some("5.15.0-119-generic".into()),
        pci: host::read_pci_devices(&sysfs(root)).unwrap(),
    }
}

#[test]
fn nfd_labels_as_nvidias_operator_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "etc/os-release", UBUNTU);
    let labels = nfd::labels(&facts(dir.path()));
    let expected = map(&[
        ("feature.node.kubernetes.io/pci-10de.present", "true"),
        ("feature.node.kubernetes.io/pci-0302_10de.present", "true"),
        ("feature.node.kubernetes.io/system-os_release.ID", "ubuntu"),
        (
            "feature.node.kubernetes.io/system-os_release.VERSION_ID",
            "22.04",
        ),
        (
            "feature.node.kubernetes.io/system-os_release.VERSION_ID.major",
            "22",
        ),
        (
            "feature.node.kubernetes.io/system-os_release.VERSION_ID.minor",
            "04",
        ),
        (
            "feature.node.kubernetes.io/kernel-version.full",
            "5.15.0-119-generic",
        ),
        ("feature.node.kubernetes.io/kernel-version.major", "5"),
        ("feature.node.kubernetes.io/kernel-version.minor", "15"),
        ("feature.node.kubernetes.io/kernel-version.revision", "0"),
    ]);
    assert_eq!(labels, expected);
    // The operator's own names for the labels it reads.
    for name in [
        crd::labels::NFD_PCI_NVIDIA,
        crd::labels::NFD_PCI_NVIDIA_3D,
        crd::labels::NFD_OS_ID,
        crd::labels::NFD_OS_VERSION_ID,
        crd::labels::NFD_KERNEL_VERSION,
    ] {
        assert!(labels.contains_key(name), "{name}");
    }

    // A workstation GPU in graphics mode, RHCOS with its OSTree version, a value that cannot be a label.
    let rhcos = HostFacts {
        os_release: map(&[
            ("ID", "rhcos"),
            ("VERSION_ID", "4.16"),
            ("OSTREE_VERSION", "416.94.202406251923-0"),
            ("NAME", "Red Hat Enterprise Linux CoreOS"),
        ]),
        kernel: Some("6.1.0+debug".into()),
        pci: vec![PciDevice {
            address: "0000:01:00.0".into(),
            vendor: 0x10de,
            class: 0x030000,
        }],
    };
    let labels = nfd::labels(&rhcos);
    assert_eq!(
        labels["feature.node.kubernetes.io/pci-0300_10de.present"],
        "true"
    );
    assert_eq!(
        labels["feature.node.kubernetes.io/pci-10de.present"],
        "true"
    );
    assert_eq!(
        labels["feature.node.kubernetes.io/system-os_release.OSTREE_VERSION"],
        "416.94.202406251923-0"
    );
    assert!(
        !labels.keys().any(|key| key.contains("kernel-version")),
        "{labels:?}"
    );

    // No NVIDIA device of a GPU or network class: no PCI label at all (NFD writes no `false`).
    let none = HostFacts {
        pci: vec![PciDevice {
            address: "0000:3b:00.1".into(),
            vendor: 0x10de,
            class: 0x040300,
        }],
        ..HostFacts::default()
    };
    assert!(nfd::labels(&none).is_empty());
}

#[test]
fn labels_nfd_manages_are_left_alone() {
    let desired = map(&[("feature.node.kubernetes.io/pci-10de.present", "true")]);
    let annotations = map(&[(NFD_MANAGED_ANNOTATION, "pci-0302_10de.present")]);
    assert_eq!(nfd::patch(&BTreeMap::new(), &annotations, &desired), None);
}

#[test]
fn only_labels_this_role_wrote_are_removed() {
    let desired = map(&[
        (
            "feature.node.kubernetes.io/kernel-version.full",
            "6.8.0-40-generic",
        ),
        ("feature.node.kubernetes.io/system-os_release.ID", "ubuntu"),
    ]);
    let current = map(&[
        (
            "feature.node.kubernetes.io/kernel-version.full",
            "5.15.0-119-generic",
        ),
        ("feature.node.kubernetes.io/system-os_release.ID", "ubuntu"),
        ("feature.node.kubernetes.io/pci-10de.present", "true"),
        ("feature.node.kubernetes.io/pci-0302_10de.present", "true"),
    ]);
    // It wrote the kernel, OS and 0302 labels; an admin wrote pci-10de.present by hand.
    let annotations = map(&[(
        OWNED_ANNOTATION,
        "kernel-version.full,pci-0302_10de.present,system-os_release.ID",
    )]);
    let patch = nfd::patch(&current, &annotations, &desired).unwrap();
    assert_eq!(
        patch.labels,
        BTreeMap::from([
            (
                "feature.node.kubernetes.io/kernel-version.full".to_owned(),
                Some("6.8.0-40-generic".to_owned())
            ),
            (
                "feature.node.kubernetes.io/pci-0302_10de.present".to_owned(),
                None
            ),
        ])
    );
    assert_eq!(
        patch.annotations,
        BTreeMap::from([(
            OWNED_ANNOTATION.to_owned(),
            Some("kernel-version.full,system-os_release.ID".to_owned())
        )])
    );
    // Applied, nothing is left to do.
    let mut labels = current.clone();
    labels.remove("feature.node.kubernetes.io/pci-0302_10de.present");
    labels.insert(
        "feature.node.kubernetes.io/kernel-version.full".into(),
        "6.8.0-40-generic".into(),
    );
    let recorded = map(&[(OWNED_ANNOTATION, "kernel-version.full,system-os_release.ID")]);
    assert!(nfd::patch(&labels, &recorded, &desired).unwrap().is_empty());
}

#[test]
fn simulated_nodes_have_a_3d_controller_per_gpu() {
    let pci = super::simulated_pci(2);
    let labels = nfd::labels(&HostFacts {
        pci,
        ..HostFacts::default()
    });
    assert_eq!(
        labels.keys().collect::<Vec<_>>(),
        [
            "feature.node.kubernetes.io/pci-0302_10de.present",
            "feature.node.kubernetes.io/pci-10de.present"
        ]
    );
}

#[test]
fn the_simulator_says_how_many_gpus_a_node_has() {
    use k8s_openapi::api::core::v1::Node;
    use node_runtime::backend::{GpuSource, Simulate};

    let mut annotated = Node::default();
    annotated.metadata.annotations = Some(map(&[(
        crd::labels::SIMULATED_GPUS_ANNOTATION,
        "a100-40gb:2,h100-80gb:1",
    )]));
    let source = |simulate: Option<Simulate>| GpuSource {
        simulate,
        sim_state: None,
    };
    assert_eq!(
        super::simulated_gpus(&source(Some(Simulate::Node)), &annotated),
        Some(3)
    );
    assert_eq!(
        super::simulated_gpus(&source(Some(Simulate::Node)), &Node::default()),
        Some(0),
        "a simulated node without the annotation has no GPU"
    );
    let spec = Simulate::Gpus("a100-80gb:4".parse().unwrap());
    assert_eq!(
        super::simulated_gpus(&source(Some(spec)), &Node::default()),
        Some(4)
    );
    assert_eq!(
        super::simulated_gpus(&source(None), &annotated),
        None,
        "real nodes read sysfs"
    );
}
