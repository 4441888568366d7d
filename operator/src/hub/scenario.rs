//! Timed scenarios on the hub's side: the run starts once the topology first
//! runs (every agent acknowledged its config and every link forwards), at
//! `LEAD` from then; each agent is sent the events that touch it with their
//! absolute instants, ahead of time, and applies them itself. What agents
//! report back is stored with the instant each event took effect.

use super::snapshot::{TopologyView, Underlay};
use super::{Hub, SessionKey};
use crate::plan::{EventChange, Plan, RouteChange};
use crate::store::AppliedRow;
use chrono::{DateTime, Utc};
use nextmini_proto::v1 as pb;
use std::time::Duration;

/// How far ahead of the start the agents are told: enough for the hub to send
/// every agent its events (milliseconds locally, well under a second for a
/// thousand agents, BENCHMARKS.md 3d).
pub(super) const LEAD: Duration = Duration::from_secs(1);

fn unix_ns(at: DateTime<Utc>) -> u64 {
    at.timestamp_nanos_opt()
        .and_then(|ns| u64::try_from(ns).ok())
        .unwrap_or(0)
}

fn from_unix_ns(ns: u64) -> DateTime<Utc> {
    DateTime::from_timestamp_nanos(i64::try_from(ns).unwrap_or(i64::MAX))
}

/// The planned instant of event `index` of a run that starts at `start`.
fn planned_at(plan: &Plan, start: DateTime<Utc>, index: usize) -> Option<DateTime<Utc>> {
    let at = plan.scenario.get(index)?.at;
    Some(start + chrono::Duration::from_std(at).ok()?)
}

/// The events touching `node` (an end of the event's link), each with what
/// that end applies: the parameters of the direction it sends. With
/// `kills_after`, the node's agent applies its own `kill` events, those after
/// that instant (a cluster, where the hub cannot kill a process; an agent
/// restarted after a kill must not kill itself again).
pub(super) fn events_for(
    plan: &Plan,
    node: &str,
    start: DateTime<Utc>,
    kills_after: Option<DateTime<Utc>>,
) -> pb::Scenario {
    let events = plan
        .scenario
        .iter()
        .enumerate()
        .filter_map(|(i, event)| {
            if let EventChange::Route(route) = &event.change {
                return (event.target == node)
                    .then(|| route_event(plan, node, route))
                    .flatten()
                    .and_then(|rule| {
                        Some(pb::ScenarioEvent {
                            index: u32::try_from(i).ok()?,
                            at_unix_ns: unix_ns(planned_at(plan, start, i)?),
                            link: String::new(),
                            change: Some(pb::scenario_event::Change::Route(rule)),
                        })
                    });
            }
            if let EventChange::Node { restart } = event.change {
                // Locally a node's events are the runtime's
                // (runtime/scenario_nodes.rs); a restart is the hub's
                // release of the held config (`release_at`).
                let at = planned_at(plan, start, i)?;
                let after = kills_after?;
                return (!restart && event.target == node && at > after).then(|| {
                    pb::ScenarioEvent {
                        index: u32::try_from(i).unwrap_or(u32::MAX),
                        at_unix_ns: unix_ns(at),
                        link: String::new(),
                        change: Some(pb::scenario_event::Change::Kill(true)),
                    }
                });
            }
            let link = plan.links.iter().find(|l| l.name == event.target)?;
            let change = match &event.change {
                EventChange::Params(pair) if link.dialer == node => {
                    pb::scenario_event::Change::Params(super::params::to_proto(&pair.forward))
                }
                EventChange::Params(pair) if link.acceptor == node => {
                    pb::scenario_event::Change::Params(super::params::to_proto(&pair.backward))
                }
                EventChange::Up(up) if link.dialer == node || link.acceptor == node => {
                    pb::scenario_event::Change::Up(*up)
                }
                _ => return None,
            };
            Some(pb::ScenarioEvent {
                index: u32::try_from(i).ok()?,
                at_unix_ns: unix_ns(planned_at(plan, start, i)?),
                link: event.target.clone(),
                change: Some(change),
            })
        })
        .collect();
    pb::Scenario {
        start_unix_ns: unix_ns(start),
        events,
    }
}

