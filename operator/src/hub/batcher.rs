//! Collects counter reports from all sessions and writes them in batches, so a
//! thousand agents reporting every 100 ms cost a few statements, not thousands.

use crate::observe::HubMetrics;
use crate::store::{CounterRow, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

const MAX_BATCH: usize = 4096;
const FLUSH_EVERY: Duration = Duration::from_millis(200);

#[derive(Clone)]
pub struct CounterBatcher {
    tx: mpsc::Sender<Vec<CounterRow>>,
}

impl CounterBatcher {
    pub fn spawn(store: Store, metrics: Arc<HubMetrics>) -> CounterBatcher {
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(run(store, rx, metrics));
        CounterBatcher { tx }
    }

    /// Queues rows; waits when the writer is behind, which slows the reporting
    /// session's stream instead of dropping counters.
    pub async fn push(&self, rows: Vec<CounterRow>) {
        if self.tx.send(rows).await.is_err() {
            tracing::warn!("counter writer has stopped; report dropped");
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
        Ok(()) => store.record_counters(pending).await,
        Err(e) => Err(e),
    };
    metrics.observe_db_write(started.elapsed());
    match written {
        Ok(()) => pending.clear(),
        Err(e) => {
            // Keep the rows and retry on the next tick; bound the buffer so an
            // outage cannot grow it without limit (the oldest samples go first).
            tracing::warn!(error = %e, rows = pending.len(), "writing counters failed; will retry");
            if pending.len() > 4 * MAX_BATCH {
                let excess = pending.len() - 4 * MAX_BATCH;
                pending.drain(..excess);
            }
        }
    }
}
