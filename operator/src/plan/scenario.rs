//! `spec.scenario` (issue 18.2): every event checked against the topology it
//! runs on, then planned into the full parameters each direction has from its
//! instant on, so an agent applies an event without knowing the layers.

use super::assemble::{Draft, DraftLink};
use super::errors::ValidationErrors;
use super::model::{DirectionPair, EventChange, PlannedEvent, RouteChange};
use super::params::resolve;
use super::routes::Graph;
use crate::api::{
    LinkParamsSpec, LinkState, MAX_SCENARIO_EVENTS, NodeAction, RouteEventSpec, ScenarioEventSpec,
};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// The latest offset an event may have.
pub(crate) const MAX_OFFSET: Duration = Duration::from_secs(24 * 3600);

pub(crate) fn check(draft: &Draft, graph: &Graph, errors: &mut ValidationErrors) {
    let Some(scenario) = &draft.doc.object.spec.scenario else {
        return;
    };
    let origin = &draft.doc.origin;
    if scenario.events.len() > MAX_SCENARIO_EVENTS {
        errors.push(
            origin,
            "spec.scenario.events",
            format!(
                "at most {MAX_SCENARIO_EVENTS} events, got {}",
                scenario.events.len()
            ),
        );
        return;
    }
    let links: HashMap<&str, &DraftLink> =
        draft.links.iter().map(|l| (l.name.as_str(), l)).collect();
    let nodes: HashSet<&str> = draft.nodes.iter().map(|n| n.name.as_str()).collect();
    let mut earlier: HashMap<&str, Vec<(&LinkParamsSpec, String)>> = HashMap::new();
    let mut routes_in_force: HashSet<RouteMatch> = HashSet::new();
    let mut previous: Option<(usize, Duration)> = None;
    for (i, event) in scenario.events.iter().enumerate() {
        let field = |f: &str| format!("spec.scenario.events[{i}].{f}");
        let at = event.at.as_std();
        if at > MAX_OFFSET {
            errors.push(
                origin,
                field("at"),
                format!("must be at most 86400s (a day), got {}", event.at),
            );
        }
        if let Some((j, before)) = previous
            && at < before
        {
            errors.push(
                origin,
                field("at"),
                format!(
                    "events must be in order of their offsets: {} comes before events[{j}]'s {:?}",
                    event.at, before
                ),
            );
        }
        previous = Some((i, at));
        if let Some(route) = &event.route {
            check_route_event(draft, graph, i, event, route, &mut routes_in_force, errors);
            continue;
        }
        match (&event.link, &event.node) {
            (Some(link), None) => {
                check_link_event(draft, i, event, link, &links, &mut earlier, errors)
            }
            (None, Some(node)) => {
                if !nodes.contains(node.as_str()) {
                    errors.push(
                        origin,
                        field("node"),
                        format!("no node {node:?} in topology {:?}", draft.name),
                    );
                }
                if event.action.is_none() {
                    errors.push(
                        origin,
                        field("action"),
                        "an event on a node needs an action: kill or restart",
                    );
                }
                for (name, set) in [
                    ("set", event.set.is_some()),
                    ("state", event.state.is_some()),
                ] {
                    if set {
                        errors.push(origin, field(name), "applies to a link, not a node");
                    }
                }
            }
            (Some(_), Some(_)) => errors.push(
                origin,
                field("node"),
                "an event names a link or a node, not both",
            ),
            (None, None) => errors.push(
                origin,
                field("link"),
                "an event names the link (or the node) it changes, or gives a route",
            ),
        }
    }
}

/// The traffic a route event moves: (src, dst, protocol, src port, dst port).
type RouteMatch = (String, String, Option<u8>, Option<u32>, Option<u32>);

fn route_match(route: &RouteEventSpec) -> RouteMatch {
    (
        route.src.clone(),
        route.dst.clone(),
        route.protocol.map(|p| p.0),
        route.src_port,
        route.dst_port,
    )
}

/// A route event: its nodes exist, its ports are ports, its path runs along
/// links from src to dst, and one without a path ends a rule in force.
fn check_route_event(
    draft: &Draft,
    graph: &Graph,
    i: usize,
    event: &ScenarioEventSpec,
    route: &RouteEventSpec,
    in_force: &mut HashSet<RouteMatch>,
    errors: &mut ValidationErrors,
) {
    let origin = &draft.doc.origin;
    let field = |f: &str| format!("spec.scenario.events[{i}].{f}");
    for (name, set) in [
        ("link", event.link.is_some()),
        ("node", event.node.is_some()),
        ("set", event.set.is_some()),
        ("state", event.state.is_some()),
        ("action", event.action.is_some()),
    ] {
        if set {
            errors.push(
                origin,
                field(name),
                "an event gives a route or changes a link or a node, not both",
            );
        }
    }
    let before = errors.len();
    for (name, node) in [("route.src", &route.src), ("route.dst", &route.dst)] {
        if graph.index_of(node).is_none() {
            errors.push(
                origin,
                field(name),
                format!("no node {node:?} in topology {:?}", draft.name),
            );
        }
    }
    if route.src == route.dst {
        errors.push(
            origin,
            field("route.dst"),
            "src and dst must be different nodes",
        );
    }
    for (name, port) in [
        ("route.srcPort", route.src_port),
        ("route.dstPort", route.dst_port),
    ] {
        if let Some(port) = port
            && !(1..=65535).contains(&port)
        {
            errors.push(
                origin,
                field(name),
                format!("must be a port from 1 to 65535, got {port}"),
            );
        }
    }
    if errors.len() > before {
        return;
    }
    let matching = route_match(route);
    match &route.path {
        Some(path) => {
            super::flows::check_path(
                draft,
                graph,
                origin,
                &field("route.path"),
                (&route.src, &route.dst),
                path,
                errors,
            );
            in_force.insert(matching);
        }
        None => {
            if !in_force.remove(&matching) {
                errors.push(
                    origin,
                    field("route.path"),
                    "without a path the event ends an earlier route event's rule for the same traffic (src, dst, protocol and ports), and no earlier event set one",
                );
            }
        }
    }
}

