//! One agent's stream, as the hub sees it: what was last sent, when the agent
//! was last heard, and the task that reads its acknowledgements and reports.

use super::{Hub, SessionKey};
use crate::store::CounterRow;
use nextmini_proto::v1 as pb;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

pub(super) struct SessionEntry {
    pub id: u64,
    pub tx: mpsc::Sender<Result<pb::ControllerMessage, Status>>,
    /// Generation of the last snapshot or delta sent.
    pub generation: i64,
    /// Milliseconds since the hub started at which the agent last spoke.
    pub last_seen: Arc<AtomicU64>,
    pub topology_id: i64,
    pub report_interval_ms: u32,
}

impl SessionEntry {
    /// Queues a message without waiting. False when the queue is full or the
    /// stream is gone: the agent will reconnect and be sent a snapshot.
    pub fn send(&self, msg: pb::controller_message::Msg) -> bool {
        let ok = self
            .tx
            .try_send(Ok(pb::ControllerMessage { msg: Some(msg) }))
            .is_ok();
        if !ok {
            tracing::warn!(
                session = self.id,
                "session queue full or closed; agent resyncs on reconnect"
            );
        }
        ok
    }
}

/// Reads the agent's messages until the stream ends, then marks the node
/// disconnected unless a newer session of the same agent took over.
pub(super) async fn run(
    hub: Hub,
    id: u64,
    key: SessionKey,
    topology_id: i64,
    last_seen: Arc<AtomicU64>,
    mut inbound: Streaming<pb::AgentMessage>,
) {
    let (topology, node) = &key;
    let mut last_sequence = 0u64;
    loop {
        let msg = match inbound.message().await {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) => {
                tracing::info!(%topology, %node, error = %e, "agent stream ended");
                break;
            }
        };
        last_seen.store(hub.now_ms(), Ordering::Relaxed);
        match msg.msg {
            Some(pb::agent_message::Msg::Ack(ack)) => {
                if !ack.error.is_empty() {
                    tracing::warn!(%topology, %node, generation = ack.generation, error = %ack.error, "agent rejected config");
                    continue;
                }
                if let Err(e) = hub
                    .inner
                    .store
                    .record_ack(topology_id, node, ack.generation as i64)
                    .await
                {
                    tracing::warn!(error = %e, "storing ack failed");
                }
            }
            Some(pb::agent_message::Msg::Report(report)) => {
                // A report replayed after a reconnect carries an old sequence.
                if report.sequence != 0 && report.sequence <= last_sequence {
                    continue;
                }
                last_sequence = report.sequence;
                let at = chrono::DateTime::from_timestamp_millis(report.unix_ms as i64)
                    .unwrap_or_else(chrono::Utc::now);
                let rows = report
                    .links
                    .into_iter()
                    .map(|l| counter_row(topology_id, node, at, l))
                    .collect();
                hub.inner.counters.push(rows).await;
            }
            Some(pb::agent_message::Msg::Hello(_)) => {
                tracing::warn!(%topology, %node, "second Hello on one stream ignored");
            }
            None => {}
        }
    }
    let mut sessions = hub.inner.sessions.lock().await;
    if sessions.get(&key).is_some_and(|e| e.id == id) {
        sessions.remove(&key);
        drop(sessions);
        if let Err(e) = hub
            .inner
            .store
            .set_agent_state(topology_id, node, "disconnected")
            .await
        {
            tracing::warn!(error = %e, "marking agent disconnected failed");
        }
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
        ecn_marks: l.ecn_marks,
        queue_packets: l.queue_packets,
        queue_bytes: l.queue_bytes,
        rtt_us: l.rtt_us,
        at,
    }
}
