//! Timed scenarios from YAML: events planned into the full parameters each
//! direction has from its instant on, and every rule refused naming its field.

use super::tests::{expect, plan, plan_errors};

/// The document every case's errors name.
const DOC: &str = "t.yaml document 1 (Topology/t)";
use super::*;
use std::time::Duration;

fn topology(scenario: &str) -> String {
    format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: t}}\nspec:\n  \
         nodes: [{{name: a}}, {{name: b}}, {{name: c}}]\n  links:\n    \
         - {{endpoints: [a, b], rate: 10Mbit, forward: {{delay: 5ms}}}}\n    \
         - {{endpoints: [b, c]}}\n  scenario:\n    events:\n{scenario}"
    )
}

fn pair(event: &PlannedEvent) -> &DirectionPair {
    match &event.change {
        EventChange::Params(pair) => pair,
        other => panic!("expected parameters, got {other:?}"),
    }
}

#[test]
fn set_events_layer_over_the_link_and_earlier_events() {
    let p = plan(
        "t.yaml",
        &topology(
            "      - {at: 1s, link: a-b, set: {rate: 2Mbit}}\n      \
             - {at: 1500ms, link: a-b, set: {loss: 1%}}\n      \
             - {at: 3s, link: a-b, state: down}\n      \
             - {at: 3s, link: a-b, state: up}\n",
        ),
    );
    assert_eq!(p.scenario.len(), 4);
    let offsets: Vec<Duration> = p.scenario.iter().map(|e| e.at).collect();
    assert_eq!(offsets, [1000, 1500, 3000, 3000].map(Duration::from_millis));
    assert!(p.scenario.iter().all(|e| e.target == "a-b"));
    // The link's own layers stay under the event's: the forward delay is kept.
    let first = pair(&p.scenario[0]);
    assert_eq!(first.forward.rate_bps, Some(2_000_000));
    assert_eq!(first.backward.rate_bps, Some(2_000_000));
    assert_eq!(first.forward.delay, Some(Duration::from_millis(5)));
    assert_eq!(first.backward.delay, None);
    // A later event keeps what the earlier one set.
    let second = pair(&p.scenario[1]);
    assert_eq!(second.forward.rate_bps, Some(2_000_000));
    assert_eq!(second.forward.loss_ppm, Some(10_000));
    let kinds: Vec<&str> = p.scenario.iter().map(|e| e.change.kind()).collect();
    assert_eq!(kinds, ["set", "set", "down", "up"]);
    // No scenario, no events.
    let none = plan(
        "t.yaml",
        &topology("      []\n").replace("  scenario:\n    events:\n      []\n", ""),
    );
    assert!(none.scenario.is_empty());
}

#[test]
fn scenario_mistakes_are_refused_naming_the_field() {
    let cases = [
        (
            "      - {at: 1s, link: x-y, state: down}\n",
            "spec.scenario.events[0].link",
            "no link",
        ),
        (
            "      - {at: 2s, link: a-b, state: down}\n      - {at: 1s, link: a-b, state: up}\n",
            "spec.scenario.events[1].at",
            "in order",
        ),
        (
            "      - {at: 90000s, link: a-b, state: down}\n",
            "spec.scenario.events[0].at",
            "at most 86400s",
        ),
        (
            "      - {at: 1s, link: a-b}\n",
            "spec.scenario.events[0].set",
            "state: up or down",
        ),
        (
            "      - {at: 1s, link: a-b, set: {}}\n",
            "spec.scenario.events[0].set",
            "sets no parameter",
        ),
        (
            "      - {at: 1s, link: a-b, set: {rate: 1Mbit}, state: up}\n",
            "spec.scenario.events[0].state",
            "not both",
        ),
        (
            "      - {at: 1s, link: b-c, set: {reorder: 5%}}\n",
            "spec.scenario.events[0].set.reorder",
            "delay",
        ),
    ];
    for (events, field, says) in cases {
        let errors = plan_errors("t.yaml", &topology(events));
        expect(&errors, DOC, field, says);
    }
}

