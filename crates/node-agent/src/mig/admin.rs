//! `gpu-node-agent mig plan|apply|assert -f CONFIG.yaml -c NAME`: the MIG manager's logic for an admin on a
//! node, without Kubernetes (except to read the simulator annotation with `--simulate node`).

use std::fmt::Write as _;

use anyhow::{Context, bail};
use crd::config::mig_parted;
use node_runtime::backend::{GpuSource, Gpus};
use node_runtime::inventory::{self, GpuView};

use super::assess::{GpuChange, assess};
use super::gpus::{Target, change, verify};
use crate::cli::MigAction;

/// Runs an admin action.
///
/// # Errors
/// An unreadable or invalid config, a geometry that cannot be applied, GPUs that differ (`assert`).
pub async fn run(action: MigAction, source: &GpuSource) -> anyhow::Result<()> {
    let (MigAction::Plan(file) | MigAction::Apply(file) | MigAction::Assert(file)) = &action;
    let text = std::fs::read_to_string(&file.file)
        .with_context(|| format!("reading {}", file.file.display()))?;
    let parsed = mig_parted::parse(&text).with_context(|| format!("{}", file.file.display()))?;
    let gpus = Gpus::open_reading_node(source, file.node_name.as_deref()).await?;
    let views = gpus.run(|gpus| inventory::read(gpus.backend())).await?;
    let changes = assess(&parsed, &file.config, &views)
        .with_context(|| format!("{}", file.file.display()))?;
    let all: Vec<Target> = changes.iter().map(Target::from).collect();
    match action {
        MigAction::Plan(_) => print!("{}", describe(&views, &changes)),
        MigAction::Apply(_) => {
            let targets: Vec<Target> = changes
                .iter()
                .filter(|change| !change.is_noop())
                .map(Target::from)
                .collect();
            gpus.run(move |gpus| change(gpus.backend(), &targets, false))
                .await?;
            let mismatches = gpus
                .run(move |gpus| Ok::<_, gpu::GpuError>(verify(gpus.backend(), &all)))
                .await?;
            if !mismatches.is_empty() {
                bail!("applied, but the GPUs differ: {}", joined(&mismatches));
            }
            println!("MIG config {} applied", file.config);
        }
        MigAction::Assert(_) => {
            let mismatches = gpus
                .run(move |gpus| Ok::<_, gpu::GpuError>(verify(gpus.backend(), &all)))
                .await?;
            if !mismatches.is_empty() {
                bail!(
                    "the GPUs do not match MIG config {}:\n{}",
                    file.config,
                    joined(&mismatches)
                );
            }
            println!("the GPUs match MIG config {}", file.config);
        }
    }
    Ok(())
}

fn joined(items: &[impl ToString]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The geometry each GPU would get, and what it takes, one line per GPU.
#[must_use]
pub fn describe(views: &[GpuView], changes: &[GpuChange]) -> String {
    let mut text = String::new();
    for view in views {
        let index = view.inventory.index;
        let _ = write!(text, "GPU {index} ({}): ", view.inventory.product_name);
        let Some(change) = changes.iter().find(|change| change.gpu == index) else {
            text.push_str("not in this config, left as it is\n");
            continue;
        };
        let geometry = change.desired_geometry();
        if geometry.mig_enabled {
            let devices: Vec<String> = geometry
                .devices
                .iter()
                .map(|(name, count)| format!("{name} x{count}"))
                .collect();
            let _ = write!(text, "MIG on [{}]", devices.join(", "));
        } else {
            text.push_str("MIG off");
        }
        if change.is_noop() {
            text.push_str(" (already so)\n");
            continue;
        }
        let mut steps = Vec::new();
        if let Some(enabled) = change.mode.set_mode {
            steps.push(format!("set MIG {}", if enabled { "on" } else { "off" }));
        }
        if change.mode.reset {
            steps.push("reset".to_owned());
        }
        if let Some(plan) = &change.plan {
            steps.push(format!(
                "keep {}, destroy {}, create {}",
                plan.keep.len(),
                plan.destroy.len(),
                plan.create.len()
            ));
        }
        let _ = writeln!(text, ": {}", steps.join(", "));
    }
    text
}

#[cfg(test)]
mod tests {
    use node_runtime::inventory::read;
    use node_runtime::testing::simulated;

    use super::*;

    #[test]
    fn plan_describes_every_gpu() {
        let (_dir, simulator) = simulated("a100-80gb:2", &[("1g.10gb", 7)]);
        let config = mig_parted::parse(
            r#"
version: v1
mig-configs:
  first:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.40gb": 2}
"#,
        )
        .unwrap();
        let views = read(simulator.as_ref()).unwrap();
        let changes = assess(&config, "first", &views).unwrap();
        assert_eq!(
            describe(&views, &changes),
            "GPU 0 (NVIDIA A100-SXM4-80GB): MIG on [3g.40gb x2]: keep 0, destroy 7, create 2\n\
             GPU 1 (NVIDIA A100-SXM4-80GB): not in this config, left as it is\n"
        );
    }
}
