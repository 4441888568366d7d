//! Control-plane load (issue 9, point 2): one hub, a large real topology stored by
//! the same planner and store code `nextmini up` uses, and a fleet of lightweight
//! agents in this process impersonating its nodes. Each fake agent opens a real
//! control session with its node's credential, acknowledges snapshots and deltas
//! and reports counters at the topology's interval, like `nextmini-agent` does, but
//! has no TUN device, links or processors. A driver flips a route rule over SQL
//! while the fleet reports, and times each committed change to its arrival at
//! every agent (one process, one monotonic clock).
//!
//! What the run measures: the hub's CPU and resident memory (from /proc), the
//! database's write rate (`pg_stat_user_tables`), the control-delta latency, and
//! that nothing is dropped silently: every counter row sent is in the metrics
//! history or counted by the hub's `nextmini_hub_counter_rows_dropped_total`, and
//! every change reaches every agent.

use crate::Env;
use anyhow::{Context, bail};
use hyper_util::rt::TokioIo;
use nextmini_operator::plan;
use nextmini_operator::store::Store;
use nextmini_proto::v1 as pb;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Endpoint, Uri};

/// The topology the load runs: a ring, every node with two links.
pub const TOPOLOGY: &str = "load";

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub agents: usize,
    /// How long the fleet reports while it is measured.
    pub duration: Duration,
    /// The topology's `spec.telemetry.interval`.
    pub report_interval: Duration,
    /// Time between route changes.
    pub change_every: Duration,
}

/// One node as an agent proves it to the hub: what `nextmini` gave it.
#[derive(Debug, Clone)]
pub struct Identity {
    pub topology: String,
    pub node: String,
    pub credential_file: PathBuf,
}

/// An open control session: what the agent sends, and what the hub sends it.
pub struct Session {
    pub tx: mpsc::Sender<pb::AgentMessage>,
    pub inbound: tonic::Streaming<pb::ControllerMessage>,
}

/// Opens one agent's control session over the hub's Unix socket and says Hello
/// with the node's credential. Everything that connection set-up needs is here,
/// so a change of it (client certificates on the control stream, which will sit
/// beside the credential file) is made in one place.
pub async fn open_session(hub_socket: &Path, id: &Identity) -> anyhow::Result<Session> {
    let credential = std::fs::read_to_string(&id.credential_file)
        .with_context(|| format!("reading {}", id.credential_file.display()))?;
    let path = hub_socket.to_path_buf();
    // The URI is required but unused: the connector picks the socket.
    let channel = Endpoint::from_static("http://hub.local")
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await?;
    let mut client = pb::control_client::ControlClient::new(channel);
    let (tx, rx) = mpsc::channel(64);
    tx.send(message(pb::agent_message::Msg::Hello(pb::Hello {
        topology: id.topology.clone(),
        node: id.node.clone(),
        credential: credential.trim().to_string(),
        protocol_version: nextmini_proto::PROTOCOL_VERSION,
        capabilities: vec!["tcp".into()],
        running_generation: 0,
        pid: std::process::id(),
    })))
    .await?;
    let inbound = client.session(ReceiverStream::new(rx)).await?.into_inner();
    Ok(Session { tx, inbound })
}

fn message(msg: pb::agent_message::Msg) -> pb::AgentMessage {
    pb::AgentMessage { msg: Some(msg) }
}

/// A ring of `agents` nodes reporting every `interval`, with two explicit routes
/// a→b→c (ids 1 and 2, the same path) for the driver's rule to flip between.
pub fn manifest(agents: usize, interval: Duration) -> String {
    format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: {TOPOLOGY}}}\n\
         spec:\n  generator: {{ring: {{nodes: {agents}}}}}\n  telemetry: {{interval: {}ms}}\n",
        interval.as_millis()
    )
}

