//! The controller interface: one persistent bidi stream to the hub. It survives
//! the hub: when the stream drops, the dataplane keeps forwarding with the config
//! it has, and the agent reconnects with backoff and applies the fresh snapshot.

use crate::dataplane::{ApplyError, Dataplane};
use hyper_util::rt::TokioIo;
use nextmini_proto::error_chain::error_chain;
use nextmini_proto::tls::{HUB_SERVER_NAME, TlsError, client_config};
use nextmini_proto::v1 as pb;
use pb::control_client::ControlClient;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint, Uri};

const BACKOFF_MIN: Duration = Duration::from_millis(50);
/// At 10,000 agents on one machine a mass reconnect at a 1 s ceiling was
/// 7,000 TLS handshakes a second at the hub, whose listen queue overflowed
/// (EAGAIN), which kept the storm going; 5 s spreads it out.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Where the hub listens: a Unix socket (local mode) or `host:port` (a
/// Service in a cluster). Both carry TLS.
#[derive(Debug, Clone)]
pub enum HubAddress {
    Unix(PathBuf),
    Tcp(String),
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
        if let Some(rest) = s.strip_prefix("https://") {
            let authority = rest.trim_end_matches('/');
            if authority.is_empty() || authority.contains('/') || !authority.contains(':') {
                return Err(format!("{s:?}: expected https://host:port"));
            }
            return Ok(HubAddress::Tcp(authority.to_string()));
        }
        if s.starts_with("http://") {
            return Err(format!(
                "{s:?}: the control stream is TLS only; use https://host:port"
            ));
        }
        Err(format!(
            "{s:?}: expected unix:/path/to/socket or https://host:port"
        ))
    }
}

pub struct Identity {
    pub topology: String,
    pub node: String,
    pub credential: String,
    pub tls: TlsFiles,
}

/// Where the node's control-stream certificate, key and trusted CA are.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl TlsFiles {
    /// The given paths, or the operator's layout beside the credential file:
    /// `<file>.crt`, `<file>.key` and `ca.crt` in its directory.
    pub fn beside(
        credential_file: &Path,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        ca: Option<PathBuf>,
    ) -> TlsFiles {
        let with_suffix = |suffix: &str| {
            let mut p = credential_file.as_os_str().to_owned();
            p.push(suffix);
            PathBuf::from(p)
        };
        TlsFiles {
            cert: cert.unwrap_or_else(|| with_suffix(".crt")),
            key: key.unwrap_or_else(|| with_suffix(".key")),
            ca: ca.unwrap_or_else(|| {
                credential_file
                    .parent()
                    .unwrap_or(Path::new("."))
                    .join("ca.crt")
            }),
        }
    }

    pub fn client_config(&self) -> Result<tokio_rustls::rustls::ClientConfig, ConnectError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| ConnectError::Read(path.to_path_buf(), e))
        };
        Ok(client_config(
            &read(&self.ca)?,
            &read(&self.cert)?,
            &read(&self.key)?,
        )?)
    }
}

impl std::fmt::Display for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "certificate {}, key {}, CA {}",
            self.cert.display(),
            self.key.display(),
            self.ca.display()
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("reading {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
}

/// Dials the hub and does the TLS handshake on whatever the dial gave.
async fn dial(
    hub: HubAddress,
    tls: TlsConnector,
) -> std::io::Result<TokioIo<tokio_rustls::client::TlsStream<Box<dyn Stream>>>> {
    let stream: Box<dyn Stream> = match hub {
        HubAddress::Tcp(authority) => {
            // Resolved at every dial: the hub's Service address may change.
            let stream = tokio::net::TcpStream::connect(authority.as_str()).await?;
            stream.set_nodelay(true)?;
            Box::new(stream)
        }
        HubAddress::Unix(path) => Box::new(tokio::net::UnixStream::connect(path).await?),
    };
    let name = ServerName::try_from(HUB_SERVER_NAME).map_err(std::io::Error::other)?;
    Ok(TokioIo::new(tls.connect(name, stream).await?))
}

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

async fn connect(hub: &HubAddress, tls: &TlsFiles) -> Result<Channel, ConnectError> {
    // Read at every attempt, so rotated certificates take effect.
    let connector = TlsConnector::from(Arc::new(tls.client_config()?));
    let hub = hub.clone();
    // The URI is required by the API but unused: the connector dials, and TLS
    // is done there (tonic's own TLS would verify the dialled name instead of
    // the hub's fixed one).
    Ok(Endpoint::from_static("http://hub.nextmini.internal")
        // Dialling includes the TLS handshake: while thousands of agents start
        // on a small machine the hub takes seconds to answer, and giving up
        // after 2 s only made every agent start its handshake over.
        .connect_timeout(Duration::from_secs(15))
        .http2_keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(20))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            dial(hub.clone(), connector.clone())
        }))
        .await?)
}

