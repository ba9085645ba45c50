//! `cargo xtask cluster <command>`: the command line of the harness's local cluster.

use harness::cluster::{self, AddNodes, AddRealNode};

/// `cargo xtask cluster <command>`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Build the tools if needed, then start the cluster (a no-op when it already runs).
    Up,
    /// Stop the cluster's processes and remove its state.
    Down,
    /// Print `export` lines for KUBECONFIG and PATH: `eval "$(cargo xtask cluster env)"`.
    Env,
    /// Add simulated GPU nodes (managed by kwok).
    AddNodes(AddNodes),
    /// Stop a control-plane component (etcd, kube-apiserver, ...), keep it down a while, and start it again with
    /// the same arguments; returns once it serves again.
    Restart {
        /// The component, as `cluster up` names it (etcd, kube-apiserver, kube-controller-manager,
        /// kube-scheduler, kwok).
        component: String,
        /// Seconds to keep it down.
        #[arg(long, default_value_t = 0)]
        down_for: u64,
    },
    /// Add a node that runs pods as real containers: containerd (installed with apt-get if missing), the images
    /// of `cargo xtask images`, the kubelet and kube-proxy. Only one per machine; `cluster down` removes it.
    AddRealNode(AddRealNode),
}

/// Runs one `cargo xtask cluster` command.
pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Up => {
            let info = cluster::ensure_up()?;
            println!("cluster is up at {}", info.apiserver_url);
            println!("  kubeconfig: {}", info.kubeconfig.display());
            println!("  binaries:   {}", info.bin_dir.display());
            println!("  logs:       {}", info.state_dir.join("logs").display());
            println!("use it with: eval \"$(cargo xtask cluster env)\"");
            Ok(())
        }
        Command::Down => cluster::down(),
        Command::Env => {
            print!("{}", cluster::shell_env()?);
            Ok(())
        }
        Command::AddNodes(request) => {
            let names = cluster::add_nodes(&request)?;
            println!("added {} node(s): {}", names.len(), names.join(", "));
            Ok(())
        }
        Command::Restart {
            component,
            down_for,
        } => {
            let pid = cluster::restart(&component, std::time::Duration::from_secs(down_for))?;
            println!("{component} serves again (pid {pid})");
            Ok(())
        }
        Command::AddRealNode(request) => {
            let node = cluster::add_real_node(&request)?;
            println!(
                "added the real node {} (kubelet root {})",
                node.node,
                node.kubelet_root.display()
            );
            Ok(())
        }
    }
}
