//! `nextmini-operator`: the in-cluster control plane. It runs the Topology
//! controller, the control hub that agent pods dial (TCP, behind the hub
//! Service), and an HTTP endpoint with Prometheus metrics and health probes.

use anyhow::Context;
use clap::Parser;
use nextmini_operator::controller::{self, Settings};
use nextmini_operator::hub::Hub;
use nextmini_operator::observe::HubMetrics;
use nextmini_operator::observe::http::{self, Get, Handler, Reply};
use nextmini_operator::store::Store;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Nextmini operator: reconciles Topology, Link and Flow objects into agent pods"
)]
struct Args {
    /// PostgreSQL holding the desired state, routes and metrics.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// Where the control hub listens for agents.
    #[arg(long, env = "NEXTMINI_HUB_LISTEN", default_value = "0.0.0.0:50051")]
    hub_listen: SocketAddr,
    /// What agent pods dial to reach the hub (the hub Service), `https://host:port`:
    /// the control stream is always mTLS.
    #[arg(long, env = "NEXTMINI_HUB_ADDRESS", value_parser = https_address)]
    hub_address: String,
    /// Image of the agent pods.
    #[arg(long, env = "NEXTMINI_AGENT_IMAGE")]
    agent_image: String,
    #[arg(long, env = "NEXTMINI_AGENT_IMAGE_PULL_POLICY", default_value = "IfNotPresent",
          value_parser = ["Always", "IfNotPresent", "Never"])]
    agent_image_pull_policy: String,
    /// RUST_LOG of the agents.
    #[arg(long, env = "NEXTMINI_AGENT_LOG", default_value = "info")]
    agent_log: String,
    /// Prometheus metrics on /metrics, probes on /healthz and /readyz.
    #[arg(long, env = "NEXTMINI_METRICS_LISTEN", default_value = "0.0.0.0:9464")]
    metrics_listen: SocketAddr,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "NEXTMINI_WATCH_NAMESPACE")]
    namespace: Option<String>,
}

fn https_address(s: &str) -> Result<String, String> {
    let rest = s
        .strip_prefix("https://")
        .ok_or("must be https://host:port (the control stream is mTLS)")?;
    if rest.trim_end_matches('/').rsplit_once(':').is_none() {
        return Err("must name a port: https://host:port".into());
    }
    Ok(s.to_string())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let ready = Arc::new(AtomicBool::new(false));
    let metrics_listener = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("binding the metrics endpoint {}", args.metrics_listen))?;
    let store = connect(&args.database_url).await?;
    let hub = Hub::new(store.clone());
    let endpoint = Arc::new(Endpoint {
        metrics: hub.metrics(),
        ready: ready.clone(),
    });
    tokio::spawn(http::serve(
        metrics_listener,
        endpoint,
        std::future::pending(),
    ));
    let hub_task =
        tokio::spawn(hub.serve_tcp(args.hub_listen, nextmini_operator::shutdown::signal()));
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster config or KUBECONFIG)")?;
    let settings = Settings {
        hub_address: args.hub_address,
        agent_image: args.agent_image,
        agent_image_pull_policy: args.agent_image_pull_policy,
        agent_log: args.agent_log,
    };
    ready.store(true, Ordering::Relaxed);
    // An empty value (a chart leaving the variable blank) means all namespaces.
    let namespace = args.namespace.filter(|ns| !ns.is_empty());
    tracing::info!(namespace = ?namespace, "operator started");
    controller::run(client, store, settings, namespace).await;
    hub_task.abort();
    tracing::info!("operator stopped");
    Ok(())
}

/// Connects to PostgreSQL, waiting for it (in a fresh install the database
/// pod starts beside the operator) and saying so.
async fn connect(url: &str) -> anyhow::Result<Store> {
    let started = Instant::now();
    loop {
        match Store::connect(url).await {
            Ok(store) => return Ok(store),
            Err(e) if started.elapsed() < Duration::from_secs(300) => {
                tracing::info!(error = %e, waited = ?started.elapsed(), "waiting for PostgreSQL");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(e) => return Err(e).context("connecting to PostgreSQL (DATABASE_URL)"),
        }
    }
}

struct Endpoint {
    metrics: Arc<HubMetrics>,
    ready: Arc<AtomicBool>,
}

impl Handler for Endpoint {
    async fn get(&self, request: Get<'_>) -> Reply {
        match request.path {
            "/metrics" => match self.metrics.encode() {
                Ok(text) => Reply::ok(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    text,
                ),
                Err(e) => Reply::error(e.to_string()),
            },
            "/healthz" => Reply::ok("text/plain", "ok\n".into()),
            "/readyz" if self.ready.load(Ordering::Relaxed) => {
                Reply::ok("text/plain", "ready\n".into())
            }
            "/readyz" => Reply {
                status: 503,
                content_type: "text/plain",
                body: "starting\n".into(),
            },
            _ => Reply::not_found("not found\n"),
        }
    }
}
