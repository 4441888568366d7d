//! Collects counter reports from all sessions and writes them in batches, so a
//! thousand agents reporting every 100 ms cost a few statements, not thousands.
//! Every row received is written or counted as dropped, with the reason, in
//! `nextmini_hub_counter_rows_dropped_total`.

use crate::observe::{HubMetrics, RowDrop};
use crate::store::{CounterRow, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

const MAX_BATCH: usize = 4096;
const FLUSH_EVERY: Duration = Duration::from_millis(200);
/// Rows kept while PostgreSQL is unreachable; beyond that the oldest go.
const MAX_PENDING: usize = 4 * MAX_BATCH;

#[derive(Clone)]
pub struct CounterBatcher {
    tx: mpsc::Sender<Vec<CounterRow>>,
    metrics: Arc<HubMetrics>,
}

impl CounterBatcher {
    pub fn spawn(store: Store, metrics: Arc<HubMetrics>) -> CounterBatcher {
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(run(store, rx, metrics.clone()));
        CounterBatcher { tx, metrics }
    }

    /// Queues rows; waits when the writer is behind, which slows the reporting
    /// session's stream instead of dropping counters.
    pub async fn push(&self, rows: Vec<CounterRow>) {
        if let Err(mpsc::error::SendError(rows)) = self.tx.send(rows).await {
            tracing::warn!(
                rows = rows.len(),
                "counter writer has stopped; report dropped"
            );
            self.metrics
                .counter_rows_dropped(RowDrop::WriterStopped, rows.len());
        }
    }
}

async fn run(store: Store, mut rx: mpsc::Receiver<Vec<CounterRow>>, metrics: Arc<HubMetrics>) {
    let mut pending: Vec<CounterRow> = Vec::new();
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    loop {
        tokio::select! {
            rows = rx.recv() => match rows {
                Some(rows) => {
                    pending.extend(rows);
                    if pending.len() >= MAX_BATCH {
                        flush(&store, &mut pending, &metrics).await;
                    }
                }
                None => {
                    flush(&store, &mut pending, &metrics).await;
                    if !pending.is_empty() {
                        metrics.counter_rows_dropped(RowDrop::WriterStopped, pending.len());
                    }
                    return;
                }
            },
            _ = tick.tick() => flush(&store, &mut pending, &metrics).await,
        }
    }
}

async fn flush(store: &Store, pending: &mut Vec<CounterRow>, metrics: &HubMetrics) {
    if pending.is_empty() {
        return;
    }
    let started = Instant::now();
    // The history first: if it fails the batch is retried whole, and the latest
    // values are written again with it (an upsert, so never twice).
    let written = match store.record_metrics(pending).await {
        Ok(left_out) => store.record_counters(pending).await.map(|()| left_out),
        Err(e) => Err(e),
    };
    metrics.observe_db_write(started.elapsed());
    match written {
        Ok(left_out) => {
            let left_out = left_out as usize;
            metrics.counter_rows_written(pending.len() - left_out);
            if left_out > 0 {
                tracing::info!(rows = left_out, "counters of deleted topologies not stored");
                metrics.counter_rows_dropped(RowDrop::TopologyDeleted, left_out);
            }
            pending.clear();
        }
        Err(e) => {
            // Keep the rows and retry on the next tick; bound the buffer so an
            // outage cannot grow it without limit (the oldest samples go first).
            tracing::warn!(error = %e, rows = pending.len(), "writing counters failed; will retry");
            if pending.len() > MAX_PENDING {
                let excess = pending.len() - MAX_PENDING;
                pending.drain(..excess);
                tracing::warn!(
                    rows = excess,
                    "counter buffer full while the database is unreachable; oldest samples dropped"
                );
                metrics.counter_rows_dropped(RowDrop::DbBacklog, excess);
            }
        }
    }
}
