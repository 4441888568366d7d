//! One agent's stream, as the hub sees it: what was last sent, when the agent
//! was last heard, and the task that reads its acknowledgements and reports.

use super::{Hub, SessionKey};
use crate::store::{CounterRow, ReceivedRow, SentRow};
use nextmini_proto::v1 as pb;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

pub(super) struct SessionEntry {
    pub id: u64,
    /// The agent process's pid, from its Hello.
    pub pid: u32,
    pub tx: mpsc::Sender<Result<pb::ControllerMessage, Status>>,
    /// Generation of the last snapshot or delta sent.
    pub generation: i64,
    /// The newest generation whose config for this agent is the one it was
    /// sent at `generation`: changes that leave a node alone send it nothing
    /// (issue 16.4) and only move this, and its ack of `generation` is
    /// recorded as an ack of this.
    pub same_as: i64,
    /// What that generation gave this agent, as hashes: the next delta is
    /// computed against it, so a change costs one snapshot per agent, not two,
    /// and the hub holds no agent's whole config.
    pub config: Option<super::snapshot::SentConfig>,
    /// When the agent last spoke and what it last acknowledged, for the
    /// silence watchdog.
    pub liveness: Arc<Liveness>,
    pub topology_id: i64,
    pub report_interval_ms: u32,
    /// The snapshot's `idle_report_interval_ms`.
    pub idle_report_interval_ms: u32,
    pub metrics: Arc<crate::observe::HubMetrics>,
    /// A timed scenario's `kill` holds the node down (a cluster): the agent
    /// gets no config, and no change, until the node's restart
    /// (`scenario::release_at`); it is silent meanwhile, by design.
    pub held: bool,
}

impl SessionEntry {
    /// Queues a message without waiting. False when the queue is full or the
    /// stream is gone: the agent will reconnect and be sent a snapshot.
    pub fn send(&self, msg: pb::controller_message::Msg) -> bool {
        let sent = self
            .tx
            .try_send(Ok(pb::ControllerMessage { msg: Some(msg) }));
        let Err(e) = sent else {
            return true;
        };
        let why = match e {
            mpsc::error::TrySendError::Full(_) => crate::observe::MessageDrop::QueueFull,
            mpsc::error::TrySendError::Closed(_) => crate::observe::MessageDrop::Closed,
        };
        // Counted, so a hub shedding load says so. The session keeps the config
        // the agent has, so its next delta starts from there.
        self.metrics.control_message_dropped(why);
        tracing::warn!(
            session = self.id,
            reason = why.as_str(),
            "control message not queued; the agent catches up with the next change or on reconnect"
        );
        false
    }
}

/// What the silence watchdog reads of a session; its reader task writes it.
#[derive(Debug)]
pub(super) struct Liveness {
    /// Milliseconds since the hub started at which the agent last spoke.
    pub last_seen_ms: AtomicU64,
    /// The latest generation the agent answered (applied or refused).
    pub acked: AtomicU64,
    /// The watchdog marked the node disconnected and the agent has not
    /// spoken since.
    pub silent: AtomicBool,
}

impl Liveness {
    pub fn new(now_ms: u64) -> Liveness {
        Liveness {
            last_seen_ms: AtomicU64::new(now_ms),
            acked: AtomicU64::new(0),
            silent: AtomicBool::new(false),
        }
    }
}

/// How long a session may stay silent before the watchdog marks its node
/// disconnected. An agent applying a config it has not acknowledged yet sends
/// nothing until it is done, which takes seconds for a large snapshot on a
/// crowded machine (when the watchdog still dropped sessions, at 2,000 agents
/// on two cores that fed on itself until only a tenth stayed connected). An
/// idle agent reports only every idle interval, so the limit runs from its
/// idle report. A dead or frozen process is still found by the connection's
/// HTTP/2 keepalive within 40 s (a ping every 20 s, 20 s to answer).
pub(super) fn silence_limit_ms(
    report_interval_ms: u32,
    idle_report_interval_ms: u32,
    applying: bool,
) -> u64 {
    if applying {
        return APPLYING_SILENCE.as_millis() as u64;
    }
    let quiet = u64::from(idle_report_interval_ms.saturating_sub(report_interval_ms));
    (u64::from(report_interval_ms) * SILENT_INTERVALS).max(SILENCE_MIN.as_millis() as u64) + quiet
}

