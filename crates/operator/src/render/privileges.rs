//! Every privilege the operands' pods hold, with the reason each one's code needs it, and the test that keeps
//! the rendered DaemonSets and this table in step.
//!
//! A container that is not privileged must be confined (every capability dropped, no privilege escalation, the
//! runtime's default seccomp profile); beyond that, anything a rendered pod or container holds must be listed
//! here, and everything listed here must still be rendered by some option. Privileges granted by
//! `privileged: true` (capabilities, root, devices) are not listed again for that container.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::fixture::{facts, node, policy};
use super::{RenderedObject, render};
use crate::model::{Component, ContainerRuntime};

/// A privilege beyond a confined, non-root container with a read-only root filesystem.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Privilege {
    /// `privileged: true`.
    Privileged,
    /// A Linux capability added back.
    Capability(String),
    /// The host's PID namespace.
    HostPid,
    /// The host's IPC namespace.
    HostIpc,
    /// The host's network namespace.
    HostNetwork,
    /// Runs as user 0.
    Root,
    /// May write its image's filesystem.
    WritableRoot,
    /// A host path mounted, by volume name.
    HostPath { volume: String, writable: bool },
}

/// What holds a privilege: a pod (host namespaces) or a container, of an operand; or any container at all.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Holder {
    Pod(Component),
    Container(Component, String),
    AnyContainer,
}

impl Holder {
    fn covers(&self, found: &Holder) -> bool {
        match (self, found) {
            (Holder::AnyContainer, Holder::Container(..)) => true,
            (listed, found) => listed == found,
        }
    }
}

/// One privilege one holder has, and why.
#[derive(Debug)]
struct Grant {
    holder: Holder,
    privilege: Privilege,
    reason: &'static str,
}

fn grant(holder: Holder, privilege: Privilege, reason: &'static str) -> Grant {
    Grant {
        holder,
        privilege,
        reason,
    }
}

fn pod(component: Component) -> Holder {
    Holder::Pod(component)
}

fn ctr(component: Component, name: &str) -> Holder {
    Holder::Container(component, name.into())
}

fn cap(name: &str) -> Privilege {
    Privilege::Capability(name.into())
}

fn read(volume: &str) -> Privilege {
    Privilege::HostPath {
        volume: volume.into(),
        writable: false,
    }
}

fn write(volume: &str) -> Privilege {
    Privilege::HostPath {
        volume: volume.into(),
        writable: true,
    }
}

