//! `nextmini`: the command line. `up -f` runs the whole control plane locally
//! (plan, private PostgreSQL, hub, namespace runtime) with no Kubernetes.

mod capture;
mod graph;
mod local;
mod observe;
mod record;
mod results;
mod status;
mod tools;
mod top;
mod up;
mod worker;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Nextmini: emulate a network of real applications, on a laptop or a cluster"
)]
struct Cli {
    #[command(flatten)]
    local: local::LocalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate, plan and start the topologies in a manifest (local namespace mode).
    Up(up::UpArgs),
    /// Remove topologies and everything they made; with no name, all of them,
    /// the hub and the private PostgreSQL.
    Down {
        /// Topologies to remove (default: every topology of this state directory).
        topologies: Vec<String>,
        /// Also sweep everything any Nextmini run left on this machine (agents,
        /// namespaces, interfaces), whether or not the database knows it.
        #[arg(long)]
        all: bool,
    },
    /// Show topologies, nodes, agent streams and per-link traffic.
    Status(status::StatusArgs),
    /// Show what synthetic flows achieved: per flow the instances done and
    /// failed and the p50/p99 completion time; export every instance as CSV,
    /// plot completion time against size and throughput over time.
    Results(results::ResultsArgs),
    /// Capture one direction of a link as pcapng, each packet annotated with
    /// its enqueue and departure times, queue depth and verdict (sent,
    /// dropped and by what, ECN-marked).
    Capture(capture::CaptureArgs),
    /// Run a command inside a virtual node (its network namespace, where node
    /// names resolve to overlay addresses).
    Exec {
        node: String,
        /// Topology of the node (needed only when several are running; a
        /// packed worker pod sets NEXTMINI_TOPOLOGY).
        #[arg(short, long, env = "NEXTMINI_TOPOLOGY")]
        topology: Option<String>,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Validate and plan a manifest without starting anything; print the plan.
    Plan {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
    /// Write the CRDs (Topology, Link, Flow) to crds/nextmini.yaml.
    Crd {
        #[arg(long, default_value = "crds")]
        dir: PathBuf,
    },
    /// Run the control hub in the foreground (`up` starts one in the background).
    Hub {
        /// Start it in the background unless it runs already, then return.
        #[arg(long)]
        background: bool,
    },
    /// Manage the private PostgreSQL of local mode.
    Db {
        #[command(subcommand)]
        action: DbAction,
    },
    /// Run a packed worker pod's share of nodes: a network namespace and an
    /// agent per node, restarted when it dies (the operator starts this in
    /// each worker pod).
    Worker(worker::WorkerArgs),
    #[command(flatten)]
    Tools(tools::Tools),
}

#[derive(Subcommand, Debug)]
enum DbAction {
    /// Start it (initialising it the first time) and create the schema.
    Start,
    /// Stop it; the data stays in the state directory.
    Stop,
    /// Print its connection URL (for psql, psycopg or your own tools).
    Url,
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    // Before any child starts: the hub it may spawn holds a descriptor per agent.
    nextmini_operator::runtime::limits::raise_open_files();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    let local = local::Local::new(cli.local)?;
    match cli.command {
        Command::Crd { dir } => {
            let path = nextmini_operator::crdgen::write_crds(&dir)?;
            println!("wrote {}", path.display());
            Ok(0)
        }
        Command::Plan { file } => up::print_plan(&file),
        Command::Exec {
            node,
            topology,
            command,
        } => local.exec(topology.as_deref(), &node, &command),
        Command::Tools(tool) => tools::run(&local, tool),
        command => {
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(async move {
                match command {
                    Command::Up(args) => {
                        let started = std::time::Instant::now();
                        let outcome = up::up(&local, args).await;
                        observe::record_reconcile(&local, &outcome, started.elapsed()).await;
                        outcome
                    }
                    Command::Down { topologies, all } => {
                        local.down(&topologies, all).await.map(|()| 0)
                    }
                    Command::Status(args) => status::status(&local, args).await,
                    Command::Worker(args) => worker::run(args, local.state_dir.clone()).await,
                    Command::Results(args) => results::results(&local, args).await,
                    Command::Capture(args) => capture::capture(&local, args).await,
                    Command::Hub { background: false } => local.run_hub().await.map(|()| 0),
                    Command::Hub { background: true } => local.ensure_hub().map(|()| 0),
                    Command::Db { action } => local
                        .db(match action {
                            DbAction::Start => local::DbAction::Start,
                            DbAction::Stop => local::DbAction::Stop,
                            DbAction::Url => local::DbAction::Url,
                        })
                        .await
                        .map(|()| 0),
                    Command::Crd { .. }
                    | Command::Plan { .. }
                    | Command::Exec { .. }
                    | Command::Tools(_) => Ok(0),
                }
            })
        }
    }
}