/// Runs the control loop forever: connect, Hello, apply snapshots, report.
pub async fn run(hub: HubAddress, identity: Identity, mut dataplane: Dataplane) {
    let mut backoff = BACKOFF_MIN;
    let mut sequence = 0u64;
    // Reports of applied scenario events outlive sessions: one made while the
    // hub is away is sent on the next stream.
    let (_keep, mut applied) = match dataplane.scenario().take_reports() {
        Some(rx) => (None, rx),
        None => {
            let (tx, rx) = mpsc::unbounded_channel();
            (Some(tx), rx)
        }
    };
    loop {
        match session(
            &hub,
            &identity,
            &mut dataplane,
            &mut sequence,
            &mut backoff,
            &mut applied,
        )
        .await
        {
            Ok(()) => tracing::info!("hub closed the stream; reconnecting"),
            Err(e) => {
                tracing::warn!(error = %error_chain(e.as_ref()), "control stream failed; reconnecting")
            }
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
    applied: &mut mpsc::UnboundedReceiver<pb::ScenarioApplied>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let channel = connect(hub, &identity.tls).await?;
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
    let mut idle = IdleReports::default();
    let news = crate::news::news();
    // The last look found nothing new: the next report waits for news or the
    // idle interval.
    let mut quiet = false;
    loop {
        tokio::select! {
            _ = news.changed(), if quiet => {
                quiet = false;
                ticker.reset_immediately();
            }
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
                        idle.every = Duration::from_millis(u64::from(s.idle_report_interval_ms));
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
                        // A new generation (and its links) is news.
                        news.touch();
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
                        news.touch();
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
                    Some(pb::controller_message::Msg::Scenario(s)) => {
                        if let Err(e) = dataplane.schedule_scenario(s) {
                            tracing::warn!(error = %e, "scenario not scheduled");
                        }
                    }
                    None => {}
                }
            }
            Some(report) = applied.recv() => {
                tx.send(message(pb::agent_message::Msg::ScenarioApplied(report))).await?;
            }
            _ = ticker.tick() => {
                news.arm();
                let generation = dataplane.generation();
                let links = dataplane.link_counters();
                if idle.send_now(generation, &links, report_every) {
                    news.disarm();
                    quiet = false;
                    *sequence += 1;
                    let report = pb::Report {
                        sequence: *sequence,
                        generation,
                        links,
                        unix_ms: std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map(|d| d.as_millis() as u64)
                            .unwrap_or(0),
                    };
                    tx.send(message(pb::agent_message::Msg::Report(report))).await?;
                } else {
                    // Nothing new: the next look is when the idle report is
                    // due, or at once when a counter moves (`crate::news`).
                    quiet = true;
                    ticker.reset_after(idle.until_due(report_every));
                }
                while let Some(results) = dataplane.synth().and_then(|s| s.next_report()) {
                    tx.send(message(pb::agent_message::Msg::FlowReport(results))).await?;
                }
            }
        }
    }
}

/// Whether a report is due: one that says something new goes at once, and one
/// that would repeat the last waits for the hub's idle interval. A thousand
/// idle agents otherwise send a thousand reports a second that change nothing.
#[derive(Debug, Default)]
struct IdleReports {
    /// The hub's `idle_report_interval_ms`; zero reports every interval.
    every: Duration,
    /// The last report sent (generation, links without round-trip times) and when.
    last: Option<(u64, Vec<pb::LinkCounters>, std::time::Instant)>,
}

impl IdleReports {
    /// How long until the idle report is due (see [`send_now`](Self::send_now)),
    /// at least an interval: what a reporter that found nothing new waits for
    /// unless news comes first.
    fn until_due(&self, interval: Duration) -> Duration {
        let since = self
            .last
            .as_ref()
            .map(|(_, _, at)| at.elapsed())
            .unwrap_or_default();
        self.every
            .saturating_sub(since + interval / 2)
            .max(interval)
    }

    fn send_now(
        &mut self,
        generation: u64,
        links: &[pb::LinkCounters],
        interval: Duration,
    ) -> bool {
        let now = std::time::Instant::now();
        // The probes' round-trip times move on an idle link too; the first
        // one is news (it tells the hub that the link forwards).
        let said: Vec<pb::LinkCounters> = links
            .iter()
            .map(|l| pb::LinkCounters {
                rtt_us: u64::from(l.rtt_us > 0),
                ..l.clone()
            })
            .collect();
        let due = match &self.last {
            // Half an interval early, so ticks that land a hair short of the
            // idle interval do not stretch it by a whole interval.
            Some((g, last, at)) if *g == generation && *last == said => {
                now.duration_since(*at) + interval / 2 >= self.every
            }
            _ => true,
        };
        if due {
            self.last = Some((generation, said, now));
        }
        due
    }
}

