//! Checks a view the hub built from part of the store (routes, or links
//! changed in place: issue 16.4) against every stored row, off the change's
//! path. The triggers that stamp changed links do not run for a row written
//! behind them (`session_replication_role = replica`, a restore); such a row
//! would otherwise run unseen until the next full load. When the rows say
//! something else than the view, the hub moves the topology's generation,
//! which reloads it in full and brings the agents to it.

use super::{Hub, TopologyView, repair};
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::Mutex;

/// How long a check waits after the change it follows: the changed agents'
/// deltas and acknowledgements go first.
const CHECK_AFTER: Duration = Duration::from_millis(200);

/// Topologies with a check running, and whether another was asked for
/// meanwhile (checks of one topology never overlap; one more runs after).
#[derive(Default)]
pub struct Checks {
    running: Mutex<HashMap<String, bool>>,
}

impl Hub {
    /// Checks `topology`'s current view against the store soon, unless a
    /// check is running, which then runs once more.
    pub(super) async fn check_view_soon(&self, topology: &str) {
        {
            let mut running = self.inner.checks.running.lock().await;
            if let Some(again) = running.get_mut(topology) {
                *again = true;
                return;
            }
            running.insert(topology.to_string(), false);
        }
        let hub = self.clone();
        let topology = topology.to_string();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(CHECK_AFTER).await;
                hub.check_view(&topology).await;
                let mut running = hub.inner.checks.running.lock().await;
                match running.get_mut(&topology) {
                    Some(again) if *again => *again = false,
                    _ => {
                        running.remove(&topology);
                        return;
                    }
                }
            }
        });
    }

    async fn check_view(&self, topology: &str) {
        let Some(view) = self.inner.views.lock().await.get(topology).cloned() else {
            return;
        };
        // The bulk pool: a full load at 10,000 nodes must not hold the
        // connections the next change reads through.
        let store = &self.inner.store;
        let loaded = match store.load_checked(topology).await {
            Ok(Some(loaded)) => loaded,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(%topology, error = %e, "checking the served view against the store failed");
                return;
            }
        };
        // A later generation is checked after its own change, or loaded in full.
        if loaded.version.id != view.topology_id || loaded.version.generation != view.generation {
            return;
        }
        if agrees(&view, loaded.plan, &loaded.faults) {
            return;
        }
        tracing::warn!(%topology, generation = view.generation, "stored rows differ from what this generation was served as (written behind the database's triggers?): loading the topology in full");
        if let Err(e) = store
            .move_generation(view.topology_id, view.generation)
            .await
        {
            tracing::warn!(%topology, error = %e, "moving the generation after a failed check failed");
        }
    }
}

/// Whether a full load (`plan` with its `faults`) gives what `view` serves:
/// the same plan once faulty rows run what the view runs for them, and the
/// same faulty rows.
fn agrees(
    view: &TopologyView,
    mut plan: crate::plan::Plan,
    faults: &[crate::store::RowFault],
) -> bool {
    let problems = repair::put_back(&mut plan, faults, Some(view));
    // What runs instead depends on the view a fault was first met in; the
    // faults themselves must be the same.
    let key = |p: &crate::store::TopologyProblem| (p.subject.clone(), p.problem.clone());
    let mut found: Vec<_> = problems.iter().map(key).collect();
    let mut served: Vec<_> = view.plan_problems.iter().map(key).collect();
    found.sort();
    served.sort();
    plan == *view.plan && found == served
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fixtures::line3;
    use crate::store::{FaultyPart, RowFault};

    #[test]
    fn a_row_changed_behind_the_triggers_is_found() {
        let view = TopologyView::new(line3(), 3);
        assert!(agrees(&view, line3(), &[]));

        let mut changed = line3();
        changed.link_mut(0).forward.rate_bps = Some(1_000_000);
        assert!(!agrees(&view, changed, &[]), "a valid value nobody stamped");

        // A faulty row runs the view's value: only the new fault differs.
        let fault = RowFault {
            part: FaultyPart::LinkForward(line3().links[0].name.clone()),
            subject: format!("links {} params_forward", line3().links[0].name),
            problem: "params_forward.rate_bps: must be an integer or null".into(),
        };
        assert!(!agrees(&view, line3(), std::slice::from_ref(&fault)));
        let mut faulty = view_with_problem(&fault);
        faulty.generation = 4;
        assert!(agrees(&faulty, line3(), &[fault]));
    }

    fn view_with_problem(fault: &RowFault) -> TopologyView {
        let mut view = TopologyView::new(line3(), 3);
        view.plan_problems = vec![crate::store::TopologyProblem {
            subject: fault.subject.clone(),
            problem: fault.problem.clone(),
            consequence: "runs its last good parameters".into(),
        }];
        view
    }
}
