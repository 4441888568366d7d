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
    for topology in store.topology_names().await? {
        let Some(status) = store.status(&topology).await? else {
            continue;
        };
        if status.runtime != "netns" {
            continue;
        }
        let Some((plan, _)) = store.load_plan(&topology).await? else {
            continue;
        };
        for node in &status.nodes {
            let Some(pid) = node.pid else { continue };
            if super::scenario_nodes::is_held(held, &topology, &node.name) {
                continue;
            }
            let ns = names::netns(&topology, &node.name);
            let dead = !process::is_running(pid as u32) && process::find_agents_in(&ns).is_empty();
            if !dead || !netlink::netns_path(&ns).exists() {
                continue;
            }
            let Some(planned) = plan.node(&node.name) else {
                continue;
            };
            match runtime.start_agent(&topology, planned) {
                // `down` may have deleted the rows (and be sweeping the namespace)
                // since the status was read: the pid is recorded only over the dead
                // one, and an agent nobody recorded is stopped again.
                Ok(new_pid) => {
                    if store
                        .replace_node_pid(&topology, &node.name, pid, new_pid as i32)
                        .await?
                    {
                        tracing::warn!(%topology, node = %node.name, old_pid = pid, new_pid, "agent died; restarted it");
                    } else {
                        tracing::info!(%topology, node = %node.name, "node removed while its agent restarted; stopping it");
                        tokio::task::spawn_blocking(move || {
                            process::stop(&[new_pid], Duration::from_secs(2))
                        })
                        .await?;
                    }
                }
                Err(e) => {
                    tracing::warn!(%topology, node = %node.name, error = %e, "restarting agent failed")
                }
            }
        }
    }
    Ok(())
}