#[test]
fn node_events_name_a_node_and_an_action() {
    let p = plan(
        "t.yaml",
        &topology(
            "      - {at: 1s, node: b, action: kill}\n      - {at: 2s, node: b, action: restart}\n",
        ),
    );
    let events: Vec<(&str, &str)> = p
        .scenario
        .iter()
        .map(|e| (e.target.as_str(), e.change.kind()))
        .collect();
    assert_eq!(events, [("b", "kill"), ("b", "restart")]);
    assert!(p.scenario.iter().all(|e| e.change.is_node()));
    for (events, field, says) in [
        (
            "      - {at: 1s, node: z, action: kill}\n",
            "spec.scenario.events[0].node",
            "no node",
        ),
        (
            "      - {at: 1s, node: b}\n",
            "spec.scenario.events[0].action",
            "kill or restart",
        ),
        (
            "      - {at: 1s, node: b, action: kill, state: down}\n",
            "spec.scenario.events[0].state",
            "not a node",
        ),
        (
            "      - {at: 1s, link: a-b, action: kill, state: down}\n",
            "spec.scenario.events[0].action",
            "not a link",
        ),
        (
            "      - {at: 1s, link: a-b, node: b, action: kill}\n",
            "spec.scenario.events[0].node",
            "not both",
        ),
    ] {
        let errors = plan_errors("t.yaml", &topology(events));
        expect(&errors, DOC, field, says);
    }
}

/// A diamond a-b-d, a-c-d with a scenario of route events.
fn diamond(events: &str) -> String {
    format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: t}}\nspec:\n  \
         nodes: [{{name: a}}, {{name: b}}, {{name: c}}, {{name: d}}]\n  links:\n    \
         - {{endpoints: [a, b]}}\n    - {{endpoints: [b, d]}}\n    \
         - {{endpoints: [a, c]}}\n    - {{endpoints: [c, d]}}\n  scenario:\n    events:\n{events}"
    )
}

#[test]
fn route_events_move_traffic_at_its_source_and_are_checked_like_paths() {
    let p = plan(
        "t.yaml",
        &diamond(
            "      - {at: 1s, route: {src: a, dst: d, protocol: tcp, srcPort: 40000, dstPort: 5201, path: [a, c, d]}}\n      \
             - {at: 2s, route: {src: a, dst: d, protocol: tcp, srcPort: 40000, dstPort: 5201}}\n",
        ),
    );
    let routes: Vec<(&str, &RouteChange)> = p
        .scenario
        .iter()
        .map(|e| match &e.change {
            EventChange::Route(r) => (e.target.as_str(), r.as_ref()),
            other => panic!("expected a route event, got {other:?}"),
        })
        .collect();
    // The source node applies it; the match and the path as written.
    assert_eq!(routes[0].0, "a");
    assert_eq!(routes[0].1.dst, "d");
    assert_eq!(routes[0].1.protocol, Some(6));
    assert_eq!(routes[0].1.dst_port, Some(5201));
    assert_eq!(routes[0].1.src_port, Some(40000));
    assert_eq!(
        routes[0].1.path.as_deref(),
        Some(&["a".to_string(), "c".into(), "d".into()][..])
    );
    // The second ends the first's rule.
    assert_eq!(routes[1].1.path, None);
    assert_eq!(p.scenario[1].change.kind(), "route");
    assert!(!p.scenario[0].change.is_node());

    for (events, field, says) in [
        (
            "      - {at: 1s, route: {src: a, dst: d, path: [a, b, c, d]}}\n",
            "spec.scenario.events[0].route.path[2]",
            "no link between \"b\" and \"c\"",
        ),
        (
            "      - {at: 1s, route: {src: a, dst: d, path: [b, d]}}\n",
            "spec.scenario.events[0].route.path[0]",
            "must start at src \"a\"",
        ),
        (
            "      - {at: 1s, route: {src: a, dst: d, path: [a, b, a, c, d]}}\n",
            "spec.scenario.events[0].route.path[2]",
            "appears twice",
        ),
        (
            "      - {at: 1s, route: {src: a, dst: z, path: [a, b]}}\n",
            "spec.scenario.events[0].route.dst",
            "no node \"z\"",
        ),
        (
            "      - {at: 1s, route: {src: a, dst: a, path: [a]}}\n",
            "spec.scenario.events[0].route.dst",
            "different nodes",
        ),
        (
            "      - {at: 1s, route: {src: a, dst: d, dstPort: 70000, path: [a, b, d]}}\n",
            "spec.scenario.events[0].route.dstPort",
            "1 to 65535",
        ),
        (
            // Ends a rule no event set (another port's is in force).
            "      - {at: 1s, route: {src: a, dst: d, dstPort: 80, path: [a, b, d]}}\n      \
             - {at: 2s, route: {src: a, dst: d, dstPort: 81}}\n",
            "spec.scenario.events[1].route.path",
            "no earlier event set one",
        ),
        (
            "      - {at: 1s, link: a-b, route: {src: a, dst: d, path: [a, b, d]}}\n",
            "spec.scenario.events[0].link",
            "not both",
        ),
    ] {
        let errors = plan_errors("t.yaml", &diamond(events));
        expect(&errors, DOC, field, says);
    }
}
