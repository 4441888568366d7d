//! `nextmini worker`: the process of a packed worker pod (the operator makes
//! the pods and passes the arguments; see `runtime::worker`).

use anyhow::Context;
use clap::Args;
use nextmini_operator::runtime::packed;
use nextmini_operator::runtime::worker::{self, WorkerConfig};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// What the agents dial to reach the hub (the hub Service).
    #[arg(long, env = "NEXTMINI_HUB")]
    hub: String,
    #[arg(long, env = "NEXTMINI_TOPOLOGY")]
    topology: String,
    /// Directory with one credential file per node, named after the node.
    #[arg(long, default_value = "/var/run/nextmini")]
    credential_dir: PathBuf,
    /// The nodes this worker runs, as JSON:
    /// `[{"name":"a","cpuMillis":500,"memoryBytes":67108864,"socks":["0.0.0.0:1080"]}]`.
    #[arg(long, env = "NEXTMINI_WORKER_NODES")]
    nodes: String,
    /// The agent binary (default: `nextmini-agent` next to this binary, or
    /// $NEXTMINI_AGENT_BIN).
    #[arg(long)]
    agent_binary: Option<PathBuf>,
    /// Files in /etc/hosts format (the topology's hosts ConfigMaps); their
    /// concatenation is every node's /etc/hosts, kept current.
    #[arg(long)]
    hosts_dir: Option<PathBuf>,
}

/// `state_dir`: the command's `--state-dir`, where agents' sockets go.
pub async fn run(args: WorkerArgs, state_dir: PathBuf) -> anyhow::Result<i32> {
    let nodes = packed::parse_nodes(&args.nodes).map_err(anyhow::Error::msg)?;
    let agent_binary = match args.agent_binary {
        Some(p) => p,
        None => crate::local::agent_binary()?,
    };
    let config = WorkerConfig {
        topology: args.topology,
        hub: args.hub,
        credential_dir: args.credential_dir,
        agent_binary,
        nodes,
        hosts_dir: args.hosts_dir,
        state_dir,
    };
    worker::run(config, nextmini_operator::shutdown::signal())
        .await
        .context("worker")?;
    Ok(0)
}
