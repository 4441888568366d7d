//! Link counters reported by agents, upserted in batches.

use super::Result;
use sqlx::PgPool;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CounterRow {
    pub topology_id: i64,
    pub node: String,
    pub link: String,
    pub connected: bool,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub drops: u64,
    pub connects: u64,
    pub drops_queue: u64,
    pub drops_aqm: u64,
    pub drops_loss: u64,
    pub drops_loop: u64,
    pub ecn_marks: u64,
    pub queue_packets: u64,
    pub queue_bytes: u64,
    pub rtt_us: u64,
    pub late_packets: u64,
    /// The fidelity guard's verdict on the report's window ('' = faithful).
    pub unfaithful: String,
    /// When the agent read the counters.
    pub at: chrono::DateTime<chrono::Utc>,
}

pub(super) async fn upsert(pool: &PgPool, rows: &[CounterRow]) -> Result<()> {
    // Postgres refuses one INSERT that touches the same key twice; the batch keeps
    // only each key's latest row.
    let mut latest: std::collections::HashMap<(i64, &str, &str), &CounterRow> =
        std::collections::HashMap::new();
    for r in rows {
        latest.insert((r.topology_id, &r.link, &r.node), r);
    }
    let rows: Vec<&CounterRow> = latest.into_values().collect();
    for chunk in rows.chunks(2000) {
        let mut qb = sqlx::QueryBuilder::new(
            "INSERT INTO link_counters (topology_id, link, node, connected, tx_bytes, tx_packets, rx_bytes, rx_packets, drops, connects, \
              drops_queue, drops_aqm, drops_loss, drops_loop, ecn_marks, queue_packets, queue_bytes, late_packets, unfaithful) ",
        );
        qb.push_values(chunk, |mut b, r| {
            b.push_bind(r.topology_id)
                .push_bind(&r.link)
                .push_bind(&r.node)
                .push_bind(r.connected)
                .push_bind(r.tx_bytes as i64)
                .push_bind(r.tx_packets as i64)
                .push_bind(r.rx_bytes as i64)
                .push_bind(r.rx_packets as i64)
                .push_bind(r.drops as i64)
                .push_bind(r.connects as i64)
                .push_bind(r.drops_queue as i64)
                .push_bind(r.drops_aqm as i64)
                .push_bind(r.drops_loss as i64)
                .push_bind(r.drops_loop as i64)
                .push_bind(r.ecn_marks as i64)
                .push_bind(r.queue_packets as i64)
                .push_bind(r.queue_bytes as i64)
                .push_bind(r.late_packets as i64)
                .push_bind(&r.unfaithful);
        });
        qb.push(
            " ON CONFLICT (topology_id, link, node) DO UPDATE SET connected = EXCLUDED.connected, \
              tx_bytes = EXCLUDED.tx_bytes, tx_packets = EXCLUDED.tx_packets, rx_bytes = EXCLUDED.rx_bytes, \
              rx_packets = EXCLUDED.rx_packets, drops = EXCLUDED.drops, connects = EXCLUDED.connects, \
              drops_queue = EXCLUDED.drops_queue, drops_aqm = EXCLUDED.drops_aqm, drops_loss = EXCLUDED.drops_loss, drops_loop = EXCLUDED.drops_loop, \
              ecn_marks = EXCLUDED.ecn_marks, queue_packets = EXCLUDED.queue_packets, queue_bytes = EXCLUDED.queue_bytes, \
              late_packets = EXCLUDED.late_packets, unfaithful = EXCLUDED.unfaithful, updated_at = now()",
        );
        if let Err(e) = qb.build().execute(pool).await {
            // A topology deleted between report and write violates the foreign key;
            // that batch is stale, not an error worth failing the hub for.
            if is_foreign_key_violation(&e) {
                tracing::debug!("dropped counters of a deleted topology");
                continue;
            }
            return Err(e.into());
        }
    }
    Ok(())
}

pub(super) fn is_foreign_key_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == "23503")
}