/// The flow rule a route event's source node applies: the event's match,
/// and its route (0 when the event ends the scenario's rule for the match).
fn route_event(plan: &Plan, src: &str, route: &RouteChange) -> Option<pb::FlowRule> {
    let src = plan.node(src)?;
    let dst = plan.node(&route.dst)?;
    let route_id = match (&route.path, route.route_id) {
        (None, _) => 0,
        (Some(_), Some(id)) => id,
        // A path whose route was never stored: nothing to send traffic onto.
        (Some(_), None) => return None,
    };
    Some(pb::FlowRule {
        src_addr: src.overlay.to_string(),
        dst_addr: dst.overlay.to_string(),
        src_port: route.src_port.map_or(0, u32::from),
        dst_port: route.dst_port.map_or(0, u32::from),
        protocol: route.protocol.map_or(0, u32::from),
        route_id,
        choices: Vec::new(),
    })
}

/// What one session told its agent about the scenario.
#[derive(Default)]
pub(super) struct ScenarioStart {
    sent: bool,
}

impl ScenarioStart {
    /// Sends the agent its events once the run has a start; starts the run
    /// (and tells every agent of the topology) when the topology first runs.
    pub async fn check(&mut self, hub: &Hub, id: u64, key: &SessionKey, topology_id: i64) {
        if self.sent {
            return;
        }
        let view = hub.inner.views.lock().await.get(&key.0).cloned();
        let Some(view) = view.filter(|v| v.topology_id == topology_id) else {
            return;
        };
        if view.plan.scenario.is_empty() {
            return;
        }
        let store = &hub.inner.store;
        let start = match store.scenario_started(topology_id).await {
            Ok(Some(start)) => start,
            Ok(None) => {
                match store.readiness(topology_id).await {
                    Ok(r) if r.ready() >= view.generation => {}
                    _ => return,
                }
                let start = match store.start_scenario(topology_id, LEAD).await {
                    Ok(start) => start,
                    Err(e) => {
                        tracing::warn!(topology = %key.0, error = %e, "starting the scenario failed");
                        return;
                    }
                };
                tracing::info!(topology = %key.0, %start, events = view.plan.scenario.len(), "scenario starts");
                let kills_after = agents_kill(&view).then(Utc::now);
                let sessions = hub.inner.sessions.lock().await;
                for ((topology, node), entry) in sessions.iter() {
                    if *topology == key.0 && entry.topology_id == topology_id {
                        let events = events_for(&view.plan, node, start, kills_after);
                        if !events.events.is_empty() {
                            entry.send(pb::controller_message::Msg::Scenario(events));
                        }
                    }
                }
                self.sent = true;
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "reading the scenario's start failed");
                return;
            }
        };
        let events = events_for(&view.plan, &key.1, start, agents_kill(&view).then(Utc::now));
        self.sent = true;
        if events.events.is_empty() {
            return;
        }
        let sessions = hub.inner.sessions.lock().await;
        if let Some(entry) = sessions.get(key).filter(|e| e.id == id) {
            entry.send(pb::controller_message::Msg::Scenario(events));
        }
    }
}

/// Whether the topology's agents apply its `kill` events themselves: in a
/// cluster; locally the hub process's runtime kills them.
pub(super) fn agents_kill(view: &TopologyView) -> bool {
    !matches!(view.underlay, Underlay::Bridge)
}

/// The last node event of `node` planned at or before `now`: its index and
/// whether it was a restart.
fn last_node_event(
    plan: &Plan,
    node: &str,
    start: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<(usize, bool)> {
    plan.scenario
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e.change {
            EventChange::Node { restart }
                if e.target == node && planned_at(plan, start, i).is_some_and(|at| at <= now) =>
            {
                Some((i, restart))
            }
            _ => None,
        })
        .next_back()
}

