//! Timed scenarios (Topology `spec.scenario`): the hub sends an agent the
//! events that touch it ahead of their instants, and the agent applies each
//! one itself at its instant with a timerfd, then reports when it took effect.
//! The hub's fan-out of a stored change takes milliseconds to hundreds of
//! milliseconds; a timer in every agent, against a shared wall clock, applies
//! an event on every agent it touches within a millisecond or so.
//!
//! What an event changed stays in force over later snapshots (`params_for`,
//! `reassert`): the stored link parameters are the scenario's starting point,
//! not a value to return to whenever the hub sends the config again.

use crate::link::LinkHandle;
use crate::listener::LinkMap;
use crate::timer::PreciseTimer;
use nextmini_proto::v1 as pb;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// The timer first wakes this long before an event and then aims again from
/// a fresh reading of the wall clock, so a long sleep's drift between the
/// monotonic and the wall clock does not reach the instant.
const REAIM: Duration = Duration::from_millis(20);

/// What the scenario has changed so far, per link: applied again after every
/// snapshot or delta, which carry the stored parameters.
#[derive(Debug, Default)]
struct Overrides {
    params: HashMap<String, pb::LinkParams>,
    down: HashSet<String>,
}

/// The agent's scenario runner: schedules events, keeps their effects, and
/// queues reports of when they took effect for the control stream.
pub struct Runner {
    links: LinkMap,
    overrides: Arc<Mutex<Overrides>>,
    /// (start, index) of every event scheduled, so a repeated Scenario message
    /// (after a reconnect) schedules nothing twice.
    known: HashSet<(u64, u32)>,
    reports_tx: mpsc::UnboundedSender<pb::ScenarioApplied>,
    reports_rx: Option<mpsc::UnboundedReceiver<pb::ScenarioApplied>>,
}

impl Runner {
    pub fn new(links: LinkMap) -> Runner {
        let (reports_tx, reports_rx) = mpsc::unbounded_channel();
        Runner {
            links,
            overrides: Arc::default(),
            known: HashSet::new(),
            reports_tx,
            reports_rx: Some(reports_rx),
        }
    }

    /// The reports of applied events, for the control loop to send (once).
    pub fn take_reports(&mut self) -> Option<mpsc::UnboundedReceiver<pb::ScenarioApplied>> {
        self.reports_rx.take()
    }

    /// Schedules the events not seen before, in order of their instants.
    pub fn schedule(&mut self, scenario: pb::Scenario, mtu: u32) {
        let start = scenario.start_unix_ns;
        let mut events: Vec<pb::ScenarioEvent> = scenario
            .events
            .into_iter()
            .filter(|e| self.known.insert((start, e.index)))
            .collect();
        if events.is_empty() {
            return;
        }
        events.sort_by_key(|e| (e.at_unix_ns, e.index));
        tracing::info!(
            start_unix_ns = start,
            events = events.len(),
            "scenario scheduled"
        );
        let task = Task {
            links: self.links.clone(),
            overrides: self.overrides.clone(),
            reports: self.reports_tx.clone(),
            mtu,
            start,
        };
        tokio::spawn(task.run(events));
    }

    /// The parameters the scenario set for `link`'s direction of this node,
    /// which a new config's stored ones do not replace.
    pub fn params_for(&self, link: &str) -> Option<pb::LinkParams> {
        lock(&self.overrides).params.get(link).cloned()
    }

    /// Takes the links the scenario holds down down again in a freshly built
    /// link set (a link rebuilt for a new connection identity starts up).
    pub fn reassert(&self) {
        let overrides = lock(&self.overrides);
        for link in self.links.load().values() {
            link.set_down(overrides.down.contains(&link.spec.name));
        }
    }
}

fn lock(overrides: &Mutex<Overrides>) -> std::sync::MutexGuard<'_, Overrides> {
    // A panic elsewhere while holding it leaves plain data behind; keep going.
    overrides
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct Task {
    links: LinkMap,
    overrides: Arc<Mutex<Overrides>>,
    reports: mpsc::UnboundedSender<pb::ScenarioApplied>,
    mtu: u32,
    start: u64,
}

