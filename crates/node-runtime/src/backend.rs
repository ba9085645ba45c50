//! Which GPUs the agent works on: the real ones through NVML, or the simulator (`--simulate MODEL:COUNT` or
//! `--simulate node` with `--sim-state FILE`). `--simulate node` reads the model spec from the Node's
//! `nvidia.com/gpu.simulator` annotation, so that one command line serves every simulated node of a cluster.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};

use clap::Args;
use crd::labels::SIMULATED_GPUS_ANNOTATION;
use gpu::simulator::SpecError;
use gpu::{GpuBackend, GpuError, SimulatedGpus, Simulator};

use crate::kube_io::{self, NodeApi};

/// `--simulate` and `--sim-state`, accepted by every role.
#[derive(Debug, Clone, Default, Args)]
pub struct GpuSource {
    /// Run on simulated GPUs: `MODEL:COUNT[,MODEL:COUNT]`, or `node` for the spec in the Node's
    /// `nvidia.com/gpu.simulator` annotation.
    #[arg(long, global = true, env = "GPU_SIMULATE")]
    pub simulate: Option<Simulate>,
    /// The simulated node's state file, shared with the other processes of the node.
    #[arg(long, global = true, env = "GPU_SIM_STATE")]
    pub sim_state: Option<PathBuf>,
}

/// The value of `--simulate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Simulate {
    /// The spec in the Node's annotation.
    Node,
    /// This spec.
    Gpus(SimulatedGpus),
}

impl FromStr for Simulate {
    type Err = SpecError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text == "node" {
            Ok(Self::Node)
        } else {
            text.parse().map(Self::Gpus)
        }
    }
}

/// Why the GPUs cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// `--simulate` without a state file.
    #[error(
        "--simulate needs --sim-state FILE (the simulated node's state, shared by its processes)"
    )]
    NoStateFile,
    /// `--simulate node` on a Node without the annotation.
    #[error(
        "--simulate node: node {node} has no nvidia.com/gpu.simulator annotation (e.g. a100-40gb:4)"
    )]
    NoAnnotation {
        /// The node.
        node: String,
    },
    /// `--simulate node` without a node name.
    #[error("--simulate node needs the node name (--node-name or NODE_NAME)")]
    NoNodeName,
    /// The annotation is not a valid spec.
    #[error("node {node}: nvidia.com/gpu.simulator annotation: {source}")]
    BadAnnotation {
        /// The node.
        node: String,
        /// Why.
        source: SpecError,
    },
    /// The backend failed to open (no driver, or a simulator state file that belongs to another node).
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

/// The node's GPUs, with what only the simulator can do (a simulated reboot).
#[derive(Debug, Clone)]
pub struct Gpus {
    backend: Arc<dyn GpuBackend>,
    simulator: Option<Arc<Simulator>>,
}

impl Gpus {
    /// Opens the GPUs `source` names. `node` is this node's name and `annotation` its `nvidia.com/gpu.simulator`
    /// annotation, needed only for `--simulate node`.
    ///
    /// # Errors
    /// A [`BackendError`] saying what is missing, including `LibraryNotFound` on a machine without NVML.
    pub fn open(
        source: &GpuSource,
        node: Option<&str>,
        annotation: Option<&str>,
    ) -> Result<Self, BackendError> {
        let Some(simulate) = &source.simulate else {
            return Ok(Self::from_backend(Arc::new(gpu::nvml::NvmlBackend::new()?)));
        };
        let state = source.sim_state.as_ref().ok_or(BackendError::NoStateFile)?;
        let spec = match simulate {
            Simulate::Gpus(spec) => spec.clone(),
            Simulate::Node => {
                let node = node.ok_or(BackendError::NoNodeName)?;
                annotation
                    .ok_or_else(|| BackendError::NoAnnotation { node: node.into() })?
                    .parse()
                    .map_err(|source| BackendError::BadAnnotation {
                        node: node.into(),
                        source,
                    })?
            }
        };
        let simulator = Arc::new(Simulator::open(state, node.unwrap_or("local"), &spec)?);
        Ok(Self {
            backend: simulator.clone(),
            simulator: Some(simulator),
        })
    }

