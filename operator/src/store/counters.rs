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
    // One statement text whatever the batch size: a VALUES list per size made
    // every connection cache a prepared statement per size (8 MB in a hub that
    // had served 1,000 agents, kept after they left).
    let column =
        |f: fn(&CounterRow) -> u64| -> Vec<i64> { rows.iter().map(|r| f(r) as i64).collect() };
    let done = sqlx::query(
        "INSERT INTO link_counters (topology_id, link, node, connected, tx_bytes, tx_packets, rx_bytes, rx_packets, drops, connects, \
          drops_queue, drops_aqm, drops_loss, drops_loop, ecn_marks, queue_packets, queue_bytes, late_packets, unfaithful) \
         SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bool[], $5::bigint[], $6::bigint[], $7::bigint[], \
          $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[], $14::bigint[], $15::bigint[], \
          $16::bigint[], $17::bigint[], $18::bigint[], $19::text[]) \
         ON CONFLICT (topology_id, link, node) DO UPDATE SET connected = EXCLUDED.connected, \
          tx_bytes = EXCLUDED.tx_bytes, tx_packets = EXCLUDED.tx_packets, rx_bytes = EXCLUDED.rx_bytes, \
          rx_packets = EXCLUDED.rx_packets, drops = EXCLUDED.drops, connects = EXCLUDED.connects, \
          drops_queue = EXCLUDED.drops_queue, drops_aqm = EXCLUDED.drops_aqm, drops_loss = EXCLUDED.drops_loss, drops_loop = EXCLUDED.drops_loop, \
          ecn_marks = EXCLUDED.ecn_marks, queue_packets = EXCLUDED.queue_packets, queue_bytes = EXCLUDED.queue_bytes, \
          late_packets = EXCLUDED.late_packets, unfaithful = EXCLUDED.unfaithful, updated_at = now()",
    )
    .bind(rows.iter().map(|r| r.topology_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.link.as_str()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.node.as_str()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.connected).collect::<Vec<_>>())
    .bind(column(|r| r.tx_bytes))
    .bind(column(|r| r.tx_packets))
    .bind(column(|r| r.rx_bytes))
    .bind(column(|r| r.rx_packets))
    .bind(column(|r| r.drops))
    .bind(column(|r| r.connects))
    .bind(column(|r| r.drops_queue))
    .bind(column(|r| r.drops_aqm))
    .bind(column(|r| r.drops_loss))
    .bind(column(|r| r.drops_loop))
    .bind(column(|r| r.ecn_marks))
    .bind(column(|r| r.queue_packets))
    .bind(column(|r| r.queue_bytes))
    .bind(column(|r| r.late_packets))
    .bind(rows.iter().map(|r| r.unfaithful.as_str()).collect::<Vec<_>>())
    .execute(pool)
    .await;
    match done {
        Ok(_) => Ok(()),
        // A topology deleted between report and write violates the foreign key;
        // that batch is stale, not an error worth failing the hub for.
        Err(e) if is_foreign_key_violation(&e) => {
            tracing::debug!("dropped counters of a deleted topology");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

pub(super) fn is_foreign_key_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == "23503")
}
