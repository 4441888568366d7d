//! Timed scenarios on the hub's side: the run starts once the topology first
//! runs (every agent acknowledged its config and every link forwards), at
//! `LEAD` from then; each agent is sent the events that touch it with their
//! absolute instants, ahead of time, and applies them itself. What agents
//! report back is stored with the instant each event took effect.

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
/// that end applies: the parameters of the direction it sends.
pub(super) fn events_for(plan: &Plan, node: &str, start: DateTime<Utc>) -> pb::Scenario {
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
            // A node's events are the local runtime's (runtime/scenario_nodes.rs).
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
                let sessions = hub.inner.sessions.lock().await;
                for ((topology, node), entry) in sessions.iter() {
                    if *topology == key.0 && entry.topology_id == topology_id {
                        let events = events_for(&view.plan, node, start);
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
        let events = events_for(&view.plan, &key.1, start);
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
        let dialer = events_for(&plan, &link.dialer, start);
        let acceptor = events_for(&plan, &link.acceptor, start);
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
        assert!(events_for(&plan, &other.name, start).events.is_empty());
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
        let events = events_for(&plan, &src.name, start).events;
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
            assert!(events_for(&plan, &other.name, start).events.is_empty());
        }
    }
}
