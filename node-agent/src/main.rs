//! `nextmini-agent`: the node agent of one virtual node.

use anyhow::Context;
use clap::Parser;
use nextmini_agent::control::{self, HubAddress, Identity, TlsFiles};
use nextmini_agent::dataplane::Dataplane;
use nextmini_agent::node_side::NodeSide;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Nextmini node agent: the user-space dataplane of one virtual node"
)]
struct Args {
    /// Network namespace (a name under /run/netns) to enter before starting.
    #[arg(long, conflicts_with = "tun_netns")]
    netns: Option<String>,
    /// Packed pods: make the TUN device in this namespace (a name under
    /// /run/netns) and connect to the node's applications from it, while the
    /// control stream, the links and the max-mode relay stay in the namespace
    /// the agent was started in, where the hub and the peers' pods are.
    #[arg(long, value_name = "NETNS")]
    tun_netns: Option<String>,
    /// Control hub: unix:/path/to/hub.sock or https://host:port (always TLS).
    #[arg(long, env = "NEXTMINI_HUB")]
    hub: HubAddress,
    #[arg(long, env = "NEXTMINI_TOPOLOGY")]
    topology: String,
    #[arg(long, env = "NEXTMINI_NODE")]
    node: String,
    /// File holding this node's credential token (issued by the operator).
    #[arg(long, env = "NEXTMINI_CREDENTIAL_FILE")]
    credential_file: PathBuf,
    /// This node's client certificate (PEM) for the control stream's mTLS
    /// [default: the credential file's path + `.crt`].
    #[arg(long, env = "NEXTMINI_CERT_FILE")]
    cert_file: Option<PathBuf>,
    /// Its private key (PEM) [default: the credential file's path + `.key`].
    #[arg(long, env = "NEXTMINI_KEY_FILE")]
    key_file: Option<PathBuf>,
    /// The control CA's certificate (PEM), the only one the agent trusts for
    /// the hub [default: `ca.crt` beside the credential file].
    #[arg(long, env = "NEXTMINI_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// Name of the TUN device to create.
    #[arg(long, default_value = "nm0")]
    tun: String,
    /// Worker threads of the async runtime.
    #[arg(long, env = "NEXTMINI_AGENT_THREADS", default_value_t = 2)]
    threads: usize,
    /// Serve Prometheus metrics on /metrics over HTTP on this Unix socket (mode 0600).
    #[arg(long, env = "NEXTMINI_METRICS_SOCKET")]
    metrics_socket: Option<PathBuf>,
    /// Listen for SOCKS5 clients on this address (repeatable). Bound before the
    /// agent enters --netns, so it is an address of the namespace the agent was
    /// started in (the host's, in local mode); the snapshot gives its settings.
    #[arg(long, value_name = "IP:PORT")]
    socks_listen: Vec<std::net::SocketAddr>,
    /// Ask the kernel for TUN offloads (super-packets with virtio-net headers);
    /// false moves packets one by one, as a baseline to compare with.
    #[arg(long, env = "NEXTMINI_TUN_OFFLOAD", default_value_t = true, action = clap::ArgAction::Set)]
    tun_offload: bool,
}

fn main() -> anyhow::Result<()> {
    nextmini_agent::alloc::keep_freed_memory();
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    // Outside the node's namespace: where SOCKS clients are.
    let socks = args
        .socks_listen
        .iter()
        .map(|addr| {
            let listener = std::net::TcpListener::bind(addr)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .with_context(|| {
                    format!("SOCKS listener {addr}: cannot listen (another topology or program holds it?)")
                })?;
            Ok((*addr, listener))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Before the runtime starts any thread: threads inherit the namespace.
    if let Some(ns) = &args.netns {
        nextmini_agent::netns::enter(ns)
            .with_context(|| format!("entering network namespace {ns}"))?;
    }
    let node_side = match &args.tun_netns {
        Some(ns) => NodeSide::enter(ns)
            .with_context(|| format!("entering network namespace {ns} on the node-side thread"))?,
        None => NodeSide::here(),
    };
    let credential = std::fs::read_to_string(&args.credential_file)
        .with_context(|| format!("reading {}", args.credential_file.display()))?
        .trim()
        .to_string();
    let tls = TlsFiles::beside(
        &args.credential_file,
        args.cert_file.clone(),
        args.key_file.clone(),
        args.ca_file.clone(),
    );
    // Checked now so a missing or broken file is an error at start; read again
    // at every connect, so rotated files are picked up without a restart.
    tls.client_config()
        .with_context(|| format!("control-stream TLS files ({tls})"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let dataplane = Dataplane::new(args.topology.clone(), args.node.clone(), args.tun.clone())
            .with_node_side(node_side)
            .with_socks_listeners(socks)
            .with_tun_offload(args.tun_offload);
        if let Some(path) = args.metrics_socket {
            let source = dataplane.metrics_source();
            let endpoints = nextmini_agent::metrics::Endpoints {
                links: source.links.clone(),
                registry: std::sync::Arc::new(nextmini_agent::metrics::registry(
                    &args.topology,
                    &args.node,
                    source,
                )),
                node: args.node.clone(),
            };
            // Dropped with the runtime when the agent stops, which removes the socket.
            tokio::spawn(async move {
                if let Err(e) = nextmini_agent::metrics::serve(path, endpoints).await {
                    tracing::warn!(error = %e, "metrics endpoint failed; the dataplane keeps running");
                }
            });
        }
        let identity = Identity {
            topology: args.topology,
            node: args.node,
            credential,
            tls,
        };
        // The control loop runs as a task on the workers, not in `block_on` on
        // the main thread: each report tick would otherwise wake the main
        // thread from a worker (a futex and an eventfd write per tick), which
        // across thousands of idle agents on a machine is real CPU.
        let control = tokio::spawn(control::run(args.hub, identity, dataplane));
        tokio::select! {
            _ = control => {}
            _ = shutdown_signal() => tracing::info!("stopping"),
        }
    });
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
