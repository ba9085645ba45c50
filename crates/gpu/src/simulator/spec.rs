//! `MODEL:COUNT[,MODEL:COUNT]`: which GPUs a simulated node has, as the `--simulate` flag and the cluster harness's
//! node annotation (`a100-40gb:4`) write it.

use std::fmt;
use std::str::FromStr;

use crd::mig::{GpuModel, model_by_simulator_name, models};

/// The most GPUs one simulated node may have; real nodes have at most 16, the margin is for tests.
pub const MAX_SIMULATED_GPUS: u32 = 64;

/// The GPUs of a simulated node: models and counts, in the order their indices are given.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SimulatedGpus {
    groups: Vec<(&'static GpuModel, u32)>,
}

impl SimulatedGpus {
    /// The model of every GPU, by index.
    pub fn models(&self) -> impl Iterator<Item = &'static GpuModel> + '_ {
        self.groups
            .iter()
            .flat_map(|(model, count)| std::iter::repeat_n(*model, *count as usize))
    }

    /// Number of GPUs.
    #[must_use]
    pub fn count(&self) -> u32 {
        self.groups.iter().map(|(_, count)| count).sum()
    }
}

/// Why a `--simulate` value is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// Nothing was given.
    #[error("empty GPU spec (expected MODEL:COUNT[,MODEL:COUNT], e.g. a100-40gb:4)")]
    Empty,
    /// A part is not `MODEL:COUNT`.
    #[error("invalid GPU spec part \"{0}\" (expected MODEL:COUNT, e.g. a100-40gb:4)")]
    Malformed(String),
    /// The model is not in the catalog.
    #[error("unknown GPU model \"{model}\" (models: {known})")]
    UnknownModel {
        /// The model as written.
        model: String,
        /// The models the simulator knows.
        known: String,
    },
    /// The count is not a positive number.
    #[error("invalid GPU count \"{0}\" (expected a number from 1 to {MAX_SIMULATED_GPUS})")]
    Count(String),
    /// More GPUs than a node may have.
    #[error("{0} GPUs requested, a simulated node has at most {MAX_SIMULATED_GPUS}")]
    TooMany(u32),
}

impl FromStr for SimulatedGpus {
    type Err = SpecError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.trim().is_empty() {
            return Err(SpecError::Empty);
        }
        let groups = text
            .split(',')
            .map(|part| {
                let (model, count) = part
                    .trim()
                    .split_once(':')
                    .ok_or_else(|| SpecError::Malformed(part.trim().to_owned()))?;
                let model = model_by_simulator_name(model.trim()).ok_or_else(|| {
                    SpecError::UnknownModel {
                        model: model.trim().to_owned(),
                        known: models()
                            .iter()
                            .map(|model| model.simulator_name)
                            .collect::<Vec<_>>()
                            .join(", "),
                    }
                })?;
                let count: u32 = count
                    .trim()
                    .parse()
                    .ok()
                    .filter(|count| (1..=MAX_SIMULATED_GPUS).contains(count))
                    .ok_or_else(|| SpecError::Count(count.trim().to_owned()))?;
                Ok((model, count))
            })
            .collect::<Result<Vec<_>, SpecError>>()?;
        let spec = Self { groups };
        if spec.count() > MAX_SIMULATED_GPUS {
            return Err(SpecError::TooMany(spec.count()));
        }
        Ok(spec)
    }
}

/// The canonical form, `a100-40gb:4,h100-80gb:2`; parsing it gives the same value back.
impl fmt::Display for SimulatedGpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (position, (model, count)) in self.groups.iter().enumerate() {
            if position > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}:{count}", model.simulator_name)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SimulatedGpus, String> {
        text.parse::<SimulatedGpus>()
            .map_err(|error| error.to_string())
    }

    #[test]
    fn annotation_format_parses() {
        let spec = parse("a100-40gb:4").unwrap();
        assert_eq!(spec.count(), 4);
        assert!(
            spec.models()
                .all(|model| model.simulator_name == "a100-40gb")
        );
        assert_eq!(spec.to_string(), "a100-40gb:4");
    }

    #[test]
    fn several_models_keep_their_order() {
        let spec = parse(" h100-80gb:1 , a30:2").unwrap();
        let names: Vec<&str> = spec.models().map(|model| model.simulator_name).collect();
        assert_eq!(names, ["h100-80gb", "a30", "a30"]);
        assert_eq!(spec.to_string(), "h100-80gb:1,a30:2");
        assert_eq!(parse(&spec.to_string()).unwrap(), spec);
    }

    #[test]
    fn errors_name_the_problem() {
        assert_eq!(
            parse("").unwrap_err(),
            "empty GPU spec (expected MODEL:COUNT[,MODEL:COUNT], e.g. a100-40gb:4)"
        );
        assert_eq!(
            parse("a100-40gb").unwrap_err(),
            "invalid GPU spec part \"a100-40gb\" (expected MODEL:COUNT, e.g. a100-40gb:4)"
        );
        assert_eq!(
            parse("v100:2").unwrap_err(),
            "unknown GPU model \"v100\" (models: a100-40gb, a100-80gb, pg506-96gb, a30, h100-80gb, h100-94gb, \
             h100-96gb, h20, h200, gh200-144gb, b200, gb200, b300, gb300, rtx-pro-6000)"
        );
        assert_eq!(
            parse("a30:0").unwrap_err(),
            "invalid GPU count \"0\" (expected a number from 1 to 64)"
        );
        assert_eq!(
            parse("a30:x").unwrap_err(),
            "invalid GPU count \"x\" (expected a number from 1 to 64)"
        );
        assert_eq!(
            parse("a30:40,h200:40").unwrap_err(),
            "80 GPUs requested, a simulated node has at most 64"
        );
    }
}
