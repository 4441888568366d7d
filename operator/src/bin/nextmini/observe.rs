//! The CLI's side of observability: the hub's metrics endpoint at start-up,
//! tidying agents' metrics sockets away with their topology, and telling the hub
//! how an `up` ended.

use crate::local::Local;
use nextmini_operator::hub::Hub;
use nextmini_operator::observe::{self, ReconcileResult, endpoint, reconcile, sockets};
use nextmini_operator::store::Store;
use std::time::Duration;

/// Starts the metrics endpoint (unless `--metrics-addr off`) and the reconcile
/// counter. A port in use is a warning: the hub serves agents regardless.
pub async fn start_for_hub(local: &Local, hub: &Hub, store: &Store) {
    tokio::spawn(reconcile::listen(store.clone(), hub.metrics()));
    let Some(addr) = local.metrics_addr.0 else {
        return;
    };
    match endpoint::start(hub.clone(), &local.state_dir, addr).await {
        Ok(bound) => tracing::info!(
            "metrics on http://{bound}/metrics (targets for file discovery in {})",
            observe::targets::targets_file(&local.state_dir).display()
        ),
        Err(e) => tracing::warn!(
            %addr,
            error = %e,
            "cannot serve metrics (set --metrics-addr or NEXTMINI_METRICS_ADDR to another address)"
        ),
    }
}

/// Removes what the hub wrote for scrapers once it stops.
pub fn hub_stopped(local: &Local) {
    let _ = std::fs::remove_file(observe::address_file(&local.state_dir));
    let _ = std::fs::remove_file(observe::targets::targets_file(&local.state_dir));
}

/// Removes the sockets directory of a topology that is gone (its agents remove
/// their own sockets when stopped politely; this covers `kill -9`).
pub fn forget_topology(local: &Local, topology: &str) {
    if sockets::is_plain_key(topology) {
        let _ = std::fs::remove_dir_all(sockets::metrics_dir(&local.state_dir).join(topology));
    }
}

/// Counts an `up` in the hub's `nextmini_hub_reconciles_total`. An `up` that
/// failed before the database was started has nobody to tell.
pub async fn record_reconcile(local: &Local, outcome: &anyhow::Result<i32>, took: Duration) {
    let result = match outcome {
        Ok(0) => ReconcileResult::Applied,
        _ => ReconcileResult::Failed,
    };
    let store = match local.existing_store().await {
        Ok(Some(s)) => s,
        Ok(None) => return,
        Err(e) => {
            tracing::debug!(error = %e, "no store to report the reconcile to");
            return;
        }
    };
    if let Err(e) = reconcile::announce(&store, result, took).await {
        tracing::debug!(error = %e, "reporting the reconcile failed");
    }
}

/// Each named topology's load (`None` for one that vanished meanwhile).
pub async fn loads(
    store: &Store,
    names: &[String],
) -> anyhow::Result<Vec<Option<observe::load::TopologyLoad>>> {
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        out.push(observe::load::load(store, name).await?);
    }
    Ok(out)
}

/// The status rows as JSON, each link with its `load` (per direction: rate,
/// configured rate, utilisation, drops per second, queue, RTT).
pub fn with_load(
    rows: &[nextmini_operator::store::TopologyStatusRow],
    loads: &[Option<observe::load::TopologyLoad>],
) -> anyhow::Result<serde_json::Value> {
    let mut doc = serde_json::to_value(rows)?;
    let Some(topologies) = doc.as_array_mut() else {
        return Ok(doc);
    };
    for (t, load) in topologies.iter_mut().zip(loads) {
        let Some(links) = t.get_mut("links").and_then(|l| l.as_array_mut()) else {
            continue;
        };
        for link in links {
            let found = load.as_ref().and_then(|l| {
                l.links
                    .iter()
                    .find(|x| link.get("name").and_then(|n| n.as_str()) == Some(x.name.as_str()))
            });
            if let (Some(found), Some(obj)) = (found, link.as_object_mut()) {
                let direction = |d: &observe::load::DirectionLoad| {
                    let mut v = serde_json::to_value(d).unwrap_or_default();
                    if let Some(o) = v.as_object_mut() {
                        o.insert("utilisation".into(), serde_json::json!(d.utilisation()));
                    }
                    v
                };
                obj.insert(
                    "load".into(),
                    serde_json::json!({
                        "forward": direction(&found.forward),
                        "backward": direction(&found.backward),
                    }),
                );
            }
        }
    }
    Ok(doc)
}

/// The `LOAD →` and `LOAD ←` cells of a link in `status`.
pub fn load_columns(load: Option<&observe::load::TopologyLoad>, link: &str) -> (String, String) {
    load.and_then(|l| l.links.iter().find(|x| x.name == link))
        .map(|l| {
            (
                observe::format::load(&l.forward),
                observe::format::load(&l.backward),
            )
        })
        .unwrap_or_else(|| ("-".into(), "-".into()))
}