/// An agent silent for this many report intervals (at least `SILENCE_MIN`)
/// past its idle interval is marked disconnected; its stream stays open, and
/// its next message marks it connected again.
const SILENT_INTERVALS: u64 = 3;
const SILENCE_MIN: Duration = Duration::from_secs(3);
/// The limit while the agent applies a config it has not acknowledged.
const APPLYING_SILENCE: Duration = Duration::from_secs(60);

/// Reads the agent's messages until the stream ends, then marks the node
/// disconnected unless a newer session of the same agent took over.
pub(super) async fn run(
    hub: Hub,
    id: u64,
    key: SessionKey,
    topology_id: i64,
    liveness: Arc<Liveness>,
    mut inbound: Streaming<pb::AgentMessage>,
) {
    let (topology, node) = &key;
    let mut last_sequence = 0u64;
    let mut flows = FlowStart::default();
    let mut scenario = super::scenario::ScenarioStart::default();
    let mut episodes = super::fidelity::Episodes::default();
    loop {
        let msg = match inbound.message().await {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) => {
                tracing::info!(%topology, %node, error = %e, "agent stream ended");
                break;
            }
        };
        liveness.last_seen_ms.store(hub.now_ms(), Ordering::Relaxed);
        if liveness.silent.swap(false, Ordering::Relaxed) {
            tracing::info!(%topology, %node, "agent heard again; marking it connected");
            if let Err(e) = hub
                .inner
                .store
                .set_agent_state(topology_id, node, "connected")
                .await
            {
                tracing::warn!(error = %e, "marking the agent connected failed");
            }
        }
        match msg.msg {
            Some(pb::agent_message::Msg::Ack(ack)) => {
                // Applied or refused, the agent is done with it.
                liveness.acked.fetch_max(ack.generation, Ordering::Relaxed);
                if !ack.error.is_empty() {
                    tracing::warn!(%topology, %node, generation = ack.generation, error = %ack.error, "agent rejected config");
                    continue;
                }
                // Flow start needs to know which ack completed a generation; a
                // topology without flows skips those two reads, which would
                // otherwise come from every agent after every change.
                let has_flows = hub
                    .inner
                    .views
                    .lock()
                    .await
                    .get(topology)
                    .is_none_or(|v| !v.plan.flows.is_empty());
                // Read before and after: the ack that completes a generation is
                // the one that makes its flows ready.
                let ready_before = if has_flows {
                    Some(hub.inner.store.readiness(topology_id).await)
                } else {
                    None
                };
                record_ack(&hub, id, &key, topology_id, ack.generation as i64).await;
                if let Some(ready_before) = ready_before {
                    let before = ready_before.ok().map(|r| r.ready());
                    if let Some(g) = announce_ready(&hub, id, &key, topology_id, before).await {
                        flows.told = flows.told.max(g);
                    }
                }
                scenario.check(&hub, id, &key, topology_id).await;
            }
            Some(pb::agent_message::Msg::Report(report)) => {
                // A report replayed after a reconnect carries an old sequence.
                if report.sequence != 0 && report.sequence <= last_sequence {
                    continue;
                }
                last_sequence = report.sequence;
                hub.inner.metrics.report_received();
                let at = chrono::DateTime::from_timestamp_millis(report.unix_ms as i64)
                    .unwrap_or_else(chrono::Utc::now);
                episodes
                    .on_report(&hub.inner.store, topology_id, node, at, &report.links)
                    .await;
                let rows = report
                    .links
                    .into_iter()
                    .map(|l| counter_row(topology_id, node, at, l))
                    .collect();
                hub.inner.counters.push(rows).await;
                flows.check(&hub, id, &key, topology_id).await;
                scenario.check(&hub, id, &key, topology_id).await;
            }
            Some(pb::agent_message::Msg::ScenarioApplied(report)) => {
                super::scenario::store_applied(&hub, &key, topology_id, &report).await;
            }
            // The agent keeps what was not confirmed and sends it again on its
            // next session.
            Some(pb::agent_message::Msg::FlowReport(report))
                if !store_flow_report(&hub, id, &key, topology_id, &report).await =>
            {
                break;
            }
            Some(pb::agent_message::Msg::FlowReport(_)) => {}
            Some(pb::agent_message::Msg::Hello(_)) => {
                tracing::warn!(%topology, %node, "second Hello on one stream ignored");
            }
            None => {}
        }
    }
    episodes.end(&hub.inner.store).await;
    super::scenario::on_disconnect(&hub, &key, topology_id).await;
    let mut sessions = hub.inner.sessions.lock().await;
    if sessions.get(&key).is_some_and(|e| e.id == id) {
        sessions.remove(&key);
        drop(sessions);
        hub.mark_disconnected(&key, topology_id).await;
    }
}

