//! The metrics history: every report's counters as a time series, inserted in
//! batches and trimmed to the retention the `settings` table names.

use super::{CounterRow, Result};
use sqlx::PgPool;

/// Inserts the whole batch or nothing, so a retried batch is never stored twice.
pub(super) async fn insert(pool: &PgPool, rows: &[CounterRow]) -> Result<()> {
    let mut tx = pool.begin().await?;
    for chunk in rows.chunks(2000) {
        let mut qb = sqlx::QueryBuilder::new(
            "INSERT INTO link_metrics (topology_id, link, node, at, connected, tx_bytes, tx_packets, rx_bytes, \
             rx_packets, drops, ecn_marks, queue_packets, queue_bytes, rtt_us) ",
        );
        qb.push_values(chunk, |mut b, r| {
            b.push_bind(r.topology_id)
                .push_bind(&r.link)
                .push_bind(&r.node)
                .push_bind(r.at)
                .push_bind(r.connected)
                .push_bind(r.tx_bytes as i64)
                .push_bind(r.tx_packets as i64)
                .push_bind(r.rx_bytes as i64)
                .push_bind(r.rx_packets as i64)
                .push_bind((r.drops + r.drops_queue + r.drops_aqm + r.drops_loss) as i64)
                .push_bind(r.ecn_marks as i64)
                .push_bind(r.queue_packets as i64)
                .push_bind(r.queue_bytes as i64)
                .push_bind((r.rtt_us > 0).then_some(r.rtt_us as i64));
        });
        qb.build().execute(&mut *tx).await?;
    }
    tx.commit().await?;
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