fn message(msg: pb::agent_message::Msg) -> pb::AgentMessage {
    pb::AgentMessage { msg: Some(msg) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(tx_packets: u64, rtt_us: u64) -> pb::LinkCounters {
        pb::LinkCounters {
            link: "a-b".into(),
            connected: true,
            tx_packets,
            rtt_us,
            ..Default::default()
        }
    }

    /// Issue 16: an idle agent reports every idle interval, not every
    /// interval; traffic, a new generation or the first round trip go at once.
    #[test]
    fn reports_that_repeat_the_last_wait_for_the_idle_interval() {
        let interval = Duration::from_millis(100);
        let mut idle = IdleReports {
            every: Duration::from_millis(300),
            last: None,
        };
        assert!(
            idle.send_now(1, &[link(0, 0)], interval),
            "the first report goes"
        );
        assert!(
            idle.send_now(1, &[link(0, 250)], interval),
            "the first round trip is news"
        );
        assert!(
            !idle.send_now(1, &[link(0, 260)], interval),
            "a new round trip alone is not"
        );
        assert!(
            idle.send_now(1, &[link(5, 260)], interval),
            "traffic is news"
        );
        assert!(
            idle.send_now(2, &[link(5, 260)], interval),
            "so is a new generation"
        );
        assert!(!idle.send_now(2, &[link(5, 260)], interval));
        std::thread::sleep(Duration::from_millis(260));
        assert!(
            idle.send_now(2, &[link(5, 260)], interval),
            "the idle interval is up (within half an interval)"
        );
        let wait = idle.until_due(interval);
        assert!(
            wait > Duration::from_millis(240) && wait <= Duration::from_millis(250),
            "just after a report, the next idle one is due in 300 ms less half an interval: {wait:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            idle.until_due(interval),
            interval,
            "due in 50 ms, but never sooner than an interval"
        );
        let mut large = IdleReports {
            every: Duration::from_secs(30),
            last: None,
        };
        assert!(large.send_now(1, &[link(0, 0)], Duration::from_secs(1)));
        let wait = large.until_due(Duration::from_secs(1));
        assert!(
            wait > Duration::from_millis(29_400) && wait <= Duration::from_millis(29_500),
            "just after a report, the next idle one is due in 30 s less half an interval: {wait:?}"
        );
        let mut every_time = IdleReports::default();
        assert!(every_time.send_now(1, &[link(0, 0)], interval));
        assert!(
            every_time.send_now(1, &[link(0, 0)], interval),
            "no idle interval: every report goes"
        );
    }

    #[test]
    fn hub_addresses_are_tls_only() {
        assert!(matches!(
            "unix:/run/hub.sock".parse::<HubAddress>(),
            Ok(HubAddress::Unix(p)) if p == Path::new("/run/hub.sock")
        ));
        assert!(matches!(
            "https://nm-hub.lab.svc:50051".parse::<HubAddress>(),
            Ok(HubAddress::Tcp(a)) if a == "nm-hub.lab.svc:50051"
        ));
        let plain = "http://nm-hub:50051"
            .parse::<HubAddress>()
            .expect_err("plain http accepted");
        assert!(plain.contains("TLS only"), "{plain}");
        for bad in [
            "https://",
            "https://host",
            "https://host:1/path",
            "tcp://h:1",
            "unix:",
        ] {
            assert!(bad.parse::<HubAddress>().is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn tls_files_default_to_the_operators_layout() {
        let files = TlsFiles::beside(Path::new("/var/run/nextmini/credential"), None, None, None);
        assert_eq!(files.cert, Path::new("/var/run/nextmini/credential.crt"));
        assert_eq!(files.key, Path::new("/var/run/nextmini/credential.key"));
        assert_eq!(files.ca, Path::new("/var/run/nextmini/ca.crt"));
        let given = TlsFiles::beside(
            Path::new("c"),
            Some("x.pem".into()),
            Some("y.pem".into()),
            Some("z.pem".into()),
        );
        assert_eq!(
            (given.cert, given.key, given.ca),
            ("x.pem".into(), "y.pem".into(), "z.pem".into())
        );
        let missing = TlsFiles::beside(Path::new("/nonexistent/credential"), None, None, None)
            .client_config()
            .expect_err("missing files accepted");
        assert!(
            missing.to_string().contains("/nonexistent/ca.crt"),
            "{missing}"
        );
    }
}