/// Plans `text` with the planner `nextmini up` uses and stores it with the store
/// code `up` uses, giving each node a fresh credential: its SHA-256 goes to the
/// store, the credential itself to `<state>/credentials/<topology>/<node>`
/// (0600), where `nextmini up` keeps it and `nextmini down` removes it. No node
/// is started: the fleet plays the agents.
pub async fn store_topology(
    state_dir: &Path,
    database_url: &str,
    text: &str,
) -> anyhow::Result<(plan::Plan, Vec<Identity>)> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let manifest = plan::parse_manifest("load.yaml", text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let plan = plan::plan_manifest(&manifest)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .into_iter()
        .next()
        .context("no topology")?;
    let dir = state_dir.join("credentials").join(&plan.topology);
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    let mut hashes = BTreeMap::new();
    let mut identities = Vec::new();
    for node in &plan.nodes {
        let credential = hex::encode(rand::random::<[u8; 32]>());
        hashes.insert(
            node.name.clone(),
            hex::encode(Sha256::digest(credential.as_bytes())),
        );
        let file = dir.join(&node.name);
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&file)?;
        std::io::Write::write_all(&mut f, credential.as_bytes())?;
        identities.push(Identity {
            topology: plan.topology.clone(),
            node: node.name.clone(),
            credential_file: file,
        });
    }
    let store = Store::connect(database_url).await?;
    store.apply_plan(&plan, "netns", text, &hashes).await?;
    store.ensure_link_identity(&plan.topology).await?;
    Ok((plan, identities))
}

/// What the fleet saw, shared by its agents.
#[derive(Default)]
pub struct FleetStats {
    pub connected: AtomicU64,
    pub reports: AtomicU64,
    /// Link counter entries in the reports sent: one row each in the history.
    pub rows: AtomicU64,
    /// Snapshots after an agent's first: a resync, which should not happen.
    pub resyncs: AtomicU64,
    /// Streams that ended or failed under an agent.
    pub disconnects: AtomicU64,
    pub rejected: AtomicU64,
    /// When each agent first had each generation, by generation.
    arrivals: Mutex<BTreeMap<u64, Vec<(usize, Instant)>>>,
}

impl FleetStats {
    fn arrived(&self, agent: usize, generation: u64) {
        let now = Instant::now();
        self.arrivals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(generation)
            .or_default()
            .push((agent, now));
    }

    /// For each agent, when it first had `generation` or a later one.
    fn reached(&self, generation: u64) -> BTreeMap<usize, Instant> {
        let arrivals = self.arrivals.lock().unwrap_or_else(|e| e.into_inner());
        let mut first: BTreeMap<usize, Instant> = BTreeMap::new();
        for (_, list) in arrivals.range(generation..) {
            for &(agent, at) in list {
                first
                    .entry(agent)
                    .and_modify(|t| *t = (*t).min(at))
                    .or_insert(at);
            }
        }
        first
    }
}

