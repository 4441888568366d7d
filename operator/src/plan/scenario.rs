//! `spec.scenario` (issue 18.2): every event checked against the topology it
//! runs on, then planned into the full parameters each direction has from its
//! instant on, so an agent applies an event without knowing the layers.

use super::assemble::{Draft, DraftLink};
use super::errors::ValidationErrors;
use super::model::{DirectionPair, EventChange, PlannedEvent};
use super::params::resolve;
use crate::api::{LinkParamsSpec, LinkState, MAX_SCENARIO_EVENTS, NodeAction, ScenarioEventSpec};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// The latest offset an event may have.
pub(crate) const MAX_OFFSET: Duration = Duration::from_secs(24 * 3600);

pub(crate) fn check(draft: &Draft, errors: &mut ValidationErrors) {
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
                "an event names the link (or the node) it changes",
            ),
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
pub(crate) fn build(draft: &Draft) -> Vec<PlannedEvent> {
    let spec = &draft.doc.object.spec;
    let Some(scenario) = &spec.scenario else {
        return Vec::new();
    };
    let defaults = spec.link_defaults.as_ref().map(|d| d.params());
    let links: HashMap<&str, &DraftLink> =
        draft.links.iter().map(|l| (l.name.as_str(), l)).collect();
    let mut sets: HashMap<&str, Vec<&LinkParamsSpec>> = HashMap::new();
    scenario
        .events
        .iter()
        .filter_map(|event: &ScenarioEventSpec| {
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
                    let direction = |over: Option<&LinkParamsSpec>| {
                        let layers: Vec<&LinkParamsSpec> = defaults
                            .iter()
                            .chain([&link.params])
                            .chain(over)
                            .chain(earlier.iter().copied())
                            .collect();
                        resolve(&layers)
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