/// A node a `kill` holds down: the hub sends its agent no config until the
/// node's next `restart` (index and instant), or never when none follows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Hold {
    pub restart: Option<(usize, DateTime<Utc>)>,
}

/// Whether the scenario holds `node` down at `now`.
pub(super) fn hold_of(
    plan: &Plan,
    node: &str,
    start: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<Hold> {
    let (kill, false) = last_node_event(plan, node, start, now)? else {
        return None;
    };
    let restart = plan
        .scenario
        .iter()
        .enumerate()
        .skip(kill + 1)
        .find(|(_, e)| e.target == node && e.change == EventChange::Node { restart: true })
        .and_then(|(i, _)| Some((i, planned_at(plan, start, i)?)));
    Some(Hold { restart })
}

/// What the scenario says of a connecting agent's node in a cluster: held
/// down, or `None`. A restart it reaches late (its instant passed while the
/// agent was still coming back) is recorded now.
pub(super) async fn on_connect(hub: &Hub, view: &TopologyView, node: &str) -> Option<Hold> {
    if !agents_kill(view) || !view.plan.scenario.iter().any(|e| e.change.is_node()) {
        return None;
    }
    let store = &hub.inner.store;
    let start = store.scenario_started(view.topology_id).await.ok()??;
    let now = Utc::now();
    if let Some(hold) = hold_of(&view.plan, node, start, now) {
        return Some(hold);
    }
    if let Some((restart, true)) = last_node_event(&view.plan, node, start, now) {
        record(hub, view, node, start, restart, now).await;
    }
    None
}

/// Sends a held agent its config at its node's restart instant, and records
/// the restart; nothing when another session of the node took over.
pub(super) async fn release_at(
    hub: Hub,
    key: SessionKey,
    id: u64,
    restart: usize,
    at: DateTime<Utc>,
) {
    tokio::time::sleep((at - Utc::now()).to_std().unwrap_or_default()).await;
    let view = match hub.current_view(&key.0).await {
        Ok(Some(view)) => view,
        _ => return,
    };
    {
        let mut sessions = hub.inner.sessions.lock().await;
        match sessions.get_mut(&key) {
            Some(entry) if entry.id == id => entry.held = false,
            _ => return,
        }
        super::bring_up_to_date(&mut sessions, &key, &view);
    }
    let now = Utc::now();
    tracing::info!(topology = %key.0, node = %key.1, late_us = (now - at).num_microseconds(), "scenario restart: config released");
    let Ok(Some(start)) = hub.inner.store.scenario_started(view.topology_id).await else {
        return;
    };
    record(&hub, &view, &key.1, start, restart, now).await;
}

/// Records a `kill` the hub saw take effect: the node's session ended at or
/// after the kill's instant.
pub(super) async fn on_disconnect(hub: &Hub, key: &SessionKey, topology_id: i64) {
    let view = hub.inner.views.lock().await.get(&key.0).cloned();
    let Some(view) = view.filter(|v| v.topology_id == topology_id && agents_kill(v)) else {
        return;
    };
    if !view
        .plan
        .scenario
        .iter()
        .any(|e| e.target == key.1 && e.change.is_node())
    {
        return;
    }
    let Ok(Some(start)) = hub.inner.store.scenario_started(topology_id).await else {
        return;
    };
    let now = Utc::now();
    if let Some((kill, false)) = last_node_event(&view.plan, &key.1, start, now) {
        record(hub, &view, &key.1, start, kill, now).await;
    }
}

/// Stores when node event `idx` took effect (the first record counts).
async fn record(
    hub: &Hub,
    view: &TopologyView,
    node: &str,
    start: DateTime<Utc>,
    idx: usize,
    applied_at: DateTime<Utc>,
) {
    let Some(planned) = planned_at(&view.plan, start, idx) else {
        return;
    };
    let row = AppliedRow {
        idx: i32::try_from(idx).unwrap_or(i32::MAX),
        planned_at: planned,
        applied_at,
        error: String::new(),
    };
    if let Err(e) = hub
        .inner
        .store
        .record_scenario_applied(view.topology_id, node, &[row])
        .await
    {
        tracing::warn!(node, error = %e, "storing a scenario node event failed");
    }
}

/// Stores what an agent reports of the events it applied.
pub(super) async fn store_applied(
    hub: &Hub,
    key: &SessionKey,
    topology_id: i64,
    report: &pb::ScenarioApplied,
) {
    let view = hub.inner.views.lock().await.get(&key.0).cloned();
    let Some(view) = view.filter(|v| v.topology_id == topology_id) else {
        return;
    };
    let start = from_unix_ns(report.start_unix_ns);
    let rows: Vec<AppliedRow> = report
        .events
        .iter()
        .filter_map(|e| {
            Some(AppliedRow {
                idx: i32::try_from(e.index).ok()?,
                planned_at: planned_at(&view.plan, start, e.index as usize)?,
                applied_at: from_unix_ns(e.applied_unix_ns),
                error: e.error.clone(),
            })
        })
        .collect();
    if let Err(e) = hub
        .inner
        .store
        .record_scenario_applied(topology_id, &key.1, &rows)
        .await
    {
        tracing::warn!(topology = %key.0, node = %key.1, error = %e, "storing scenario reports failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{DirectionPair, LinkParams, PlannedEvent, RouteChange};

    #[test]
    fn each_end_gets_its_own_direction_at_the_absolute_instant() {
        let mut plan = crate::plan::fixtures::line3();
        let link = plan.links[0].clone();
        let forward = LinkParams {
            rate_bps: Some(1_000_000),
            ..LinkParams::default()
        };
        let backward = LinkParams {
            rate_bps: Some(2_000_000),
            ..LinkParams::default()
        };
        plan.scenario = vec![
            PlannedEvent {
                at: Duration::from_millis(1500),
                target: link.name.clone(),
                change: EventChange::Params(Box::new(DirectionPair { forward, backward })),
            },
            PlannedEvent {
                at: Duration::from_secs(2),
                target: link.name.clone(),
                change: EventChange::Up(false),
            },
        ];
        let start = DateTime::from_timestamp(1_700_000_000, 0).expect("time");
        let rate = |s: &pb::Scenario| match &s.events[0].change {
            Some(pb::scenario_event::Change::Params(p)) => p.rate_bps,
            other => panic!("{other:?}"),
        };
        let dialer = events_for(&plan, &link.dialer, start, None);
        let acceptor = events_for(&plan, &link.acceptor, start, None);
        assert_eq!((rate(&dialer), rate(&acceptor)), (1_000_000, 2_000_000));
        assert_eq!(dialer.start_unix_ns, 1_700_000_000_000_000_000);
        assert_eq!(
            dialer
                .events
                .iter()
                .map(|e| (e.index, e.at_unix_ns))
                .collect::<Vec<_>>(),
            [
                (0, 1_700_000_001_500_000_000),
                (1, 1_700_000_002_000_000_000)
            ]
        );
        assert_eq!(
            acceptor.events[1].change,
            Some(pb::scenario_event::Change::Up(false))
        );
        // A node on neither end gets nothing.
        let other = plan
            .nodes
            .iter()
            .find(|n| n.name != link.dialer && n.name != link.acceptor)
            .expect("a third node");
        assert!(
            events_for(&plan, &other.name, start, None)
                .events
                .is_empty()
        );
    }

    #[test]
    fn a_route_event_goes_to_its_source_with_the_stored_route() {
        let mut plan = crate::plan::fixtures::line3();
        let (src, dst) = (plan.nodes[0].clone(), plan.nodes[2].clone());
        let route = |path: Option<Vec<String>>, route_id: Option<u32>| {
            EventChange::Route(Box::new(RouteChange {
                dst: dst.name.clone(),
                protocol: Some(6),
                src_port: None,
                dst_port: Some(5201),
                path,
                route_id,
            }))
        };
        let path: Vec<String> = plan.nodes.iter().map(|n| n.name.clone()).collect();
        plan.scenario = vec![
            PlannedEvent {
                at: Duration::from_secs(1),
                target: src.name.clone(),
                change: route(Some(path.clone()), Some(7)),
            },
            PlannedEvent {
                at: Duration::from_secs(2),
                target: src.name.clone(),
                change: route(None, None),
            },
            // A path never stored has no route to send traffic onto.
            PlannedEvent {
                at: Duration::from_secs(3),
                target: src.name.clone(),
                change: route(Some(path), None),
            },
        ];
        let start = DateTime::from_timestamp(1_700_000_000, 0).expect("time");
        let events = events_for(&plan, &src.name, start, None).events;
        let rules: Vec<(u32, pb::FlowRule)> = events
            .into_iter()
            .map(|e| match e.change {
                Some(pb::scenario_event::Change::Route(rule)) => (e.index, rule),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(rules.len(), 2, "{rules:?}");
        let (index, rule) = &rules[0];
        assert_eq!(*index, 0);
        assert_eq!(rule.src_addr, src.overlay.to_string());
        assert_eq!(rule.dst_addr, dst.overlay.to_string());
        assert_eq!((rule.protocol, rule.dst_port, rule.src_port), (6, 5201, 0));
        assert_eq!(rule.route_id, 7);
        assert_eq!((rules[1].0, rules[1].1.route_id), (1, 0));
        // Only the source applies it: the path's other nodes know the route
        // from their snapshots.
        for other in &plan.nodes[1..] {
            assert!(
                events_for(&plan, &other.name, start, None)
                    .events
                    .is_empty()
            );
        }
    }

    #[test]
    fn a_kill_holds_its_node_until_the_next_restart_and_goes_to_its_agent_once() {
        let mut plan = crate::plan::fixtures::line3();
        let b = plan.nodes[1].name.clone();
        let node_event = |secs: u64, restart: bool| PlannedEvent {
            at: Duration::from_secs(secs),
            target: b.clone(),
            change: EventChange::Node { restart },
        };
        plan.scenario = vec![
            node_event(2, false),
            node_event(5, true),
            node_event(8, false),
        ];
        let start = DateTime::from_timestamp(1_700_000_000, 0).expect("time");
        let at = |secs: i64| start + chrono::Duration::seconds(secs);
        assert_eq!(hold_of(&plan, &b, start, at(1)), None);
        assert_eq!(
            hold_of(&plan, &b, start, at(3)),
            Some(Hold {
                restart: Some((1, at(5)))
            })
        );
        assert_eq!(hold_of(&plan, &b, start, at(6)), None);
        // No restart follows the last kill: held for good.
        assert_eq!(
            hold_of(&plan, &b, start, at(9)),
            Some(Hold { restart: None })
        );
        // The agent gets the kills still ahead, never a restart (the hub's
        // release is the restart); locally (None) it gets none.
        let kills = |after: i64| -> Vec<u32> {
            events_for(&plan, &b, start, Some(at(after)))
                .events
                .iter()
                .map(|e| {
                    assert_eq!(e.change, Some(pb::scenario_event::Change::Kill(true)));
                    e.index
                })
                .collect()
        };
        assert_eq!(kills(0), [0, 2]);
        // Restarted after the first kill: only the second is still ahead.
        assert_eq!(kills(6), [2]);
        assert!(events_for(&plan, &b, start, None).events.is_empty());
        assert!(
            events_for(&plan, &plan.nodes[0].name, start, Some(at(0)))
                .events
                .is_empty()
        );
    }
}