/// Plays one agent until `stop`: session, snapshot, acks, reports; reconnects
/// like `nextmini-agent` does when its stream ends (and counts that).
async fn fake_agent(
    index: usize,
    hub_socket: PathBuf,
    id: Identity,
    stats: Arc<FleetStats>,
    mut stop: watch::Receiver<bool>,
) {
    let mut sequence = 0u64;
    let mut first = true;
    let mut backoff = Duration::from_millis(50);
    while !*stop.borrow() {
        let session = tokio::select! {
            s = open_session(&hub_socket, &id) => s,
            _ = stop.changed() => return,
        };
        let Session { tx, mut inbound } = match session {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(node = %id.node, error = %e, "opening the session failed");
                stats.disconnects.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let mut links: Vec<String> = Vec::new();
        let mut ticker: Option<tokio::time::Interval> = None;
        let ended = loop {
            let tick = async {
                match ticker.as_mut() {
                    Some(t) => t.tick().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = stop.changed() => break None,
                msg = inbound.message() => {
                    let msg = match msg {
                        Ok(Some(m)) => m,
                        Ok(None) => break Some("the hub closed the stream".to_string()),
                        Err(e) => break Some(e.to_string()),
                    };
                    let generation = match msg.msg {
                        Some(pb::controller_message::Msg::Snapshot(s)) => {
                            if !first {
                                stats.resyncs.fetch_add(1, Ordering::Relaxed);
                            }
                            if first {
                                stats.connected.fetch_add(1, Ordering::Relaxed);
                                first = false;
                            }
                            links = s.links.iter().map(|l| l.name.clone()).collect();
                            let every = Duration::from_millis(u64::from(s.report_interval_ms.max(100)));
                            ticker = Some(tokio::time::interval(every));
                            backoff = Duration::from_millis(50);
                            s.generation
                        }
                        Some(pb::controller_message::Msg::Delta(d)) => {
                            let removed: Vec<&String> = d.remove_links.iter().collect();
                            links.retain(|l| !removed.contains(&l));
                            for l in &d.upsert_links {
                                if !links.contains(&l.name) {
                                    links.push(l.name.clone());
                                }
                            }
                            d.generation
                        }
                        Some(pb::controller_message::Msg::Reject(r)) => {
                            stats.rejected.fetch_add(1, Ordering::Relaxed);
                            break Some(format!("rejected: {}", r.reason));
                        }
                        _ => continue,
                    };
                    stats.arrived(index, generation);
                    let ack = pb::Ack { generation, error: String::new() };
                    if tx.send(message(pb::agent_message::Msg::Ack(ack))).await.is_err() {
                        break Some("the stream closed under an ack".to_string());
                    }
                }
                _ = tick => {
                    sequence += 1;
                    let report = pb::Report {
                        sequence,
                        generation: 0,
                        links: links
                            .iter()
                            .map(|l| pb::LinkCounters {
                                link: l.clone(),
                                connected: true,
                                tx_bytes: sequence * 1500,
                                tx_packets: sequence,
                                rx_bytes: sequence * 1400,
                                rx_packets: sequence,
                                connects: 1,
                                ..Default::default()
                            })
                            .collect(),
                        unix_ms: std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map(|d| d.as_millis() as u64)
                            .unwrap_or(0),
                    };
                    let rows = report.links.len() as u64;
                    if tx.send(message(pb::agent_message::Msg::Report(report))).await.is_err() {
                        break Some("the stream closed under a report".to_string());
                    }
                    stats.reports.fetch_add(1, Ordering::Relaxed);
                    stats.rows.fetch_add(rows, Ordering::Relaxed);
                }
            }
        };
        let Some(ended) = ended else {
            // Stopped: end the request stream and read until the hub ends its
            // side, which it does once it has read every report sent.
            drop(tx);
            let drained = tokio::time::timeout(Duration::from_secs(10), async {
                while let Ok(Some(_)) = inbound.message().await {}
            })
            .await;
            if drained.is_err() {
                tracing::warn!(node = %id.node, "the hub did not end the stream");
            }
            return;
        };
        tracing::warn!(node = %id.node, reason = %ended, "session ended; reconnecting");
        stats.disconnects.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// CPU time (user + system) of a process, from /proc/<pid>/stat.
pub fn cpu_time(pid: i32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as u64;
    Some(Duration::from_millis(ticks * 1000 / hz))
}

/// Resident memory of a process in bytes, from /proc/<pid>/status.
pub fn rss_bytes(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The processes of the PostgreSQL whose postmaster is `pid`: it and its children.
fn postgres_pids(postmaster: i32) -> Vec<i32> {
    let mut pids = vec![postmaster];
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in dir.filter_map(|e| e.ok()) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let parent = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let rest = s[s.rfind(')')? + 2..].to_string();
                rest.split_whitespace().nth(1)?.parse::<i32>().ok()
            });
        if parent == Some(postmaster) {
            pids.push(pid);
        }
    }
    pids
}

fn total_cpu(pids: &[i32]) -> Duration {
    pids.iter().filter_map(|p| cpu_time(*p)).sum()
}

/// `GET /metrics` of the hub's endpoint, as text.
pub fn scrape(addr: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// The value of one sample line (`name{labels} value`) of a scrape; 0 when absent.
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .filter(|rest| rest.starts_with(' '))
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

/// Inserts and updates per table since the statistics were last reset.
async fn table_writes(pool: &sqlx::PgPool) -> anyhow::Result<BTreeMap<String, (i64, i64)>> {
    let rows: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT relname::text, n_tup_ins, n_tup_upd FROM pg_stat_user_tables")
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().map(|(t, i, u)| (t, (i, u))).collect())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Latencies of one kind, in milliseconds.
#[derive(Debug, Clone, Default)]
pub struct Latencies(pub Vec<f64>);

impl Latencies {
    fn sorted(&self) -> Vec<f64> {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        v
    }
    pub fn p50(&self) -> f64 {
        percentile(&self.sorted(), 0.5)
    }
    pub fn p99(&self) -> f64 {
        percentile(&self.sorted(), 0.99)
    }
    pub fn max(&self) -> f64 {
        self.sorted().last().copied().unwrap_or(f64::NAN)
    }
}

/// What a run measured.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    pub agents: usize,
    pub connected: u64,
    pub connect_secs: f64,
    pub measured_secs: f64,
    pub report_interval_ms: u128,
    pub reports_per_sec: f64,
    pub target_reports_per_sec: f64,
    pub rows_sent: u64,
    pub rows_stored: i64,
    pub rows_dropped_by_hub: f64,
    pub messages_dropped_by_hub: f64,
    pub metrics_rows_per_sec: f64,
    pub counter_upserts_per_sec: f64,
    pub node_updates_per_sec: f64,
    pub hub_cpu_percent: f64,
    pub hub_rss_max: u64,
    pub hub_rss_end: u64,
    pub postgres_cpu_percent: f64,
    pub fleet_cpu_percent: f64,
    pub changes: usize,
    /// Changes that did not reach every agent within the wait.
    pub changes_incomplete: usize,
    /// Commit to the delta at the node the change touches (the rule's source).
    pub affected: Latencies,
    /// Commit to the delta at the last of all agents, per change.
    pub all_agents: Latencies,
    /// Commit to the delta, every agent of every change.
    pub per_agent: Latencies,
    pub resyncs: u64,
    pub disconnects: u64,
    pub rejected: u64,
}

impl LoadReport {
    /// One Markdown table row; `header()` names the columns.
    pub fn row(&self) -> String {
        format!(
            "| {} | {} ms | {:.0} s | {:.0} of {:.0} | {:.0} | {:.0} | {:.1}% | {:.0} MiB (end {:.0}) | {:.1}% | {} | {:.1} / {:.1} / {:.1} ms | {:.1} / {:.1} ms | {:.1} ms | {} | {} rows, {} messages | {} / {} |",
            self.agents,
            self.report_interval_ms,
            self.measured_secs,
            self.reports_per_sec,
            self.target_reports_per_sec,
            self.metrics_rows_per_sec,
            self.counter_upserts_per_sec,
            self.hub_cpu_percent,
            self.hub_rss_max as f64 / 1048576.0,
            self.hub_rss_end as f64 / 1048576.0,
            self.postgres_cpu_percent,
            self.changes,
            self.affected.p50(),
            self.affected.p99(),
            self.affected.max(),
            self.all_agents.p50(),
            self.all_agents.p99(),
            self.per_agent.p99(),
            self.changes_incomplete,
            self.rows_dropped_by_hub,
            self.messages_dropped_by_hub,
            self.resyncs,
            self.disconnects,
        )
    }

    pub fn header() -> &'static str {
        "| agents | report every | measured | reports/s (target) | history rows/s | counter upserts/s | hub CPU (one core) | hub RSS max | PostgreSQL CPU | route changes | delta at the changed node p50 / p99 / max | delta at all agents p50 / p99 | any agent p99 | changes not at every agent | dropped by the hub | resyncs / disconnects |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    }

    /// Everything a run must show: every agent connected and stayed, every change
    /// reached every agent, every row sent was stored, the hub dropped nothing.
    pub fn check_nothing_lost(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.connected != self.agents as u64 {
            problems.push(format!(
                "{} of {} agents connected",
                self.connected, self.agents
            ));
        }
        if self.disconnects > 0 || self.resyncs > 0 || self.rejected > 0 {
            problems.push(format!(
                "{} disconnects, {} resyncs, {} rejections",
                self.disconnects, self.resyncs, self.rejected
            ));
        }
        if self.changes == 0 || self.changes_incomplete > 0 {
            problems.push(format!(
                "{} of {} route changes did not reach every agent",
                self.changes_incomplete, self.changes
            ));
        }
        if self.rows_stored + self.rows_dropped_by_hub as i64 != self.rows_sent as i64 {
            problems.push(format!(
                "{} rows sent, {} stored, {} counted as dropped: {} lost silently",
                self.rows_sent,
                self.rows_stored,
                self.rows_dropped_by_hub,
                self.rows_sent as i64 - self.rows_stored - self.rows_dropped_by_hub as i64
            ));
        }
        if self.rows_dropped_by_hub > 0.0 || self.messages_dropped_by_hub > 0.0 {
            problems.push(format!(
                "the hub dropped {} rows and {} messages",
                self.rows_dropped_by_hub, self.messages_dropped_by_hub
            ));
        }
        problems
    }
}

/// Port of the hub's metrics endpoint for this run (a free one near 19000).
fn metrics_addr() -> String {
    let port = (19000..19999)
        .map(|p| p + (std::process::id() % 500) as u16)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .unwrap_or(19464);
    format!("127.0.0.1:{port}")
}

/// Runs the load against a fresh private PostgreSQL and hub in `env`, prints
/// progress to stderr, and returns the figures.
pub async fn run(env: &Env, cfg: &LoadConfig) -> anyhow::Result<LoadReport> {
    env.ok(&["db", "start"]);
    let url = env.ok(&["db", "url"]).trim().to_string();
    let text = manifest(cfg.agents, cfg.report_interval);
    let (plan, identities) = store_topology(&env.state_dir, &url, &text).await?;
    let metrics = metrics_addr();
    let out = env
        .command(&["hub", "--background"])
        .env("NEXTMINI_METRICS_ADDR", &metrics)
        .output()?;
    if !out.status.success() {
        bail!(
            "nextmini hub --background: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let hub_pid = env.hub_pid().context("the hub's pid")?;
    let pg_pid = env.postgres_pid().context("PostgreSQL's pid")?;
    let socket = env.state_dir.join("hub.sock");
    let pool = sqlx::PgPool::connect(&url).await?;

    // Route rule a→c flipped between two routes along the ring's first nodes.
    let names: Vec<&str> = plan.nodes.iter().map(|n| n.name.as_str()).collect();
    let (a, b, c) = (names[0], names[1], names[2]);
    sqlx::query(
        "WITH t AS (SELECT id FROM topologies WHERE name = $1) \
         INSERT INTO routes (topology_id, id, name, path) \
         SELECT id, 1, 'one', ARRAY[$2,$3,$4] FROM t UNION ALL SELECT id, 2, 'two', ARRAY[$2,$3,$4] FROM t",
    )
    .bind(TOPOLOGY)
    .bind(a)
    .bind(b)
    .bind(c)
    .execute(&pool)
    .await?;
    sqlx::query(
        "INSERT INTO route_rules (topology_id, src, dst, protocol, dst_port, route_id) \
         SELECT id, $2, $3, 17, 9000, 1 FROM topologies WHERE name = $1",
    )
    .bind(TOPOLOGY)
    .bind(a)
    .bind(c)
    .execute(&pool)
    .await?;

    let stats = Arc::new(FleetStats::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, id) in identities.iter().cloned().enumerate() {
        tasks.push(tokio::spawn(fake_agent(
            i,
            socket.clone(),
            id,
            stats.clone(),
            stop_rx.clone(),
        )));
        // Connects at most ~200 agents a second, as a starting topology would.
        if i % 20 == 19 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let connect_deadline = Instant::now() + Duration::from_secs(120);
    while stats.connected.load(Ordering::Relaxed) < cfg.agents as u64 {
        if Instant::now() > connect_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let connect_secs = started.elapsed().as_secs_f64();
    eprintln!(
        "load: {} of {} agents connected in {connect_secs:.1} s",
        stats.connected.load(Ordering::Relaxed),
        cfg.agents
    );
    // Settle: the first reports and the connect-time writes pass.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let t0 = Instant::now();
    let hub_cpu0 = cpu_time(hub_pid).unwrap_or_default();
    let pg_cpu0 = total_cpu(&postgres_pids(pg_pid));
    let fleet_cpu0 = cpu_time(std::process::id() as i32).unwrap_or_default();
    let writes0 = table_writes(&pool).await?;
    let reports0 = stats.reports.load(Ordering::Relaxed);
    let mut rss_max = 0u64;
    let mut report = LoadReport {
        agents: cfg.agents,
        connected: stats.connected.load(Ordering::Relaxed),
        connect_secs,
        report_interval_ms: cfg.report_interval.as_millis(),
        ..Default::default()
    };
    let mut route = 1;
    let mut next_progress = Instant::now() + Duration::from_secs(30);
    while t0.elapsed() < cfg.duration {
        let round = Instant::now();
        route = 3 - route;
        let mut tx = pool.begin().await?;
        sqlx::query(
            "UPDATE route_rules SET route_id = $2 \
             WHERE topology_id = (SELECT id FROM topologies WHERE name = $1)",
        )
        .bind(TOPOLOGY)
        .bind(route)
        .execute(&mut *tx)
        .await?;
        let generation: i64 =
            sqlx::query_scalar("SELECT generation FROM topologies WHERE name = $1")
                .bind(TOPOLOGY)
                .fetch_one(&mut *tx)
                .await?;
        tx.commit().await?;
        let committed = Instant::now();
        report.changes += 1;
        // Wait for every agent (or give up on this change after 10 s).
        let deadline = committed + Duration::from_secs(10);
        let reached = loop {
            let reached = stats.reached(generation as u64);
            if reached.len() >= cfg.agents || Instant::now() > deadline {
                break reached;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        if reached.len() < cfg.agents {
            report.changes_incomplete += 1;
        }
        let ms = |at: &Instant| at.saturating_duration_since(committed).as_secs_f64() * 1e3;
        if let Some(at) = reached.get(&0) {
            report.affected.0.push(ms(at));
        }
        if let Some(last) = reached.values().max() {
            report.all_agents.0.push(ms(last));
        }
        report.per_agent.0.extend(reached.values().map(ms));
        rss_max = rss_max.max(rss_bytes(hub_pid).unwrap_or(0));
        if Instant::now() > next_progress {
            next_progress += Duration::from_secs(30);
            eprintln!(
                "load: {:.0} s, {} changes, {} reports, hub RSS {:.0} MiB",
                t0.elapsed().as_secs_f64(),
                report.changes,
                stats.reports.load(Ordering::Relaxed),
                rss_max as f64 / 1048576.0
            );
        }
        let rest = cfg.change_every.saturating_sub(round.elapsed());
        tokio::time::sleep(rest).await;
    }
    let measured = t0.elapsed();
    let secs = measured.as_secs_f64();
    let percent = |d: Duration| d.as_secs_f64() / secs * 100.0;
    report.measured_secs = secs;
    report.hub_cpu_percent = percent(
        cpu_time(hub_pid)
            .unwrap_or_default()
            .saturating_sub(hub_cpu0),
    );
    report.postgres_cpu_percent =
        percent(total_cpu(&postgres_pids(pg_pid)).saturating_sub(pg_cpu0));
    report.fleet_cpu_percent = percent(
        cpu_time(std::process::id() as i32)
            .unwrap_or_default()
            .saturating_sub(fleet_cpu0),
    );
    report.hub_rss_end = rss_bytes(hub_pid).unwrap_or(0);
    report.hub_rss_max = rss_max.max(report.hub_rss_end);
    report.reports_per_sec = (stats.reports.load(Ordering::Relaxed) - reports0) as f64 / secs;
    report.target_reports_per_sec =
        cfg.agents as f64 * 1000.0 / cfg.report_interval.as_millis() as f64;
    // PostgreSQL publishes a backend's counts when it goes idle (at most 1 s late).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let writes1 = table_writes(&pool).await?;
    let delta = |table: &str| {
        let (i0, u0) = writes0.get(table).copied().unwrap_or_default();
        let (i1, u1) = writes1.get(table).copied().unwrap_or_default();
        ((i1 - i0) as f64, (u1 - u0) as f64)
    };
    let window = secs + 1.5;
    report.metrics_rows_per_sec = delta("link_metrics").0 / window;
    let (ins, upd) = delta("link_counters");
    report.counter_upserts_per_sec = (ins + upd) / window;
    report.node_updates_per_sec = delta("nodes").1 / window;

    // Stop the fleet, then let the hub write what it holds.
    stop_tx.send(true).ok();
    for t in tasks {
        let _ = t.await;
    }
    report.rows_sent = stats.rows.load(Ordering::Relaxed);
    report.resyncs = stats.resyncs.load(Ordering::Relaxed);
    report.disconnects = stats.disconnects.load(Ordering::Relaxed);
    report.rejected = stats.rejected.load(Ordering::Relaxed);
    let settle = Instant::now() + Duration::from_secs(60);
    loop {
        let scraped = scrape(&metrics).unwrap_or_default();
        report.rows_dropped_by_hub = ["db_backlog", "topology_deleted", "writer_stopped"]
            .iter()
            .map(|r| {
                sample(
                    &scraped,
                    &format!("nextmini_hub_counter_rows_dropped_total{{reason=\"{r}\"}}"),
                )
            })
            .sum();
        report.messages_dropped_by_hub = ["queue_full", "closed"]
            .iter()
            .map(|r| {
                sample(
                    &scraped,
                    &format!("nextmini_hub_control_messages_dropped_total{{reason=\"{r}\"}}"),
                )
            })
            .sum();
        report.rows_stored = sqlx::query_scalar(
            "SELECT count(*) FROM link_metrics m JOIN topologies t ON t.id = m.topology_id WHERE t.name = $1",
        )
        .bind(TOPOLOGY)
        .fetch_one(&pool)
        .await?;
        if report.rows_stored + report.rows_dropped_by_hub as i64 >= report.rows_sent as i64
            || Instant::now() > settle
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    pool.close().await;
    Ok(report)
}