/// The table: per operand and container, each privilege and its reason.
#[allow(clippy::too_many_lines)] // One table, read top to bottom.
fn table() -> Vec<Grant> {
    use Component::{
        ContainerToolkit, Dcgm, DcgmExporter, DevicePlugin, DraDriver, Driver, GpuFeatureDiscovery,
        MigManager, NodeStatusExporter, OperatorValidator, Watchdog,
    };
    use Privilege::{HostNetwork, HostPid, Privileged, Root, WritableRoot};
    let driver = ctr(Driver, "nvidia-driver-ctr");
    let manager = ctr(Driver, "k8s-driver-manager");
    let toolkit = ctr(ContainerToolkit, "nvidia-container-toolkit-ctr");
    let check_driver = ctr(OperatorValidator, "driver-validation");
    let check_toolkit = ctr(OperatorValidator, "toolkit-validation");
    let watch = ctr(OperatorValidator, OperatorValidator.app_name());
    let plugin = ctr(DevicePlugin, "nvidia-device-plugin");
    let dcgm = ctr(Dcgm, "nvidia-dcgm-ctr");
    let exporter = ctr(DcgmExporter, DcgmExporter.app_name());
    let mig = ctr(MigManager, "nvidia-mig-manager");
    let watchdog = ctr(Watchdog, Watchdog.app_name());
    let dra = ctr(DraDriver, DraDriver.app_name());
    let mut table = vec![
        // The driver container, NVIDIA's image.
        grant(
            pod(Driver),
            HostPid,
            "NVIDIA's image finds the host processes that hold the driver before unloading it",
        ),
        grant(
            driver.clone(),
            Privileged,
            "loads the NVIDIA kernel modules into the host kernel",
        ),
        grant(
            driver.clone(),
            WritableRoot,
            "NVIDIA's image builds the kernel modules in its own filesystem",
        ),
        grant(
            driver.clone(),
            write("run-nvidia"),
            "exposes its root filesystem (/run/nvidia/driver) to the host and the other operands, propagated back (Bidirectional)",
        ),
        grant(
            driver.clone(),
            write("var-log"),
            "NVIDIA's image writes its install logs to the host's /var/log",
        ),
        grant(
            driver.clone(),
            write("dev-log"),
            "NVIDIA's image logs through the host's syslog socket",
        ),
        grant(
            driver.clone(),
            read("host-root"),
            "reads the host's OS release, kernel headers and loaded modules",
        ),
        grant(
            driver.clone(),
            write("firmware"),
            "installs the GPU's GSP firmware where the host kernel loads firmware from",
        ),
        grant(
            manager.clone(),
            Privileged,
            "unloads the driver's kernel modules and stops their host users before a driver change",
        ),
        grant(
            manager.clone(),
            WritableRoot,
            "NVIDIA's image writes its own state into its filesystem",
        ),
        grant(
            manager.clone(),
            write("run-nvidia"),
            "removes the previous driver container's root from /run/nvidia",
        ),
        grant(
            manager,
            read("host-root"),
            "reads the host's loaded modules and mounts",
        ),
        // The container toolkit, NVIDIA's image.
        grant(
            toolkit.clone(),
            Privileged,
            "writes the host's container runtime configuration and has the runtime reload",
        ),
        grant(
            toolkit.clone(),
            WritableRoot,
            "NVIDIA's image writes its own state into its filesystem",
        ),
        grant(
            toolkit.clone(),
            write("runtime-config-dir"),
            "adds the nvidia runtime to the runtime's configuration file",
        ),
        grant(
            toolkit.clone(),
            write("runtime-socket-dir"),
            "signals the runtime to reload through its socket",
        ),
        grant(
            toolkit.clone(),
            write("toolkit-install-dir"),
            "installs the NVIDIA container runtime onto the host",
        ),
        grant(
            toolkit,
            write("run-nvidia"),
            "reads the driver container's root and writes its own pid file under /run/nvidia",
        ),
        grant(
            ctr(ContainerToolkit, "driver-validation"),
            read("run-nvidia-validations"),
            "waits for the driver's ready file",
        ),
        // The validator.
        grant(
            check_driver.clone(),
            Privileged,
            "checks the driver before the toolkit exists, so the NVIDIA runtime cannot hand it the GPUs: it opens the device nodes itself (NVIDIA's driver validation is privileged too)",
        ),
        grant(
            check_driver,
            write("run-nvidia-validations"),
            "writes the driver's ready file",
        ),
        grant(
            check_toolkit.clone(),
            Root,
            "writes the toolkit's ready file into the root-owned host folder",
        ),
        grant(
            check_toolkit.clone(),
            write("run-nvidia-validations"),
            "writes the toolkit's ready file",
        ),
        grant(
            check_toolkit,
            read("toolkit-install-dir"),
            "checks that the toolkit installed its runtime there",
        ),
        grant(
            watch.clone(),
            Root,
            "writes and removes ready files in the root-owned host folder",
        ),
        grant(
            watch.clone(),
            write("run-nvidia-validations"),
            "keeps the ready files true",
        ),
        grant(
            watch,
            read("toolkit-install-dir"),
            "checks that the toolkit's runtime is still installed",
        ),
        // The device plugin.
        grant(
            plugin.clone(),
            Privileged,
            "as NVIDIA's device plugin in its operator: MIG devices are listed through the MIG capability devices, which need CAP_SYS_ADMIN, and each node's config decides MIG at run time; it watches every GPU's health and starts MPS daemons",
        ),
        grant(
            plugin.clone(),
            write("device-plugins"),
            "serves its sockets where the kubelet's device manager looks, and registers through the kubelet's socket there",
        ),
        grant(
            plugin.clone(),
            write("mps-root"),
            "creates the MPS daemons' pipe and log folders that workloads mount",
        ),
        grant(
            plugin,
            write("cdi-root"),
            "writes the CDI specs of the devices it hands out",
        ),
        // GPU feature discovery.
        grant(
            ctr(GpuFeatureDiscovery, GpuFeatureDiscovery.app_name()),
            Root,
            "NVML lists MIG devices only to holders of the root-only MIG monitor capability device",
        ),
        // The DCGM host engine, NVIDIA's image.
        grant(
            dcgm.clone(),
            Root,
            "NVIDIA's image runs as root; MIG devices need the root-only MIG monitor capability device",
        ),
        grant(
            dcgm.clone(),
            cap("SYS_ADMIN"),
            "DCGM's profiling (DCP) fields need CAP_SYS_ADMIN",
        ),
        grant(
            dcgm,
            WritableRoot,
            "the host engine writes its log file into its filesystem",
        ),
        // The exporter.
        grant(
            pod(DcgmExporter),
            HostPid,
            "only when dcgmExporter.hostPID asks for it",
        ),
        grant(
            pod(DcgmExporter),
            HostNetwork,
            "only when dcgmExporter.hostNetwork asks for it",
        ),
        grant(
            exporter.clone(),
            Root,
            "connects to the kubelet's root-only pod-resources socket; MIG devices need the root-only MIG monitor capability device",
        ),
        grant(
            exporter.clone(),
            read("pod-resources"),
            "the kubelet's pod-resources socket says which pod holds which GPU",
        ),
        grant(
            exporter,
            read("host-proc"),
            "each GPU process's cgroup names its pod, for the per-pod memory series",
        ),
        // The MIG manager.
        grant(
            pod(MigManager),
            HostPid,
            "only with WITH_REBOOT=true: the reboot signals the host's systemd",
        ),
        grant(
            mig.clone(),
            Privileged,
            "as NVIDIA's MIG manager: MIG changes need CAP_SYS_ADMIN and every GPU's MIG configuration capability device, and GPU resets need every GPU's device nodes and a writable sysfs",
        ),
        grant(
            mig,
            read("pod-resources"),
            "the kubelet's pod-resources socket says which pods a change disturbs",
        ),
        // The node status exporter.
        grant(
            ctr(NodeStatusExporter, NodeStatusExporter.app_name()),
            read("run-nvidia-validations"),
            "the ready files are the status it exports",
        ),
        // The watchdog.
        grant(
            pod(Watchdog),
            HostPid,
            "the pids NVML reports are the host's: their cgroups are read and they are signalled there",
        ),
        grant(
            watchdog.clone(),
            Root,
            "connects to the kubelet's root-only pod-resources socket",
        ),
        grant(
            watchdog.clone(),
            cap("KILL"),
            "signals the processes of pods that run as other users",
        ),
        grant(
            watchdog,
            read("pod-resources"),
            "the kubelet's pod-resources socket says which pod holds which GPU replica",
        ),
        // The DRA driver.
        grant(
            dra.clone(),
            Privileged,
            "as NVIDIA's DRA kubelet plugin: preparing a MIG claim creates the device (CAP_SYS_ADMIN, MIG configuration capability devices), and shared claims get MPS daemons that open the GPUs",
        ),
        grant(
            dra.clone(),
            write("plugins-registry"),
            "registers with the kubelet's plugin watcher",
        ),
        grant(
            dra.clone(),
            write("plugin"),
            "serves its socket in its own folder under the kubelet's plugins, and moves the checkpoint 0.1.0 kept there to its state directory",
        ),
        grant(
            dra.clone(),
            write("cdi-root"),
            "writes each prepared claim's CDI spec",
        ),
        grant(
            dra.clone(),
            write("mps-root"),
            "keeps the claims' MPS pipes and logs, which their containers mount",
        ),
        grant(
            dra.clone(),
            write("state"),
            "keeps its checkpoint of prepared claims on the host's tmpfs, where it lasts as long as the boot it describes",
        ),
        grant(
            dra,
            read("host-dev"),
            "device nodes made after it started (new MIG devices') are in the host's /dev only",
        ),
        // Any container, on simulated GPUs only.
        grant(
            Holder::AnyContainer,
            write("gpu-simulator-state"),
            "only where the section's env names a simulator state file (GPU_SIM_STATE): every operand of a simulated node shares it, as real ones share the GPUs",
        ),
    ];
    // Every operand that comes up after the driver, the toolkit and the validator waits for their ready files.
    for component in Component::ALL
        .into_iter()
        .filter(|component| !matches!(component, Driver | ContainerToolkit | OperatorValidator))
    {
        table.push(grant(
            ctr(component, "toolkit-validation"),
            read("run-nvidia-validations"),
            "waits for the driver's and toolkit's ready files",
        ));
    }
    table
}

