//! One observation of the node, read without I/O: which config the Node asks for, the config file the ConfigMap
//! holds, the change record a crashed agent left, and what the GPUs need, turned into a [`Decision`]. The runner
//! gathers the inputs (the watched Node and ConfigMap, one reading of the GPUs) and carries the decision out.

use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};

use crd::config::ConfigError;
use crd::config::mig_parted;
use crd::gpu_node::GpuMigGeometry;
use crd::labels::MIG_CONFIG;
use gpu::planner::PlanError;
use kube::ResourceExt;
use tracing::warn;

use super::assess::{AssessError, GpuChange, assess, leave_instances_to_the_dra_driver};
use super::clients::Progress;
use super::state::{Assessment, Decision, Observation, Request, decide};
use crd::config::mig_parted::CONFIG_KEY;
use crd::dra::Partition;
use node_runtime::inventory::GpuView;
use node_runtime::kube_io::{self, Watched};

/// Where the mig-parted config file comes from: a key of a ConfigMap in the operator's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigSource {
    /// The ConfigMap's namespace.
    pub namespace: String,
    /// The ConfigMap's name (`--config-map`).
    pub config_map: String,
}

impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ConfigMap {}/{} key {CONFIG_KEY}",
            self.namespace, self.config_map
        )
    }
}

/// Why the requested config cannot be applied; nothing is touched, the state becomes `failed` with this reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The ConfigMap, or its key, is missing.
    #[error(
        "{file} does not exist; create it with the mig-parted config, or point migManager.config.name at the \
         ConfigMap that holds it"
    )]
    NoConfigFile {
        /// Where the file was looked for.
        file: ConfigSource,
    },
    /// The file is not a mig-parted config.
    #[error("{file}: {error}")]
    Unreadable {
        /// The file.
        file: ConfigSource,
        /// Its problem, naming the field.
        error: ConfigError,
    },
    /// The selected config is one of the file's invalid ones (the others still work).
    #[error("{file}: {problem}")]
    InvalidConfig {
        /// The file.
        file: ConfigSource,
        /// The config's problem, naming it and its entry.
        problem: ConfigError,
    },
    /// The selected config does not fit these GPUs (unknown name, model or geometry).
    #[error(transparent)]
    DoesNotFit(PlanError),
}

impl Rejection {
    fn from_assessment(file: &ConfigSource, error: AssessError) -> Self {
        match error {
            AssessError::Invalid(problem) => Self::InvalidConfig {
                file: file.clone(),
                problem,
            },
            AssessError::Plan(error) => Self::DoesNotFit(error),
        }
    }
}

/// What one observation of the node says, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The config asked for: the Node's label, or the default.
    pub config: Option<String>,
    /// The request (config and file), when a config is asked for.
    pub request: Option<Request>,
    /// The record of a change underway (the agent was stopped in the middle).
    pub progress: Option<Progress>,
    /// What each GPU needs, or why the request cannot be applied.
    pub changes: Result<Vec<GpuChange>, Rejection>,
    /// What to do.
    pub decision: Decision,
}

impl Observed {
    /// The geometry the config asks of each GPU, as GPUNode status shows it (none when it cannot be applied).
    #[must_use]
    pub fn desired(&self) -> Vec<GpuMigGeometry> {
        self.changes
            .as_ref()
            .map(|changes| changes.iter().map(GpuChange::desired_geometry).collect())
            .unwrap_or_default()
    }
}

/// Reads one observation: the Node and ConfigMap as watched, the GPUs as just read, and the request that failed
/// last (not retried until the label or the file changes).
#[must_use]
pub fn observe(
    watched: &Watched,
    file: &ConfigSource,
    default_config: Option<&str>,
    dra: &Partition,
    gpus: &[GpuView],
    failed: Option<&Request>,
) -> Observed {
    let node = &watched.node;
    // The DRA driver reports a bad partition label; here it falls back to the defaults as there.
    let (partition, _) = crd::dra::partition(dra, node.labels());
    let config = kube_io::label(node, MIG_CONFIG)
        .or(default_config)
        .map(str::to_owned);
    let progress = Progress::from_annotations(node.annotations()).unwrap_or_else(|error| {
        warn!(%error, "ignoring an unreadable MIG progress record");
        None
    });
    let text = watched
        .config_map
        .as_ref()
        .and_then(|config_map| kube_io::config_map_value(config_map, CONFIG_KEY));
    let changes = match (parse(file, text), &config) {
        (Err(rejection), _) => Err(rejection),
        (Ok(parsed), Some(name)) => assess(&parsed, name, gpus)
            .map(|mut changes| {
                leave_instances_to_the_dra_driver(&mut changes, |gpu| partition.dynamic_mig(gpu));
                changes
            })
            .map_err(|error| Rejection::from_assessment(file, error)),
        (Ok(_), None) => Ok(Vec::new()),
    };
    let request = config.clone().map(|config| Request {
        config,
        file: fingerprint(text),
    });
    let assessment = match &changes {
        Err(_) => Assessment::Impossible,
        Ok(changes) if changes.iter().all(GpuChange::is_noop) => Assessment::Matches,
        Ok(_) => Assessment::Differs,
    };
    let decision = decide(Observation {
        request: request.as_ref(),
        assessment,
        in_progress: progress.is_some(),
        failed,
    });
    Observed {
        config,
        request,
        progress,
        changes,
        decision,
    }
}