/// A link's event: its link exists, and it sets parameters or a state.
fn check_link_event<'d>(
    draft: &'d Draft,
    i: usize,
    event: &'d ScenarioEventSpec,
    link: &str,
    links: &HashMap<&str, &'d DraftLink<'d>>,
    earlier: &mut HashMap<&'d str, Vec<(&'d LinkParamsSpec, String)>>,
    errors: &mut ValidationErrors,
) {
    let origin = &draft.doc.origin;
    let field = |f: &str| format!("spec.scenario.events[{i}].{f}");
    if event.action.is_some() {
        errors.push(origin, field("action"), "applies to a node, not a link");
    }
    match (&event.set, event.state) {
        (Some(_), Some(_)) => errors.push(
            origin,
            field("state"),
            "an event either sets parameters or a state, not both",
        ),
        (None, None) => errors.push(
            origin,
            field("set"),
            "an event sets parameters (set) or the link's state (state: up or down)",
        ),
        (Some(set), None) if *set == LinkParamsSpec::default() => {
            errors.push(origin, field("set"), "sets no parameter");
        }
        _ => {}
    }
    let Some(link) = links.get(link) else {
        errors.push(
            origin,
            field("link"),
            format!("no link {link:?} in topology {:?}", draft.name),
        );
        return;
    };
    if let Some(set) = &event.set {
        let before = earlier.entry(link.name.as_str()).or_default();
        super::params_check::check_event(draft, link, before, set, field("set"), errors);
        before.push((set, field("set")));
    }
}

/// The planned events; call only on a checked draft.
pub(crate) fn build(draft: &Draft, clusters: &super::sites::Clusters) -> Vec<PlannedEvent> {
    let spec = &draft.doc.object.spec;
    let Some(scenario) = &spec.scenario else {
        return Vec::new();
    };
    let links: HashMap<&str, &DraftLink> =
        draft.links.iter().map(|l| (l.name.as_str(), l)).collect();
    let mut sets: HashMap<&str, Vec<&LinkParamsSpec>> = HashMap::new();
    scenario
        .events
        .iter()
        .filter_map(|event: &ScenarioEventSpec| {
            if let Some(route) = &event.route {
                return Some(PlannedEvent {
                    at: event.at.as_std(),
                    target: route.src.clone(),
                    change: EventChange::Route(Box::new(RouteChange {
                        dst: route.dst.clone(),
                        protocol: route.protocol.map(|p| p.0),
                        src_port: route.src_port.and_then(|p| u16::try_from(p).ok()),
                        dst_port: route.dst_port.and_then(|p| u16::try_from(p).ok()),
                        path: route.path.clone(),
                        route_id: None,
                    })),
                });
            }
            if let (Some(node), Some(action)) = (&event.node, event.action) {
                return Some(PlannedEvent {
                    at: event.at.as_std(),
                    target: node.clone(),
                    change: EventChange::Node {
                        restart: action == NodeAction::Restart,
                    },
                });
            }
            let link = links.get(event.link.as_deref()?)?;
            let change = match (&event.set, event.state) {
                (Some(set), _) => {
                    let earlier = sets.entry(link.name.as_str()).or_default();
                    earlier.push(set);
                    // As for the link itself (`sites::check_delays` checked it).
                    let real = super::sites::real_one_way(clusters, link)
                        .map_or(std::time::Duration::ZERO, |(d, _)| d);
                    let direction = |over: Option<&LinkParamsSpec>| {
                        let layers = draft.layers(link, over, earlier);
                        let mut params = resolve(&layers);
                        params.delay = params.delay.map(|d| d.saturating_sub(real));
                        params
                    };
                    EventChange::Params(Box::new(DirectionPair {
                        forward: direction(link.forward.as_ref()),
                        backward: direction(link.backward.as_ref()),
                    }))
                }
                (None, Some(state)) => EventChange::Up(state == LinkState::Up),
                (None, None) => return None,
            };
            Some(PlannedEvent {
                at: event.at.as_std(),
                target: link.name.clone(),
                change,
            })
        })
        .collect()
}