/// Every rendering that adds privilege: every operand on, the options that add host namespaces, every container
/// runtime, two OS pools, precompiled drivers, and a simulator state file in the sections' env.
fn every_privileged_rendering() -> Vec<RenderedObject> {
    let simulated = json!([
        {"name": "GPU_SIMULATE", "value": "node"},
        {"name": "GPU_SIM_STATE", "value": "/run/gpu-simulator/state.json"}
    ]);
    let everything = json!({
        "nodeStatusExporter": {"enabled": true},
        "watchdog": {"enabled": true, "env": simulated},
        "draDriver": {"enabled": true},
        "dcgmExporter": {"hostPID": true, "hostNetwork": true},
        "migManager": {"env": [{"name": "WITH_REBOOT", "value": "true"}]},
        "devicePlugin": {"env": simulated},
    });
    let nodes = facts([
        node("containerd"),
        node("k3s").runtime(ContainerRuntime::K3sContainerd),
        node("rke2").runtime(ContainerRuntime::Rke2Containerd),
        node("crio").runtime(ContainerRuntime::CriO),
        node("docker")
            .runtime(ContainerRuntime::Docker)
            .os("rhel", "9.4"),
    ]);
    let mut precompiled = everything.clone();
    precompiled["driver"] = json!({"usePrecompiled": true});
    [everything, precompiled]
        .into_iter()
        .flat_map(|spec| render(&policy(spec), &nodes))
        .collect()
}