    /// As [`Gpus::open`], reading the annotation from the cluster when `--simulate node` needs it (the tools that
    /// otherwise run without Kubernetes: `mig plan|apply|assert`, `validate`, `simulator`).
    ///
    /// # Errors
    /// As [`Gpus::open`], and when the Node cannot be read.
    pub async fn open_reading_node(source: &GpuSource, node: Option<&str>) -> anyhow::Result<Self> {
        // A node's simulated hardware does not change while a process runs: its annotation, once found, is kept, so
        // that a role reopening its GPUs (the validator's checks) costs the API server nothing, as with NVML.
        static FOUND: Mutex<Option<(String, String)>> = Mutex::new(None);
        let annotation = match (&source.simulate, node) {
            (Some(Simulate::Node), Some(name)) => {
                let found = FOUND.lock().unwrap_or_else(PoisonError::into_inner).clone();
                match found.filter(|(found_for, _)| found_for == name) {
                    Some((_, annotation)) => Some(annotation),
                    None => {
                        let node = NodeApi::new(kube_io::client().await?, name).get().await?;
                        let annotation = kube_io::annotation(&node, SIMULATED_GPUS_ANNOTATION)
                            .map(str::to_owned);
                        if let Some(annotation) = &annotation {
                            *FOUND.lock().unwrap_or_else(PoisonError::into_inner) =
                                Some((name.to_owned(), annotation.clone()));
                        }
                        annotation
                    }
                }
            }
            _ => None,
        };
        Ok(Self::open(source, node, annotation.as_deref())?)
    }

    /// Wraps any backend (tests use a simulator opened by hand).
    #[must_use]
    pub fn from_backend(backend: Arc<dyn GpuBackend>) -> Self {
        Self {
            backend,
            simulator: None,
        }
    }

    /// A simulator opened by hand, with simulated reboots.
    #[must_use]
    pub fn from_simulator(simulator: Arc<Simulator>) -> Self {
        Self {
            backend: simulator.clone(),
            simulator: Some(simulator),
        }
    }

    /// The backend every GPU call goes through.
    #[must_use]
    pub fn backend(&self) -> &dyn GpuBackend {
        self.backend.as_ref()
    }

    /// The simulator, when running on one.
    #[must_use]
    pub fn simulator(&self) -> Option<&Simulator> {
        self.simulator.as_deref()
    }

    /// Runs blocking GPU work off the async runtime: NVML calls block, and simulator faults sleep.
    ///
    /// # Errors
    /// Whatever `work` returns; a panic in `work` becomes `GpuError::Other`.
    pub async fn run<T: Send + 'static, E: From<GpuError> + Send + 'static>(
        &self,
        work: impl FnOnce(&Gpus) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E> {
        let gpus = self.clone();
        tokio::task::spawn_blocking(move || work(&gpus))
            .await
            .unwrap_or_else(
                |error| Err(GpuError::Other(format!("GPU task failed: {error}")).into()),
            )
    }

    /// The XID events queued since the last call; a failing queue is logged and reads as none.
    pub async fn health_events(&self) -> Vec<gpu::HealthEvent> {
        self.run(|gpus| gpus.backend().health_events())
            .await
            .unwrap_or_else(|error| {
                tracing::warn!(%error, "cannot read health events");
                Vec::new()
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(simulate: &str, state: Option<PathBuf>) -> GpuSource {
        GpuSource {
            simulate: Some(simulate.parse().unwrap()),
            sim_state: state,
        }
    }

    #[test]
    fn node_spec_comes_from_the_annotation() {
        let dir = tempfile::tempdir().unwrap();
        let state = Some(dir.path().join("n.json"));
        let gpus = Gpus::open(
            &source("node", state.clone()),
            Some("n"),
            Some("a100-80gb:2"),
        )
        .unwrap();
        assert_eq!(gpus.backend().gpu_count().unwrap(), 2);
        assert!(gpus.simulator().is_some());
        let missing = Gpus::open(&source("node", state), Some("n"), None).unwrap_err();
        assert_eq!(
            missing.to_string(),
            "--simulate node: node n has no nvidia.com/gpu.simulator annotation (e.g. a100-40gb:4)"
        );
    }

    #[test]
    fn simulate_needs_a_state_file() {
        let error = Gpus::open(&source("a30:1", None), None, None).unwrap_err();
        assert!(matches!(error, BackendError::NoStateFile));
    }

    #[test]
    fn without_nvml_the_error_says_so() {
        // The development machines have no driver: opening NVML must fail cleanly, not crash.
        if let Err(error) = Gpus::open(&GpuSource::default(), None, None) {
            assert!(
                matches!(error, BackendError::Gpu(GpuError::LibraryNotFound(_))),
                "{error}"
            );
        }
    }
}
