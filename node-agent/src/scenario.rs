//! Timed scenarios (Topology `spec.scenario`): the hub sends an agent the
//! events that touch it ahead of their instants, and the agent applies each
//! one itself at its instant with a timerfd, then reports when it took effect.
//! The hub's fan-out of a stored change takes milliseconds to hundreds of
//! milliseconds; a timer in every agent, against a shared wall clock, applies
//! an event on every agent it touches within a millisecond or so.
//!
//! What an event changed stays in force over later snapshots (`params_for`,
//! `reassert`, `install_routes`): the stored link parameters and routes are
//! the scenario's starting point, not a value to return to whenever the hub
//! sends the config again.

use crate::link::LinkHandle;
use crate::listener::LinkMap;
use crate::processor::Routes;
use crate::routing::RouteTable;
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

/// What the scenario has changed so far: applied again after every snapshot
/// or delta, which carry the stored parameters and routes.
#[derive(Default)]
struct Overrides {
    params: HashMap<String, pb::LinkParams>,
    down: HashSet<String>,
    /// Route events' rules in force, oldest first.
    rules: Vec<pb::FlowRule>,
    /// The table the hub's config gives, without the rules above: what a
    /// route event layers its rules on.
    base: Option<Arc<RouteTable<Arc<LinkHandle>>>>,
}

impl Overrides {
    /// Installs the base table with the scenario's rules on top; says which
    /// rules could not apply.
    fn install(&self, routes: &Routes) -> Vec<String> {
        let Some(base) = &self.base else {
            return Vec::new();
        };
        let (table, refused) = RouteTable::clone(base).with_rule_overrides(&self.rules);
        routes.store(Arc::new(table));
        refused.into_iter().map(|(_, e)| e.to_string()).collect()
    }
}

/// Whether two rules match the same traffic (a later one replaces the other).
fn same_match(a: &pb::FlowRule, b: &pb::FlowRule) -> bool {
    (&a.src_addr, &a.dst_addr, a.src_port, a.dst_port, a.protocol)
        == (&b.src_addr, &b.dst_addr, b.src_port, b.dst_port, b.protocol)
}

/// The agent's scenario runner: schedules events, keeps their effects, and
/// queues reports of when they took effect for the control stream.
pub struct Runner {
    links: LinkMap,
    routes: Routes,
    overrides: Arc<Mutex<Overrides>>,
    /// (start, index) of every event scheduled, so a repeated Scenario message
    /// (after a reconnect) schedules nothing twice.
    known: HashSet<(u64, u32)>,
    reports_tx: mpsc::UnboundedSender<pb::ScenarioApplied>,
    reports_rx: Option<mpsc::UnboundedReceiver<pb::ScenarioApplied>>,
}