/// What a set of rendered objects holds: each privilege with its holder, and the containers that are not
/// confined as every unprivileged container must be.
fn privileges_of(objects: &[RenderedObject]) -> (Vec<(Holder, Privilege)>, Vec<String>) {
    let mut held = Vec::new();
    let mut unconfined = Vec::new();
    for object in objects {
        let RenderedObject::DaemonSet(_) = object else {
            continue;
        };
        let component = object.component();
        let json = object.to_json();
        let pod_spec = &json["spec"]["template"]["spec"];
        for (field, privilege) in [
            ("hostPID", Privilege::HostPid),
            ("hostIPC", Privilege::HostIpc),
            ("hostNetwork", Privilege::HostNetwork),
        ] {
            if pod_spec[field] == true {
                held.push((Holder::Pod(component), privilege));
            }
        }
        let host_path_volumes: Vec<&Value> = pod_spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|volume| volume["hostPath"].is_object())
            .map(|volume| &volume["name"])
            .collect();
        let containers = ["initContainers", "containers"]
            .iter()
            .filter_map(|key| pod_spec[key].as_array())
            .flatten();
        for container in containers {
            let name = container["name"].as_str().unwrap_or_default();
            let holder = Holder::Container(component, name.into());
            let context = &container["securityContext"];
            for mount in container["volumeMounts"].as_array().into_iter().flatten() {
                if host_path_volumes.contains(&&mount["name"]) {
                    let privilege = Privilege::HostPath {
                        volume: mount["name"].as_str().unwrap_or_default().into(),
                        writable: mount["readOnly"] != true,
                    };
                    held.push((holder.clone(), privilege));
                }
            }
            if context["readOnlyRootFilesystem"] != true {
                held.push((holder.clone(), Privilege::WritableRoot));
            }
            if context["privileged"] == true {
                held.push((holder, Privilege::Privileged));
                continue;
            }
            let confined = context["allowPrivilegeEscalation"] == false
                && context["capabilities"]["drop"] == json!(["ALL"])
                && context["seccompProfile"]["type"] == "RuntimeDefault";
            if !confined {
                unconfined.push(format!("{component} {name}: {context}"));
            }
            for capability in context["capabilities"]["add"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let capability = capability.as_str().unwrap_or_default();
                held.push((holder.clone(), Privilege::Capability(capability.into())));
            }
            let non_root = context["runAsNonRoot"] == true && context["runAsUser"] != 0;
            if !non_root {
                held.push((holder, Privilege::Root));
            }
        }
    }
    (held, unconfined)
}

