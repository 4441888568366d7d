//! The metrics history: every report's counters as a time series, inserted in
//! batches and trimmed to the retention the `settings` table names.

use super::counters::is_foreign_key_violation;
use super::{CounterRow, Result, StoreError};
use sqlx::PgPool;
use std::collections::HashSet;

/// Inserts the whole batch or nothing, so a retried batch is never stored twice.
/// Rows of topologies deleted since they were reported are left out (a row of a
/// deleted topology would otherwise fail the batch at every retry, and with it
/// every other topology's samples); returns how many were left out.
pub(super) async fn insert(pool: &PgPool, rows: &[CounterRow]) -> Result<u64> {
    match insert_all(pool, rows).await {
        Err(StoreError::Db(e)) if is_foreign_key_violation(&e) => {}
        other => return other.map(|()| 0),
    }
    let ids: Vec<i64> = rows.iter().map(|r| r.topology_id).collect();
    let live: HashSet<i64> = sqlx::query_scalar("SELECT id FROM topologies WHERE id = ANY($1)")
        .bind(&ids)
        .fetch_all(pool)
        .await?
        .into_iter()
        .collect();
    let kept: Vec<CounterRow> = rows
        .iter()
        .filter(|r| live.contains(&r.topology_id))
        .cloned()
        .collect();
    insert_all(pool, &kept).await?;
    Ok((rows.len() - kept.len()) as u64)
}

async fn insert_all(pool: &PgPool, rows: &[CounterRow]) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    // One statement for any batch size (see counters::upsert), and one
    // statement is all or nothing without a transaction.
    let column =
        |f: fn(&CounterRow) -> u64| -> Vec<i64> { rows.iter().map(|r| f(r) as i64).collect() };
    sqlx::query(
        "INSERT INTO link_metrics (topology_id, link, node, at, connected, tx_bytes, tx_packets, rx_bytes, \
         rx_packets, drops, ecn_marks, queue_packets, queue_bytes, rtt_us) \
         SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::timestamptz[], $5::bool[], $6::bigint[], \
         $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[], $14::bigint[])",
    )
    .bind(rows.iter().map(|r| r.topology_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.link.as_str()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.node.as_str()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.at).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.connected).collect::<Vec<_>>())
    .bind(column(|r| r.tx_bytes))
    .bind(column(|r| r.tx_packets))
    .bind(column(|r| r.rx_bytes))
    .bind(column(|r| r.rx_packets))
    .bind(column(|r| {
        r.drops + r.drops_queue + r.drops_aqm + r.drops_loss + r.drops_loop
    }))
    .bind(column(|r| r.ecn_marks))
    .bind(column(|r| r.queue_packets))
    .bind(column(|r| r.queue_bytes))
    .bind(
        rows.iter()
            .map(|r| (r.rtt_us > 0).then_some(r.rtt_us as i64))
            .collect::<Vec<_>>(),
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Deletes samples older than the `metrics_retention` setting; returns how many.
pub(super) async fn trim(pool: &PgPool) -> Result<u64> {
    let done = sqlx::query(
        "DELETE FROM link_metrics WHERE at < now() - \
         COALESCE((SELECT value::interval FROM settings WHERE key = 'metrics_retention'), interval '1 hour')",
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}
