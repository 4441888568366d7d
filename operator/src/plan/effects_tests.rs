//! One field, one effect: fields no other planner test shows changing the plan
//! (or the snapshot an agent receives). Listed as evidence in
//! `operator/tests/fixtures/field_effects.tsv`.

use super::tests::{parse, plan};
use super::*;
use crate::hub::TopologyView;

fn topology(spec: &str) -> String {
    format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: t}}\nspec:\n{spec}"
    )
}

const TWO_NODES: &str = "  nodes: [{name: a}, {name: b}]\n  links: [{endpoints: [a, b]}]\n";

#[test]
fn mtu_reaches_the_plan_and_the_agents() {
    let default = plan("t.yaml", &topology(TWO_NODES));
    let p = plan(
        "t.yaml",
        &topology(&format!("  dataplane: {{mtu: 9000}}\n{TWO_NODES}")),
    );
    assert_eq!((default.dataplane.mtu, p.dataplane.mtu), (1400, 9000));
    let snapshot = TopologyView::new(p, 1).snapshot("a").expect("a");
    let dataplane = snapshot.node.and_then(|n| n.dataplane).expect("dataplane");
    assert_eq!(dataplane.mtu, 9000);
}

#[test]
fn telemetry_interval_reaches_the_plan_and_the_agents() {
    let default = plan("t.yaml", &topology(TWO_NODES));
    let p = plan(
        "t.yaml",
        &topology(&format!("  telemetry: {{interval: 250ms}}\n{TWO_NODES}")),
    );
    assert_eq!(
        (default.report_interval_ms, p.report_interval_ms),
        (1000, 250)
    );
    let snapshot = TopologyView::new(p, 1).snapshot("b").expect("b");
    assert_eq!(snapshot.report_interval_ms, 250);
}

#[test]
fn star_generator_makes_its_nodes_around_a_hub() {
    let p = plan("t.yaml", &topology("  generator: {star: {nodes: 5}}\n"));
    let names: Vec<&str> = p.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["n0", "n1", "n2", "n3", "n4"]);
    assert_eq!(p.links.len(), 4);
    assert!(p.links.iter().all(|l| l.dialer == "n0"), "{:?}", p.links);
}

#[test]
fn inline_link_transport_overrides_the_default() {
    let p = plan(
        "t.yaml",
        &topology(
            "  linkDefaults: {transport: quic}\n  nodes: [{name: a}, {name: b}, {name: c}]\n  links:\n  - {endpoints: [a, b], transport: tcp}\n  - {endpoints: [b, c]}\n",
        ),
    );
    let transport = |name: &str| p.link(name).map(|l| l.transport);
    assert_eq!(transport("a-b"), Some(Transport::Tcp));
    assert_eq!(transport("b-c"), Some(Transport::Quic));
}

#[test]
fn max_mode_flows_are_relayed_past_the_links() {
    let flow = |mode: &str| {
        let text = format!(
            "{}---\napiVersion: nextmini.io/v1alpha1\nkind: Flow\nmetadata: {{name: f}}\nspec: {{topology: t, src: a, dst: b, size: 1MB{mode}}}\n",
            topology(TWO_NODES)
        );
        plan("t.yaml", &text).flows.remove(0).params.mode
    };
    assert_eq!(flow(""), RelayMode::Normal);
    assert_eq!(flow(", mode: max"), RelayMode::Max);
}

#[test]
fn namespace_mode_warns_of_worker_pod_fields_by_field() {
    for (line, field) in [
        ("  nodesPerWorker: 2\n", "spec.nodesPerWorker"),
        ("  workers: 2\n", "spec.workers"),
        ("  workerImage: example.org/tools:1\n", "spec.workerImage"),
    ] {
        let manifest = parse(
            "t.yaml",
            &topology(&format!("  placement: packed\n{line}{TWO_NODES}")),
        );
        // Valid for a cluster, where they shape the worker pods ...
        assert_eq!(plan_manifest(&manifest).expect("plans").len(), 1);
        // ... and runs in namespace mode too, which has no worker pods and
        // says so, naming the field.
        assert!(check_local(&manifest).is_ok(), "the same YAML runs locally");
        let warnings = local_warnings(&manifest);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains(&format!("{field}: has no effect in namespace mode")),
            "{warnings:?}"
        );
    }
    // Packed placement alone is namespace mode on one machine.
    let packed = parse(
        "t.yaml",
        &topology(&format!("  placement: packed\n{TWO_NODES}")),
    );
    assert!(check_local(&packed).is_ok());
    assert!(local_warnings(&packed).is_empty());
}