/// The config file, or why there is none. Invalid named configs in it do not make it unusable: only a node that
/// selects one fails.
fn parse(
    file: &ConfigSource,
    text: Option<&str>,
) -> Result<mig_parted::ParsedMigConfig, Rejection> {
    let text = text.ok_or_else(|| Rejection::NoConfigFile { file: file.clone() })?;
    mig_parted::parse(text).map_err(|error| Rejection::Unreadable {
        file: file.clone(),
        error,
    })
}

/// A fingerprint of the config file's text.
fn fingerprint(text: Option<&str>) -> u64 {
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Node;

    use super::*;
    use crate::mig::nvidia_config_with;
    use crate::test_support::config_map;
    use node_runtime::inventory::read;
    use node_runtime::testing::simulated;

    /// A config that NVIDIA's file would hold if it gave the A100-80GB a profile it does not have.
    const BROKEN: &str = r#"  broken:
    - device-filter: "0x20B210DE"
      devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
"#;

    /// One A100-80GB with MIG off, seen through NVIDIA's config file (plus [`BROKEN`]).
    struct Look {
        _dir: tempfile::TempDir,
        gpus: Vec<GpuView>,
        file: String,
    }

    impl Look {
        fn new() -> Self {
            let (dir, simulator) = simulated("a100-80gb:1", &[]);
            Self {
                gpus: read(simulator.as_ref()).unwrap(),
                _dir: dir,
                file: nvidia_config_with(BROKEN),
            }
        }

        /// What the manager makes of a Node labelled `label`, with `text` in the ConfigMap (`None`: no ConfigMap).
        fn at(
            &self,
            label: Option<&str>,
            text: Option<&str>,
            default: Option<&str>,
            failed: Option<&Request>,
        ) -> Observed {
            let mut node = Node::default();
            node.metadata.name = Some("node-1".into());
            node.metadata.labels =
                label.map(|name| [(MIG_CONFIG.to_owned(), name.to_owned())].into());
            let watched = Watched {
                node,
                config_map: text.map(|text| config_map(&[(CONFIG_KEY, text)])),
            };
            let file = ConfigSource {
                namespace: "gpu-operator".into(),
                config_map: "default-mig-parted-config".into(),
            };
            observe(
                &watched,
                &file,
                default,
                &Partition::default(),
                &self.gpus,
                failed,
            )
        }

        /// As [`Look::at`] with NVIDIA's file and no default.
        fn labelled(&self, label: &str, failed: Option<&Request>) -> Observed {
            self.at(Some(label), Some(&self.file), None, failed)
        }
    }

    #[test]
    fn the_label_wins_over_the_default_and_a_differing_gpu_is_changed() {
        let look = Look::new();
        let file = Some(look.file.as_str());
        let labelled = look.at(Some("all-1g.10gb"), file, Some("all-disabled"), None);
        assert_eq!(labelled.config.as_deref(), Some("all-1g.10gb"));
        assert_eq!(labelled.decision, Decision::Change);
        assert_eq!(labelled.desired()[0].devices["1g.10gb"], 7);
        let default = look.at(None, file, Some("all-disabled"), None);
        assert_eq!(default.config.as_deref(), Some("all-disabled"));
        assert_eq!(default.decision, Decision::Converged);
        let idle = look.at(None, file, None, None);
        assert_eq!((idle.decision, idle.request), (Decision::Idle, None));
    }

    #[test]
    fn a_missing_or_bad_file_rejects_and_says_where_to_look() {
        let look = Look::new();
        let missing = look.at(Some("all-1g.10gb"), None, None, None);
        assert_eq!(missing.decision, Decision::Reject);
        assert_eq!(
            missing.changes.unwrap_err().to_string(),
            "ConfigMap gpu-operator/default-mig-parted-config key config.yaml does not exist; create it with the \
             mig-parted config, or point migManager.config.name at the ConfigMap that holds it"
        );
        let reason = look
            .labelled("broken", None)
            .changes
            .unwrap_err()
            .to_string();
        assert!(
            reason.starts_with(
                "ConfigMap gpu-operator/default-mig-parted-config key config.yaml: mig-configs.broken[0].mig-devices: \
                 unknown profile \"1g.5gb\""
            ),
            "{reason}"
        );
        let unknown = look.labelled("nope", None);
        assert!(matches!(unknown.changes, Err(Rejection::DoesNotFit(_))));
        let unreadable = look.at(Some("x"), Some("version: v9"), None, None);
        assert!(matches!(
            unreadable.changes,
            Err(Rejection::Unreadable { .. })
        ));
    }

    #[test]
    fn a_failed_request_waits_until_the_file_changes() {
        let look = Look::new();
        let first = look.labelled("broken", None);
        let again = look.labelled("broken", first.request.as_ref());
        assert_eq!(again.decision, Decision::AlreadyFailed);
        let edited = format!("{}\n", look.file);
        let retried = look.at(Some("broken"), Some(&edited), None, first.request.as_ref());
        assert_eq!(
            retried.decision,
            Decision::Reject,
            "the file changed: tried again"
        );
    }
}
