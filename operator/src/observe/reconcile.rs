//! Reconciles counted by the hub. `nextmini up` runs in its own process, so it
//! tells the hub through PostgreSQL (a NOTIFY, nothing stored) how its apply
//! ended; the hub counts it in `nextmini_hub_reconciles_total{result}`. An
//! in-process controller calls [`HubMetrics::reconciled`] directly instead.

use super::hub_metrics::{HubMetrics, ReconcileResult};
use crate::store::Store;
use std::sync::Arc;
use std::time::Duration;

pub const RECONCILE_CHANNEL: &str = "nextmini_reconcile";

/// The notification payload: `<result> <seconds>`.
fn payload(result: ReconcileResult, took: Duration) -> String {
    format!("{} {:.6}", result.as_str(), took.as_secs_f64())
}

fn parse(payload: &str) -> Option<(ReconcileResult, Duration)> {
    let (result, seconds) = payload.split_once(' ')?;
    let seconds: f64 = seconds.parse().ok()?;
    let took = Duration::try_from_secs_f64(seconds).ok()?;
    Some((ReconcileResult::parse(result)?, took))
}

/// Tells a listening hub that an apply ended. Nobody listening is not an error:
/// the notification is simply lost, as is the count.
pub async fn announce(
    store: &Store,
    result: ReconcileResult,
    took: Duration,
) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(RECONCILE_CHANNEL)
        .bind(payload(result, took))
        .execute(store.pool())
        .await?;
    Ok(())
}

/// Counts announced reconciles into `metrics` until dropped, reconnecting with
/// backoff when the database connection is lost.
pub async fn listen(store: Store, metrics: Arc<HubMetrics>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match listen_once(&store, &metrics, &mut backoff).await {
            Ok(()) => {}
            Err(e) => tracing::warn!(error = %e, "reconcile listener failed; reconnecting"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn listen_once(
    store: &Store,
    metrics: &HubMetrics,
    backoff: &mut Duration,
) -> Result<(), sqlx::Error> {
    let mut listener = sqlx::postgres::PgListener::connect_with(store.pool()).await?;
    listener.listen(RECONCILE_CHANNEL).await?;
    *backoff = Duration::from_millis(100);
    loop {
        let n = listener.recv().await?;
        match parse(n.payload()) {
            Some((result, took)) => metrics.reconciled(result, took),
            None => tracing::debug!(payload = n.payload(), "ignoring malformed reconcile notice"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_round_trips() {
        let took = Duration::from_millis(1234);
        let (r, t) = parse(&payload(ReconcileResult::Failed, took)).expect("parses");
        assert_eq!(r, ReconcileResult::Failed);
        assert!((t.as_secs_f64() - 1.234).abs() < 1e-6);
        for bad in ["", "applied", "done 1", "applied -1", "applied x"] {
            assert!(parse(bad).is_none(), "{bad:?}");
        }
    }
}
