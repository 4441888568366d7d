//! The fleet: fake agents that hold a session each, and what they saw.

use super::session::{HubAddress, Identity, Session, message, open_session};
use nextmini_proto::v1 as pb;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

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
    pub(super) fn arrived(&self, agent: usize, generation: u64) {
        let now = Instant::now();
        self.arrivals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(generation)
            .or_default()
            .push((agent, now));
    }

    /// For each agent, when it first had `generation` or a later one.
    pub(super) fn reached(&self, generation: u64) -> BTreeMap<usize, Instant> {
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

/// The reconnect backoff of `nextmini-agent` (node-agent/src/control.rs), so a
/// hub that cannot keep up sees the retries real agents would send.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

async fn back_off(backoff: &mut Duration) {
    let jitter = Duration::from_millis(rand::random_range(0..=backoff.as_millis() as u64 / 2));
    tokio::time::sleep(*backoff + jitter).await;
    *backoff = (*backoff * 2).min(BACKOFF_MAX);
}

/// A running fleet: one fake agent task per identity.
pub struct Fleet {
    stats: Arc<FleetStats>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Fleet {
    /// Starts an agent per identity, at most ~200 a second, as a starting
    /// topology's agents would connect; returns once all are started.
    pub async fn start(hub: HubAddress, identities: Vec<Identity>) -> Fleet {
        let stats = Arc::new(FleetStats::default());
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = Vec::with_capacity(identities.len());
        for (i, id) in identities.into_iter().enumerate() {
            tasks.push(tokio::spawn(fake_agent(
                i,
                hub.clone(),
                id,
                stats.clone(),
                stop_rx.clone(),
            )));
            if i % 20 == 19 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Fleet { stats, stop, tasks }
    }

    /// Agents that have had their first snapshot.
    pub fn connected(&self) -> u64 {
        self.stats.connected.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> Arc<FleetStats> {
        self.stats.clone()
    }

    /// Ends every session (each drains what the hub still sends) and waits.
    pub async fn stop(self) {
        self.stop.send(true).ok();
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Plays one agent until `stop`: session, snapshot, acks, reports; reconnects
/// like `nextmini-agent` does when its stream ends (and counts that).
pub(super) async fn fake_agent(
    index: usize,
    hub: HubAddress,
    id: Identity,
    stats: Arc<FleetStats>,
    mut stop: watch::Receiver<bool>,
) {
    let mut sequence = 0u64;
    let mut first = true;
    let mut backoff = BACKOFF_MIN;
    while !*stop.borrow() {
        let session = tokio::select! {
            s = open_session(&hub, &id) => s,
            _ = stop.changed() => return,
        };
        let Session { tx, mut inbound } = match session {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(node = %id.node, error = %e, "opening the session failed");
                stats.disconnects.fetch_add(1, Ordering::Relaxed);
                back_off(&mut backoff).await;
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
                            backoff = BACKOFF_MIN;
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
        back_off(&mut backoff).await;
    }
}
