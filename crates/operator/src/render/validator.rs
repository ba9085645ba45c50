//! The validator: init containers check the driver, then the toolkit, and write their ready files into
//! `/run/nvidia/validations`, which every other operand's init container waits for; the main container keeps
//! watching (device plugin and CUDA checks included) so that the files stay true.

use crd::cluster_policy::ValidationStepSpec;
use k8s_openapi::api::core::v1::Container;

use super::RenderedObject;
use super::common::{
    HostMount, NODE_AGENT, OperandDaemonSet, container, node_name_env, privileged, with_user_env,
};
use crate::model::{ClusterFacts, Component, ValidatedPolicy};

pub(super) fn render(policy: &ValidatedPolicy, facts: &ClusterFacts) -> Vec<RenderedObject> {
    let validator = &policy.spec.validator;
    let image = policy.image(Component::OperatorValidator);
    let mounts = [
        HostMount::validations(),
        // The driver container's root; empty where the driver is pre-installed, and the host root is checked.
        HostMount::new(
            "driver-install-dir",
            &policy.spec.host_paths.driver_install_dir,
            "/run/nvidia/driver",
        )
        .create()
        .read_only()
        .propagation("HostToContainer"),
        HostMount::host_root(policy),
    ];

    let mut ds = OperandDaemonSet::new(policy, facts, Component::OperatorValidator);
    ds.add_init(
        step("driver-validation", "driver", [&validator.driver]),
        image,
        &validator.image,
        &mounts,
    );
    if policy.is_enabled(Component::ContainerToolkit) {
        ds.add_init(
            step("toolkit-validation", "toolkit", [&validator.toolkit]),
            image,
            &validator.image,
            &mounts,
        );
    }
    // The section's own env (`validator.env`) is layered over these by the shared builder.
    ds.main = step(
        Component::OperatorValidator.app_name(),
        "watch",
        [&validator.plugin, &validator.cuda],
    );
    for mount in &mounts {
        ds.mount(mount);
    }
    vec![ds.build().into()]
}

/// A privileged container running `gpu-node-agent validate <step>` with `NODE_NAME` and the steps' env.
fn step<'a>(
    name: &str,
    step: &str,
    settings: impl IntoIterator<Item = &'a Option<ValidationStepSpec>>,
) -> Container {
    let mut container = container(name, [NODE_AGENT, "validate", step]);
    let env = settings
        .into_iter()
        .flatten()
        .fold(vec![node_name_env()], |env, settings| {
            with_user_env(env, &settings.env)
        });
    container.env = Some(env);
    container.security_context = privileged();
    container
}