fn counter_row(
    topology_id: i64,
    node: &str,
    at: chrono::DateTime<chrono::Utc>,
    l: pb::LinkCounters,
) -> CounterRow {
    CounterRow {
        topology_id,
        node: node.to_string(),
        link: l.link,
        connected: l.connected,
        tx_bytes: l.tx_bytes,
        tx_packets: l.tx_packets,
        rx_bytes: l.rx_bytes,
        rx_packets: l.rx_packets,
        drops: l.drops,
        connects: l.connects,
        drops_queue: l.drops_queue,
        drops_aqm: l.drops_aqm,
        drops_loss: l.drops_loss,
        drops_loop: l.drops_loop,
        ecn_marks: l.ecn_marks,
        queue_packets: l.queue_packets,
        queue_bytes: l.queue_bytes,
        rtt_us: l.rtt_us,
        late_packets: l.late_packets,
        unfaithful: l.unfaithful,
        at,
    }
}

/// Stores an agent's ack of `acked`, as an ack of the newest generation that
/// left its config as it was (`SessionEntry::same_as`). Read again after the
/// write: a change carried forward meanwhile found the old ack missing in the
/// store and left the node to this ack.
async fn record_ack(hub: &Hub, id: u64, key: &SessionKey, topology_id: i64, acked: i64) {
    let mut recorded = 0;
    loop {
        let target = {
            let sessions = hub.inner.sessions.lock().await;
            match sessions.get(key) {
                Some(e) if e.id == id && e.generation == acked => e.same_as.max(acked),
                _ => acked,
            }
        };
        if target <= recorded {
            return;
        }
        if let Err(e) = hub
            .inner
            .store
            .record_ack(topology_id, &key.1, target)
            .await
        {
            tracing::warn!(error = %e, "storing ack failed");
            return;
        }
        recorded = target;
    }
}

/// Tells agents which generation every agent of the topology runs, so flows
/// defined by it can start: all of them when this ack completed a generation,
/// otherwise just this agent (it may have restarted and forgotten).
async fn announce_ready(
    hub: &Hub,
    id: u64,
    key: &SessionKey,
    topology_id: i64,
    before: Option<i64>,
) -> Option<i64> {
    let after = match hub.inner.store.readiness(topology_id).await {
        Ok(r) if r.ready() > 0 => r.ready(),
        Ok(_) => return None,
        Err(e) => {
            tracing::warn!(error = %e, "reading the ready generation failed");
            return None;
        }
    };
    let ready = || {
        pb::controller_message::Msg::FlowsReady(pb::FlowsReady {
            generation: after as u64,
        })
    };
    let sessions = hub.inner.sessions.lock().await;
    if before.is_none_or(|b| b < after) {
        tracing::info!(topology = %key.0, generation = after, "every agent runs the generation");
        for ((topology, _), entry) in sessions.iter() {
            if *topology == key.0 {
                entry.send(ready());
            }
        }
    } else if let Some(entry) = sessions.get(key).filter(|e| e.id == id) {
        entry.send(ready());
    }
    Some(after)
}

/// How long flows wait for links that do not come up before starting anyway.
const LINK_WAIT: Duration = Duration::from_secs(5);

/// What a session told its agent about starting flows. Agents acknowledge a
/// config before their links have dialled, so the ack that completes a
/// generation may come too early: then each agent's reports poll until the
/// links are up (or `LINK_WAIT` passed), and no moment is missed.
#[derive(Default)]
struct FlowStart {
    /// The last FlowsReady generation sent to this agent.
    told: i64,
    /// Since when every agent runs the flows' generation but links are down.
    waiting: Option<Instant>,
}

impl FlowStart {
    async fn check(&mut self, hub: &Hub, id: u64, key: &SessionKey, topology_id: i64) {
        let needed = hub
            .inner
            .views
            .lock()
            .await
            .get(&key.0)
            .and_then(|v| v.plan.flows.iter().map(|f| f.defined_generation).max())
            .unwrap_or(0);
        if needed == 0 || self.told >= needed {
            return;
        }
        let Ok(r) = hub.inner.store.readiness(topology_id).await else {
            return;
        };
        if r.acked < needed {
            self.waiting = None;
            return;
        }
        if !r.links_up {
            let since = *self.waiting.get_or_insert_with(Instant::now);
            if since.elapsed() < LINK_WAIT {
                return;
            }
            tracing::warn!(topology = %key.0, node = %key.1, "links still down after {LINK_WAIT:?}; starting flows anyway");
        }
        let sessions = hub.inner.sessions.lock().await;
        if let Some(entry) = sessions.get(key).filter(|e| e.id == id) {
            entry.send(pb::controller_message::Msg::FlowsReady(pb::FlowsReady {
                generation: r.acked as u64,
            }));
            self.told = r.acked;
        }
    }
}

