//! The validator: init containers check the driver, then the toolkit, and write their ready files into
//! `/run/nvidia/validations`, which every other operand's init container waits for; the main container keeps
//! watching (device plugin and CUDA checks included) so that the files stay true.

use crd::cluster_policy::ValidationStepSpec;
use k8s_openapi::api::core::v1::{Container, EnvVar, SecurityContext};

use super::RenderedObject;
use super::common::{
    HostMount, NODE_AGENT, OperandDaemonSet, RootFs, User, confined, container, env,
    gpu_access_env, node_name_env, privileged, with_user_env,
};
use crate::model::{ClusterFacts, Component, ValidatedPolicy};

/// Where the toolkit's install folder is mounted: the host's path under `/host`.
const HOST: &str = "/host";

pub(super) fn render(policy: &ValidatedPolicy, facts: &ClusterFacts) -> Vec<RenderedObject> {
    let validator = &policy.spec.validator;
    let image = policy.image(Component::OperatorValidator);
    let toolkit = toolkit_install(policy);
    // The ready files are written into a root-owned host folder, hence root (without capabilities) below.
    let validations = HostMount::validations();

    let mut ds = OperandDaemonSet::new(policy, facts, Component::OperatorValidator);
    // Privileged: the driver is checked before the toolkit is installed, so the NVIDIA runtime cannot hand this
    // container the GPUs; it opens the device nodes itself, which only a privileged container sees (NVIDIA's
    // driver validation is privileged for the same reason).
    let driver = step(
        "driver-validation",
        "driver",
        [&validator.driver],
        gpu_access_env().into(),
        privileged(RootFs::ReadOnly),
    );
    ds.add_init(
        driver,
        image,
        &validator.image,
        std::slice::from_ref(&validations),
    );
    if let Some((mount, runtime)) = &toolkit {
        let check = step(
            "toolkit-validation",
            "toolkit",
            [&validator.toolkit],
            vec![runtime.clone()],
            confined(User::Root, &[], RootFs::ReadOnly),
        );
        ds.add_init(
            check,
            image,
            &validator.image,
            &[validations.clone(), mount.clone()],
        );
    }
    // The section's own env (`validator.env`) is layered over these by the shared builder. After the toolkit is
    // ready, the NVIDIA runtime gives this container the GPUs: no privilege.
    let mut watch_env: Vec<EnvVar> = gpu_access_env().into();
    watch_env.extend(toolkit.as_ref().map(|(_, runtime)| runtime.clone()));
    ds.main = step(
        Component::OperatorValidator.app_name(),
        "watch",
        [&validator.plugin, &validator.cuda],
        watch_env,
        confined(User::Root, &[], RootFs::ReadOnly),
    );
    ds.mount(&validations);
    if let Some((mount, _)) = &toolkit {
        ds.mount(mount);
    }
    vec![ds.build().into()]
}

/// When the toolkit is enabled, its install folder (read-only, under `/host`) and the `TOOLKIT_RUNTIME` that names
/// the runtime it installs there: all of the host the toolkit check reads.
fn toolkit_install(policy: &ValidatedPolicy) -> Option<(HostMount, EnvVar)> {
    if !policy.is_enabled(Component::ContainerToolkit) {
        return None;
    }
    let install_dir = policy.spec.toolkit.install_dir.trim_end_matches('/');
    let mounted = format!("{HOST}{install_dir}");
    let mount = HostMount::new("toolkit-install-dir", install_dir, &mounted)
        .create()
        .read_only();
    let runtime = env(
        "TOOLKIT_RUNTIME",
        format!("{mounted}/toolkit/nvidia-container-runtime"),
    );
    Some((mount, runtime))
}

/// A container running `gpu-node-agent validate <step>` with `NODE_NAME`, `env`, then the steps' env.
fn step<'a>(
    name: &str,
    step: &str,
    settings: impl IntoIterator<Item = &'a Option<ValidationStepSpec>>,
    env: Vec<EnvVar>,
    security_context: Option<SecurityContext>,
) -> Container {
    let mut container = container(name, [NODE_AGENT, "validate", step]);
    let env = settings
        .into_iter()
        .flatten()
        .fold([vec![node_name_env()], env].concat(), |env, settings| {
            with_user_env(env, &settings.env)
        });
    container.env = Some(env);
    container.security_context = security_context;
    container
}