impl Runner {
    pub fn new(links: LinkMap, routes: Routes) -> Runner {
        let (reports_tx, reports_rx) = mpsc::unbounded_channel();
        Runner {
            links,
            routes,
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
            routes: self.routes.clone(),
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

    /// Installs a route table built from the hub's config, with the route
    /// events' rules in force on top. Under the same lock as an event's
    /// change, so an event at the same moment is not lost to the swap.
    pub fn install_routes(&self, table: RouteTable<Arc<LinkHandle>>) {
        let mut overrides = lock(&self.overrides);
        overrides.base = Some(Arc::new(table));
        for error in overrides.install(&self.routes) {
            tracing::warn!(%error, "a scenario route rule no longer applies to the new routes");
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
    routes: Routes,
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

    /// Applies one event to this node's end of its link, or to its routes;
    /// says what it did.
    fn apply(&self, event: &pb::ScenarioEvent) -> Result<&'static str, String> {
        if let Some(pb::scenario_event::Change::Route(rule)) = &event.change {
            return self.apply_route(rule);
        }
        if let Some(pb::scenario_event::Change::Kill(true)) = &event.change {
            // The process dies as a SIGKILLed one would (no shutdown, the
            // kernel closes its sockets); exit rather than a signal, since
            // PID 1 of a container ignores a SIGKILL it sends itself. The hub
            // records the kill when it sees the stream end.
            tracing::warn!(index = event.index, "killed by the scenario");
            std::process::exit(137);
        }
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
            Some(pb::scenario_event::Change::Route(_) | pb::scenario_event::Change::Kill(_))
            | None => Err("the event changes nothing".into()),
        }
    }

    /// A route event: the rule replaces the scenario's rule with the same
    /// match (route 0 ends it) and the table is swapped in one store.
    fn apply_route(&self, rule: &pb::FlowRule) -> Result<&'static str, String> {
        let mut overrides = lock(&self.overrides);
        if overrides.base.is_none() {
            return Err("this node has no routes yet".into());
        }
        let before = std::mem::take(&mut overrides.rules);
        let mut rules: Vec<pb::FlowRule> = before
            .iter()
            .filter(|r| !same_match(r, rule))
            .cloned()
            .collect();
        let ends = rule.route_id == 0 && rule.choices.is_empty();
        if !ends {
            rules.push(rule.clone());
        }
        overrides.rules = rules;
        let refused = overrides.install(&self.routes);
        if !refused.is_empty() {
            // Only the new rule can fail here: the others applied before.
            overrides.rules = before;
            overrides.install(&self.routes);
            return Err(format!("route: {}", refused.join("; ")));
        }
        Ok(if ends { "route ended" } else { "route" })
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
        let mut runner = Runner::new(links, Arc::default());
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

    #[tokio::test]
    async fn route_events_swap_the_table_at_the_source_and_survive_new_configs() {
        use crate::flow::FlowKey;
        use crate::routing::Decision;
        use std::net::{IpAddr, Ipv4Addr};
        let routes: Routes = Arc::default();
        let mut runner = Runner::new(Arc::default(), routes.clone());
        let mut reports = runner.take_reports().expect("reports");
        // A table with no destination routes and one label route ending here,
        // so the decisions need no links: only a rule makes traffic Local.
        let table = || {
            RouteTable::from_proto(
                &pb::RouteTable {
                    labels: vec![pb::LabelRoute {
                        route_id: 7,
                        next_link: String::new(),
                    }],
                    ..Default::default()
                },
                |_| None,
            )
            .expect("valid table")
        };
        runner.install_routes(table());
        let key = FlowKey {
            src: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)),
            dst: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 3)),
            protocol: 6,
            src_port: 40000,
            dst_port: 5201,
        };
        let decision = || routes.load().lookup(&key, 0);
        assert!(matches!(decision(), Decision::Drop(_)));
        let rule = |route_id: u32| pb::FlowRule {
            src_addr: "198.18.0.1".into(),
            dst_addr: "198.18.0.3".into(),
            dst_port: 5201,
            protocol: 6,
            route_id,
            ..Default::default()
        };
        let event = |index: u32, route_id: u32| pb::ScenarioEvent {
            index,
            at_unix_ns: unix_ns_now(),
            link: String::new(),
            change: Some(pb::scenario_event::Change::Route(rule(route_id))),
        };
        let run = |runner: &mut Runner, e: pb::ScenarioEvent| {
            runner.schedule(
                pb::Scenario {
                    start_unix_ns: 1,
                    events: vec![e],
                },
                1500,
            )
        };
        run(&mut runner, event(0, 7));
        let report = reports.recv().await.expect("a report");
        assert_eq!(report.events[0].error, "", "{report:?}");
        assert!(matches!(decision(), Decision::Local));
        // The hub's next config carries its own table: the rule stays on top.
        runner.install_routes(table());
        assert!(matches!(decision(), Decision::Local));
        // A route this node has no label for is refused and changes nothing.
        run(&mut runner, event(1, 42));
        let report = reports.recv().await.expect("a report");
        assert!(report.events[0].error.contains("42"), "{report:?}");
        assert!(matches!(decision(), Decision::Local));
        // Route 0 ends the rule: the stored routing again.
        run(&mut runner, event(2, 0));
        let report = reports.recv().await.expect("a report");
        assert_eq!(report.events[0].error, "", "{report:?}");
        assert!(matches!(decision(), Decision::Drop(_)));
    }
}
