//! Timed scenarios' node events in namespace mode: at a `kill` event's
//! instant the node's agent is killed (SIGKILL) and held down, so the
//! supervisor does not restart it; at a `restart` event's instant it is
//! started again. The hub process runs this beside the supervisor, with its
//! own timer per event, and records when each took effect in
//! `scenario_applied` (node = the event's node).

use super::netns::NetnsRuntime;
use super::{names, process};
use crate::store::{AppliedRow, PendingNodeEvent, Store};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// (topology, node) whose agent a scenario killed: the supervisor leaves
/// them down until the scenario restarts them.
pub type Held = Arc<Mutex<HashSet<(String, String)>>>;

/// Whether the scenario holds the node's agent down.
pub fn is_held(held: &Held, topology: &str, node: &str) -> bool {
    held.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .contains(&(topology.to_string(), node.to_string()))
}

fn set_held(held: &Held, topology: &str, node: &str, down: bool) {
    let mut held = held
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let key = (topology.to_string(), node.to_string());
    if down {
        held.insert(key);
    } else {
        held.remove(&key);
    }
}

/// Looks for node events of started scenarios every `every`, and schedules
/// each one once.
pub async fn run(runtime: NetnsRuntime, store: Store, held: Held, every: Duration) {
    let runtime = Arc::new(runtime);
    let mut scheduled: HashSet<(i64, i32)> = HashSet::new();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let pending = match store.pending_node_events("netns").await {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "reading scenario node events failed");
                continue;
            }
        };
        for event in pending {
            if !scheduled.insert((event.topology_id, event.idx)) {
                continue;
            }
            let (runtime, store, held) = (runtime.clone(), store.clone(), held.clone());
            tokio::spawn(async move {
                // Everything the database gives is read ahead, so the instant
                // costs only a signal or a spawn.
                let prepared = prepare(&store, &event).await;
                let wait = (event.planned_at - chrono::Utc::now())
                    .to_std()
                    .unwrap_or_default();
                tokio::time::sleep(wait).await;
                let (applied_at, error) = match prepared {
                    Ok(p) => act(&runtime, &store, &held, &event, p).await,
                    Err(e) => (chrono::Utc::now(), format!("{e:#}")),
                };
                let skew_ms = (applied_at - event.planned_at)
                    .num_microseconds()
                    .unwrap_or(0) as f64
                    / 1000.0;
                if error.is_empty() {
                    tracing::info!(topology = %event.topology, node = %event.node, restart = event.restart, skew_ms, "scenario node event applied");
                } else {
                    tracing::warn!(topology = %event.topology, node = %event.node, %error, "scenario node event failed");
                }
                let row = AppliedRow {
                    idx: event.idx,
                    planned_at: event.planned_at,
                    applied_at,
                    error,
                };
                if let Err(e) = store
                    .record_scenario_applied(event.topology_id, &event.node, &[row])
                    .await
                {
                    tracing::warn!(error = %e, "storing a scenario node event failed");
                }
            });
        }
    }
}

/// What an event needs from the database: the node as planned (to start
/// it), read before its instant.
struct Prepared {
    planned: crate::plan::PlannedNode,
    /// The node's agents a moment before the instant.
    agents: Vec<u32>,
}

async fn prepare(store: &Store, event: &PendingNodeEvent) -> anyhow::Result<Prepared> {
    let (plan, _) = store
        .load_plan(&event.topology)
        .await?
        .ok_or_else(|| anyhow::anyhow!("topology {} is gone", event.topology))?;
    let planned = plan
        .node(&event.node)
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("node {} is not planned", event.node))?;
    let agents = process::find_agents_in(&names::netns(&event.topology, &event.node));
    Ok(Prepared { planned, agents })
}

/// Applies the event; returns when it took effect (the signal sent, the
/// process spawned) and why it failed, if it did.
async fn act(
    runtime: &NetnsRuntime,
    store: &Store,
    held: &Held,
    event: &PendingNodeEvent,
    prepared: Prepared,
) -> (chrono::DateTime<chrono::Utc>, String) {
    let (topology, node) = (event.topology.as_str(), event.node.as_str());
    let ns = names::netns(topology, node);
    let kill = |pids: &[u32]| {
        pids.iter()
            .filter(|pid| {
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(**pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .is_ok()
            })
            .count()
    };
    if !event.restart {
        // Held first: the supervisor must not see the dead agent unheld.
        set_held(held, topology, node, true);
        let killed = kill(&prepared.agents);
        let at = chrono::Utc::now();
        // One started since the look ahead (the supervisor's) goes too.
        let late = kill(&process::find_agents_in(&ns));
        return if killed + late == 0 {
            (at, format!("no agent of {node} was running"))
        } else {
            (at, String::new())
        };
    }
    let running = process::find_agents_in(&ns);
    set_held(held, topology, node, false);
    if !running.is_empty() {
        return (
            chrono::Utc::now(),
            format!("the agent of {node} runs already (pid {running:?})"),
        );
    }
    let new_pid = match runtime.start_agent(topology, &prepared.planned) {
        Ok(pid) => pid,
        Err(e) => return (chrono::Utc::now(), e.to_string()),
    };
    let at = chrono::Utc::now();
    if let Err(e) = record_pid(store, topology, node, new_pid).await {
        return (at, format!("{e:#}"));
    }
    (at, String::new())
}

/// Records the restarted agent's pid over the dead one, as the supervisor
/// does; stops it again when the node was removed meanwhile.
async fn record_pid(store: &Store, topology: &str, node: &str, new_pid: u32) -> anyhow::Result<()> {
    let old = store
        .status(topology)
        .await?
        .and_then(|s| s.nodes.into_iter().find(|n| n.name == node))
        .and_then(|n| n.pid)
        .unwrap_or(0);
    if !store
        .replace_node_pid(topology, node, old, new_pid as i32)
        .await?
    {
        tracing::info!(%topology, %node, "node removed while its agent restarted; stopping it");
        tokio::task::spawn_blocking(move || process::stop(&[new_pid], Duration::from_secs(2)))
            .await?;
    }
    Ok(())
}
