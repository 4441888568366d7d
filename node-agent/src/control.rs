//! The controller interface: one persistent bidi stream to the hub. It survives
//! the hub: when the stream drops, the dataplane keeps forwarding with the config
//! it has, and the agent reconnects with backoff and applies the fresh snapshot.

use crate::dataplane::{ApplyError, Dataplane};
use hyper_util::rt::TokioIo;
use nextmini_proto::v1 as pb;
use pb::control_client::ControlClient;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint, Uri};

const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_millis(1000);

/// Where the hub listens: a Unix socket (local mode) or an http(s) URL.
#[derive(Debug, Clone)]
pub enum HubAddress {
    Unix(PathBuf),
    Url(String),
}

impl std::str::FromStr for HubAddress {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            let path = path.trim_start_matches("//");
            if path.is_empty() {
                return Err("unix: address needs a socket path".into());
            }
            return Ok(HubAddress::Unix(PathBuf::from(path)));
        }
        if s.starts_with("http://") || s.starts_with("https://") {
            return Ok(HubAddress::Url(s.to_string()));
        }
        Err(format!(
            "{s:?}: expected unix:/path/to/socket or http(s)://host:port"
        ))
    }
}

pub struct Identity {
    pub topology: String,
    pub node: String,
    pub credential: String,
}

async fn connect(hub: &HubAddress) -> Result<Channel, tonic::transport::Error> {
    match hub {
        HubAddress::Url(url) => {
            Endpoint::from_shared(url.clone())?
                .connect_timeout(Duration::from_secs(2))
                .http2_keep_alive_interval(Duration::from_secs(5))
                .keep_alive_timeout(Duration::from_secs(5))
                .connect()
                .await
        }
        HubAddress::Unix(path) => {
            let path = path.clone();
            // The URI is required by the API but unused: the connector picks the socket.
            Endpoint::from_static("http://hub.local")
                .connect_timeout(Duration::from_secs(2))
                .http2_keep_alive_interval(Duration::from_secs(5))
                .keep_alive_timeout(Duration::from_secs(5))
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(TokioIo::new(stream))
                    }
                }))
                .await
        }
    }
}

/// Runs the control loop forever: connect, Hello, apply snapshots, report.
pub async fn run(hub: HubAddress, identity: Identity, mut dataplane: Dataplane) {
    let mut backoff = BACKOFF_MIN;
    let mut sequence = 0u64;
    loop {
        match session(&hub, &identity, &mut dataplane, &mut sequence, &mut backoff).await {
            Ok(()) => tracing::info!("hub closed the stream; reconnecting"),
            Err(e) => tracing::warn!(error = %e, "control stream failed; reconnecting"),
        }
        let jitter = Duration::from_millis(rand::random_range(0..=backoff.as_millis() as u64 / 2));
        tokio::time::sleep(backoff + jitter).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

async fn session(
    hub: &HubAddress,
    identity: &Identity,
    dataplane: &mut Dataplane,
    sequence: &mut u64,
    backoff: &mut Duration,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let channel = connect(hub).await?;
    let mut client = ControlClient::new(channel);
    let (tx, rx) = mpsc::channel::<pb::AgentMessage>(64);
    let hello = pb::Hello {
        topology: identity.topology.clone(),
        node: identity.node.clone(),
        credential: identity.credential.clone(),
        protocol_version: nextmini_proto::PROTOCOL_VERSION,
        capabilities: vec!["tcp".into(), "smoltcp".into()],
        running_generation: dataplane.generation(),
        pid: std::process::id(),
    };
    tx.send(message(pb::agent_message::Msg::Hello(hello)))
        .await?;
    let mut inbound = client.session(ReceiverStream::new(rx)).await?.into_inner();
    // Up for as long as this session runs, however it ends.
    let _stream_up = dataplane.metrics_source().state.stream_up();
    // Flow results the previous session did not see stored go again.
    if let Some(synth) = dataplane.synth() {
        synth.resend_unconfirmed();
    }
    let mut report_every = Duration::from_millis(1000);
    let mut ticker = tokio::time::interval(report_every);
    loop {
        tokio::select! {
            msg = inbound.message() => {
                let Some(msg) = msg? else { return Ok(()) };
                match msg.msg {
                    Some(pb::controller_message::Msg::Snapshot(s)) => {
                        let generation = s.generation;
                        if s.report_interval_ms >= 100 {
                            let every = Duration::from_millis(u64::from(s.report_interval_ms));
                            if every != report_every {
                                report_every = every;
                                ticker = tokio::time::interval(report_every);
                            }
                        }
                        let error = match dataplane.apply_snapshot(s).await {
                            Ok(()) => {
                                tracing::info!(generation, "snapshot applied");
                                *backoff = BACKOFF_MIN;
                                String::new()
                            }
                            Err(e) => {
                                tracing::error!(generation, error = %e, "snapshot rejected");
                                e.to_string()
                            }
                        };
                        tx.send(message(pb::agent_message::Msg::Ack(pb::Ack { generation, error }))).await?;
                    }
                    Some(pb::controller_message::Msg::Delta(d)) => {
                        let generation = d.generation;
                        let error = match dataplane.apply_delta(d) {
                            Ok(()) => {
                                tracing::debug!(generation, "delta applied");
                                String::new()
                            }
                            Err(e @ (ApplyError::OutOfOrder { .. } | ApplyError::NoSnapshot)) => {
                                // Reconnecting brings a fresh snapshot.
                                tracing::warn!(error = %e, "resyncing");
                                return Ok(());
                            }
                            Err(e) => {
                                tracing::error!(generation, error = %e, "delta rejected");
                                e.to_string()
                            }
                        };
                        tx.send(message(pb::agent_message::Msg::Ack(pb::Ack { generation, error }))).await?;
                    }
                    Some(pb::controller_message::Msg::Reject(r)) => {
                        return Err(format!("hub rejected this agent: {}", r.reason).into());
                    }
                    Some(pb::controller_message::Msg::FlowsReady(r)) => {
                        if let Some(synth) = dataplane.synth() {
                            synth.ready(r.generation);
                        }
                    }
                    Some(pb::controller_message::Msg::ResultsStored(r)) => {
                        if let Some(synth) = dataplane.synth() {
                            synth.stored(r.sequence);
                        }
                    }
                    None => {}
                }
            }
            _ = ticker.tick() => {
                *sequence += 1;
                let report = pb::Report {
                    sequence: *sequence,
                    generation: dataplane.generation(),
                    links: dataplane.link_counters(),
                    unix_ms: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_millis() as u64)
                        .unwrap_or(0),
                };
                tx.send(message(pb::agent_message::Msg::Report(report))).await?;
                while let Some(results) = dataplane.synth().and_then(|s| s.next_report()) {
                    tx.send(message(pb::agent_message::Msg::FlowReport(results))).await?;
                }
            }
        }
    }
}

fn message(msg: pb::agent_message::Msg) -> pb::AgentMessage {
    pb::AgentMessage { msg: Some(msg) }
}