/// The privileges held that the table does not list, and the table's entries that nothing holds.
fn compare(held: &[(Holder, Privilege)], table: &[Grant]) -> (BTreeSet<String>, Vec<String>) {
    let unexplained = held
        .iter()
        .filter(|(holder, privilege)| {
            !table
                .iter()
                .any(|grant| grant.holder.covers(holder) && grant.privilege == *privilege)
        })
        .map(|(holder, privilege)| format!("{holder:?} holds {privilege:?}"))
        .collect();
    let unused = table
        .iter()
        .filter(|grant| {
            !held.iter().any(|(holder, privilege)| {
                grant.holder.covers(holder) && grant.privilege == *privilege
            })
        })
        .map(|grant| {
            format!(
                "{:?} {:?} ({})",
                grant.holder, grant.privilege, grant.reason
            )
        })
        .collect();
    (unexplained, unused)
}

#[test]
fn every_privilege_an_operand_holds_is_listed_with_its_reason() {
    let (held, unconfined) = privileges_of(&every_privileged_rendering());
    assert!(
        unconfined.is_empty(),
        "unprivileged containers must drop every capability, forbid privilege escalation and use the runtime's \
         default seccomp profile:\n{}",
        unconfined.join("\n")
    );
    let (unexplained, unused) = compare(&held, &table());
    assert!(
        unexplained.is_empty(),
        "privileges without a reason in render/privileges.rs:\n{unexplained:#?}"
    );
    assert!(
        unused.is_empty(),
        "render/privileges.rs lists privileges no operand holds any more:\n{}",
        unused.join("\n")
    );
}

#[test]
fn a_privilege_the_table_does_not_list_is_found() {
    let mut objects = every_privileged_rendering();
    let discovery = objects
        .iter_mut()
        .find_map(|object| match object {
            RenderedObject::DaemonSet(ds)
                if ds.metadata.name.as_deref() == Some("gpu-feature-discovery") =>
            {
                Some(ds)
            }
            _ => None,
        })
        .expect("feature discovery is rendered");
    let pod_spec = discovery.spec.template.spec.as_mut().expect("a pod spec");
    pod_spec.host_ipc = Some(true);
    let context = pod_spec.containers[0].security_context.as_mut().unwrap();
    context.capabilities.as_mut().unwrap().add = Some(vec!["NET_ADMIN".into()]);
    let (held, _) = privileges_of(&objects);
    let (unexplained, _) = compare(&held, &table());
    assert_eq!(
        unexplained,
        BTreeSet::from([
            "Pod(GpuFeatureDiscovery) holds HostIpc".to_owned(),
            "Container(GpuFeatureDiscovery, \"gpu-feature-discovery\") holds Capability(\"NET_ADMIN\")"
                .to_owned(),
        ])
    );
}

#[test]
fn an_option_that_stops_adding_a_privilege_leaves_a_stale_entry() {
    let objects = render(&policy(json!({})), &facts([node("gpu-0")]));
    let (held, _) = privileges_of(&objects);
    let (_, unused) = compare(&held, &table());
    assert!(
        unused
            .iter()
            .any(|entry| entry.starts_with("Pod(MigManager) HostPid")),
        "without WITH_REBOOT the MIG manager has no host PID namespace: {unused:#?}"
    );
}
