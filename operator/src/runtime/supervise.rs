//! Restarts agents that died (local mode): a node whose row names an agent pid
//! that no longer runs, while its namespace is still there, gets a new agent with
//! the same credential, and the new pid is recorded. Nodes being made (no pid
//! recorded yet) or removed (row already deleted) are never touched, so this
//! cannot race `up` or `down`.

use super::netns::NetnsRuntime;
use super::{names, netlink, process};
use crate::store::Store;
use std::time::Duration;

/// `held`: nodes a timed scenario killed, left down until it restarts them.
pub async fn run(
    runtime: NetnsRuntime,
    store: Store,
    held: super::scenario_nodes::Held,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        if let Err(e) = sweep(&runtime, &store, &held).await {
            tracing::debug!(error = %e, "supervisor pass failed");
        }
    }
}

async fn sweep(
    runtime: &NetnsRuntime,
    store: &Store,
    held: &super::scenario_nodes::Held,
) -> anyhow::Result<()> {
    // Agents with a session are alive (the hub sees a killed agent's stream
    // end at once): only the others are looked at, and a topology's plan is
    // read only when one of its agents is found dead. Reading every node's
    // status and plan twice a second cost the hub and PostgreSQL a tenth of
    // the machine at 2,000 idle nodes.
    let mut plans: std::collections::HashMap<String, Option<crate::plan::Plan>> =
        std::collections::HashMap::new();
    for (topology, node, pid) in store.agents_without_session("netns").await? {
        if super::scenario_nodes::is_held(held, &topology, &node) {
            continue;
        }
        let ns = names::netns(&topology, &node);
        let dead = !process::is_running(pid as u32) && process::find_agents_in(&ns).is_empty();
        if !dead || !netlink::netns_exists(&ns) {
            continue;
        }
        if !plans.contains_key(&topology) {
            let plan = store.load_plan(&topology).await?.map(|(plan, _)| plan);
            plans.insert(topology.clone(), plan);
        }
        let Some(Some(planned)) = plans
            .get(&topology)
            .map(|p| p.as_ref().and_then(|p| p.node(&node)))
        else {
            continue;
        };
        match runtime.start_agent(&topology, planned) {
            // `down` may have deleted the rows (and be sweeping the namespace)
            // since the status was read: the pid is recorded only over the dead
            // one, and an agent nobody recorded is stopped again.
            Ok(new_pid) => {
                if store
                    .replace_node_pid(&topology, &node, pid, new_pid as i32)
                    .await?
                {
                    tracing::warn!(%topology, node = %node, old_pid = pid, new_pid, "agent died; restarted it");
                } else {
                    tracing::info!(%topology, node = %node, "node removed while its agent restarted; stopping it");
                    tokio::task::spawn_blocking(move || {
                        process::stop(&[new_pid], Duration::from_secs(2))
                    })
                    .await?;
                }
            }
            Err(e) => {
                tracing::warn!(%topology, node = %node, error = %e, "restarting agent failed")
            }
        }
    }
    Ok(())
}