/// Stores an agent's flow results and confirms them; false when they could not
/// be stored.
async fn store_flow_report(
    hub: &Hub,
    id: u64,
    key: &SessionKey,
    topology_id: i64,
    report: &pb::FlowReport,
) -> bool {
    let (sent, received) = flow_rows(&report.results);
    let store = &hub.inner.store;
    let stored = match store.record_flow_sent(topology_id, &sent).await {
        Ok(_) => store.record_flow_received(topology_id, &received).await,
        Err(e) => Err(e),
    };
    if let Err(e) = stored {
        tracing::warn!(topology = %key.0, node = %key.1, error = %e, "storing flow results failed");
        return false;
    }
    let sessions = hub.inner.sessions.lock().await;
    if let Some(entry) = sessions.get(key).filter(|e| e.id == id) {
        entry.send(pb::controller_message::Msg::ResultsStored(
            pb::ResultsStored {
                sequence: report.sequence,
            },
        ));
    }
    true
}

/// Splits reported results into the sources' and the sinks' rows.
fn flow_rows(results: &[pb::FlowResult]) -> (Vec<SentRow>, Vec<ReceivedRow>) {
    let time = |us: u64| {
        chrono::DateTime::from_timestamp_micros(i64::try_from(us).unwrap_or(i64::MAX))
            .unwrap_or_default()
    };
    let mut sent = Vec::new();
    let mut received = Vec::new();
    for r in results {
        let instance = i32::try_from(r.instance).unwrap_or(i32::MAX);
        let generation = i64::try_from(r.defined_generation).unwrap_or(i64::MAX);
        if r.from_sink {
            received.push(ReceivedRow {
                flow: r.flow.clone(),
                defined_generation: generation,
                instance,
                started_at: time(r.started_unix_us),
                received_bytes: i64::try_from(r.received_bytes).unwrap_or(i64::MAX),
            });
            continue;
        }
        let finished = r.finished_unix_us > 0;
        let fct_us = finished.then_some(r.fct_us);
        sent.push(SentRow {
            flow: r.flow.clone(),
            defined_generation: generation,
            instance,
            protocol: match pb::FlowProtocol::try_from(r.protocol) {
                Ok(pb::FlowProtocol::Udp) => "udp".into(),
                _ => "tcp".into(),
            },
            size_bytes: (r.size_bytes > 0).then(|| i64::try_from(r.size_bytes).unwrap_or(i64::MAX)),
            bytes: i64::try_from(r.bytes).unwrap_or(i64::MAX),
            started_at: time(r.started_unix_us),
            finished_at: finished.then(|| time(r.finished_unix_us)),
            fct_us: fct_us.map(|f| i64::try_from(f).unwrap_or(i64::MAX)),
            throughput_bps: fct_us
                .filter(|f| *f > 0)
                .map(|f| r.bytes as f64 * 8.0 / (f as f64 / 1e6)),
            retransmissions: i64::try_from(r.retransmissions).unwrap_or(i64::MAX),
            error: (!r.error.is_empty()).then(|| r.error.clone()),
        });
    }
    (sent, received)
}

#[cfg(test)]
mod silence_tests {
    use super::*;

    #[test]
    fn an_agent_applying_its_config_gets_time_a_steady_one_does_not() {
        // A steady agent: three report intervals, at least 3 s (a hung agent
        // is marked down within seconds, RELIABILITY.md).
        assert_eq!(silence_limit_ms(1000, 1000, false), 3000);
        assert_eq!(silence_limit_ms(100, 100, false), 3000);
        assert_eq!(silence_limit_ms(5000, 5000, false), 15_000);
        // Applying an unacknowledged config: a minute.
        assert_eq!(silence_limit_ms(1000, 1000, true), 60_000);
        // A 10,000-node topology's idle agents report every 30 s.
        assert_eq!(silence_limit_ms(1000, 30_000, false), 32_000);
    }
}