impl Task {
    async fn run(self, events: Vec<pb::ScenarioEvent>) {
        let mut timer = match PreciseTimer::new() {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(error = %e, "no timerfd; scenario events use tokio's timer");
                None
            }
        };
        for event in events {
            wait_until(&mut timer, event.at_unix_ns).await;
            let error = self.apply(&event);
            let applied_unix_ns = unix_ns_now();
            let late_us = applied_unix_ns.saturating_sub(event.at_unix_ns) / 1000;
            match &error {
                Ok(what) => {
                    tracing::info!(index = event.index, link = %event.link, %what, late_us, "scenario event applied")
                }
                Err(e) => {
                    tracing::warn!(index = event.index, link = %event.link, error = %e, "scenario event failed")
                }
            }
            let report = pb::ScenarioApplied {
                start_unix_ns: self.start,
                events: vec![pb::AppliedEvent {
                    index: event.index,
                    applied_unix_ns,
                    error: error.err().unwrap_or_default(),
                }],
            };
            if self.reports.send(report).is_err() {
                return;
            }
        }
    }

    /// Applies one event to this node's end of its link; says what it did.
    fn apply(&self, event: &pb::ScenarioEvent) -> Result<&'static str, String> {
        let links = self.links.load();
        let link: &Arc<LinkHandle> = links
            .get(&event.link)
            .ok_or_else(|| format!("this node has no link {}", event.link))?;
        let mut overrides = lock(&self.overrides);
        match &event.change {
            Some(pb::scenario_event::Change::Params(params)) => {
                // The live-change path: the link task reconfigures its pipeline
                // in place, keeping queued packets and state.
                link.set_params(params.clone(), self.mtu)
                    .map_err(|e| format!("params.{}: {}", e.field, e.reason))?;
                overrides.params.insert(event.link.clone(), params.clone());
                Ok("parameters")
            }
            Some(pb::scenario_event::Change::Up(up)) => {
                link.set_down(!up);
                if *up {
                    overrides.down.remove(&event.link);
                    Ok("up")
                } else {
                    overrides.down.insert(event.link.clone());
                    Ok("down")
                }
            }
            None => Err("the event changes nothing".into()),
        }
    }
}

/// Sleeps until the wall-clock instant `at_unix_ns` (at once if it passed).
async fn wait_until(timer: &mut Option<PreciseTimer>, at_unix_ns: u64) {
    loop {
        let now = unix_ns_now();
        if now >= at_unix_ns {
            return;
        }
        let left = Duration::from_nanos(at_unix_ns - now);
        // Far away: wake a little early and aim again from a fresh reading.
        let (wait, last) = if left > REAIM * 2 {
            (left - REAIM, false)
        } else {
            (left, true)
        };
        let deadline = Instant::now() + wait;
        match timer {
            Some(t) => {
                if t.sleep_until(deadline).await.is_err() {
                    tokio::time::sleep_until(deadline.into()).await;
                }
            }
            None => tokio::time::sleep_until(deadline.into()).await,
        }
        if last {
            return;
        }
    }
}

fn unix_ns_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_until_the_wall_clock_instant() {
        let mut timer = PreciseTimer::new().ok();
        let mut worst = 0u64;
        for _ in 0..5 {
            let at = unix_ns_now() + 60_000_000;
            wait_until(&mut timer, at).await;
            let now = unix_ns_now();
            assert!(now >= at, "woke {} µs early", (at - now) / 1000);
            worst = worst.max(now - at);
        }
        assert!(worst < 5_000_000, "woke {} µs late", worst / 1000);
    }

    #[tokio::test]
    async fn an_event_for_a_missing_link_is_reported_with_its_error() {
        let links: LinkMap = Arc::default();
        let mut runner = Runner::new(links);
        let mut reports = runner.take_reports().expect("reports");
        let at = unix_ns_now();
        let scenario = pb::Scenario {
            start_unix_ns: at,
            events: vec![pb::ScenarioEvent {
                index: 3,
                at_unix_ns: at,
                link: "x-y".into(),
                change: Some(pb::scenario_event::Change::Up(false)),
            }],
        };
        runner.schedule(scenario.clone(), 1500);
        // The same scenario again (a reconnect) schedules nothing twice.
        runner.schedule(scenario, 1500);
        let report = reports.recv().await.expect("a report");
        assert_eq!(report.events[0].index, 3);
        assert!(report.events[0].error.contains("x-y"), "{report:?}");
        assert!(
            tokio::time::timeout(Duration::from_millis(100), reports.recv())
                .await
                .is_err(),
            "an event was applied twice"
        );
    }
}
