//! Placement by cluster and region, `regionLinks`, and the real round trip
//! subtracted from delays between clusters (issue 17.1).

use super::tests::{parse, plan, plan_errors};
use super::*;
use std::time::Duration;

const WAN: &str = include_str!("../../tests/fixtures/wan.yaml");

fn ms(v: u64) -> Option<Duration> {
    Some(Duration::from_millis(v))
}

fn site(p: &Plan, node: &str) -> (Option<String>, Option<String>) {
    let n = p.node(node).unwrap_or_else(|| panic!("node {node}"));
    (n.cluster.clone(), n.region.clone())
}

fn owned(cluster: &str, region: &str) -> (Option<String>, Option<String>) {
    (Some(cluster.into()), Some(region.into()))
}

fn delays(p: &Plan, link: &str) -> (Option<Duration>, Option<Duration>) {
    let l = p.link(link).unwrap_or_else(|| panic!("link {link}"));
    (l.forward.delay, l.backward.delay)
}

#[test]
fn spread_places_blocks_and_regions_take_their_clusters_in_turn() {
    let p = plan("wan.yaml", WAN);
    for n in ["n0", "n1", "n2", "n3"] {
        assert_eq!(site(&p, n), owned("home", "eu-west"), "{n}");
    }
    // us-east has two clusters: its nodes alternate, by cluster name.
    assert_eq!(site(&p, "n4"), owned("us-1", "us-east"));
    assert_eq!(site(&p, "n5"), owned("us-2", "us-east"));
    assert_eq!(site(&p, "n6"), owned("us-1", "us-east"));
    assert_eq!(site(&p, "n7"), owned("us-2", "us-east"));
    for n in ["n8", "n9", "n10", "n11"] {
        assert_eq!(site(&p, n), owned("ap-1", "ap-south"), "{n}");
    }
    assert_eq!(site(&p, "edge"), owned("us-2", "us-east"));
}

#[test]
fn region_links_apply_between_their_regions_with_the_real_round_trip_subtracted() {
    let p = plan("wan.yaml", WAN);
    // Inside eu-west (one cluster): linkDefaults alone.
    assert_eq!(delays(&p, "n0-n1"), (ms(1), ms(1)));
    assert_eq!(
        p.link("n0-n1").map(|l| l.forward.rate_bps),
        Some(Some(1_000_000_000))
    );
    // eu-west - us-east: 40 ms asked, home - us-1 measured 70 ms round trip.
    assert_eq!(delays(&p, "n3-n4"), (ms(5), ms(5)));
    assert_eq!(
        p.link("n3-n4").map(|l| l.forward.rate_bps),
        Some(Some(200_000_000))
    );
    // Inside us-east, between us-1 and us-2: no declared figure, so the lower
    // bound |70 - 74| ms = 4 ms round trip.
    assert_eq!(delays(&p, "n4-n5"), (ms(3), ms(3)));
    // us-2 - ap-1: us-2 declares 180 ms; 100 - 90.
    assert_eq!(delays(&p, "n7-n8"), (ms(10), ms(10)));
    assert_eq!(p.link("n7-n8").map(|l| l.transport), Some(Transport::Quic));
    assert_eq!(p.link("n3-n4").map(|l| l.transport), Some(Transport::Tcp));
    // ap-1 - home: 80 - 120 / 2.
    assert_eq!(delays(&p, "n11-n0"), (ms(20), ms(20)));
    // The link's own override wins over the region's; both lose the real 37 ms.
    assert_eq!(delays(&p, "edge-n0"), (ms(13), ms(3)));
}

#[test]
fn on_one_machine_nothing_is_subtracted() {
    let p = plan_manifest_here(&parse("wan.yaml", WAN))
        .expect("plans")
        .remove(0);
    assert_eq!(delays(&p, "n3-n4"), (ms(40), ms(40)));
    assert_eq!(delays(&p, "n4-n5"), (ms(5), ms(5)));
    assert_eq!(delays(&p, "edge-n0"), (ms(50), ms(40)));
    assert_eq!(site(&p, "n8"), owned("ap-1", "ap-south"));
}

#[test]
fn regions_without_member_clusters_are_labels() {
    let p = plan(
        "labels.yaml",
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: t}\nspec:\n  generator: {line: {nodes: 4}}\n  spread: {regions: [a, b]}\n  regionLinks:\n    - {regions: [b, a], delay: 30ms}\n",
    );
    assert_eq!(site(&p, "n1"), (None, Some("a".into())));
    assert_eq!(site(&p, "n2"), (None, Some("b".into())));
    assert_eq!(delays(&p, "n0-n1"), (None, None));
    assert_eq!(delays(&p, "n1-n2"), (ms(30), ms(30)));
    assert_eq!(delays(&p, "n2-n3"), (None, None));
}

fn errors_of(yaml: &str) -> Vec<String> {
    plan_errors("bad.yaml", yaml)
        .into_iter()
        .map(|e| format!("{}: {}", e.field, e.reason))
        .collect()
}

fn has(errors: &[String], field: &str, words: &str) {
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with(&format!("{field}: ")) && e.contains(words)),
        "no error at {field} saying {words:?} in {errors:#?}"
    );
}

const CLUSTERS: &str = "apiVersion: nextmini.io/v1alpha1\nkind: MemberCluster\nmetadata: {name: home}\nspec: {region: eu}\n---\napiVersion: nextmini.io/v1alpha1\nkind: MemberCluster\nmetadata: {name: far}\nspec:\n  region: us\n  kubeconfigSecretRef: {namespace: nextmini, name: far}\nstatus: {rtt: 20ms}\n---\n";

#[test]
fn a_delay_shorter_than_the_real_one_way_is_refused_at_the_field_that_set_it() {
    let e = errors_of(&format!(
        "{CLUSTERS}apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: t}}\nspec:\n  nodes: [{{name: a}}, {{name: b, region: us}}, {{name: c, cluster: far}}]\n  regionLinks: [{{regions: [eu, us], delay: 9ms}}]\n  links:\n    - endpoints: [a, b]\n    - endpoints: [a, c]\n      backward: {{delay: 10ms}}\n"
    ));
    has(
        &e,
        "spec.regionLinks[0].delay",
        "shorter than the real one-way delay",
    );
    has(
        &e,
        "spec.regionLinks[0].delay",
        "10ms (half the round trip, from MemberCluster far's status.rtt)",
    );
    assert!(
        !e.iter()
            .any(|e| e.starts_with("spec.links[1].backward.delay")),
        "10 ms covers 20 ms / 2: {e:#?}"
    );
}

#[test]
fn an_unknown_round_trip_is_refused_when_a_delay_needs_it() {
    let unmeasured = CLUSTERS.replace("status: {rtt: 20ms}\n", "");
    let topology = "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: t}\nspec:\n  nodes: [{name: a}, {name: b, cluster: far}]\n  links:\n    - endpoints: [a, b]\n      delay: 30ms\n";
    let e = errors_of(&format!("{unmeasured}{topology}"));
    has(
        &e,
        "spec.links[0].delay",
        "no round trip to cluster far is known yet",
    );
    // Without a delay the link simply has the real one.
    let free = topology.replace("      delay: 30ms\n", "");
    assert!(plan_manifest(&parse("ok.yaml", &format!("{unmeasured}{free}"))).is_ok());
}

#[test]
fn names_that_lead_nowhere_are_refused_by_field() {
    let e = errors_of(&format!(
        "{CLUSTERS}apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: t}}\nspec:\n  generator: {{line: {{nodes: 2}}}}\n  spread: {{regions: [eu, mars]}}\n  regionLinks:\n    - {{regions: [eu, us], delay: 30ms}}\n    - {{regions: [eu, eu-wset]}}\n    - {{regions: [us, eu]}}\n  nodes:\n    - {{name: x, cluster: nowhere}}\n    - {{name: y, cluster: far, region: us}}\n"
    ));
    has(
        &e,
        "spec.spread.regions[1]",
        "no MemberCluster is in region \"mars\" (regions: eu, us)",
    );
    has(
        &e,
        "spec.nodes[0].cluster",
        "no MemberCluster \"nowhere\" (declared: far, home)",
    );
    has(
        &e,
        "spec.nodes[1].region",
        "set cluster or region, not both",
    );
    has(
        &e,
        "spec.regionLinks[1].regions[1]",
        "no node is in region \"eu-wset\"",
    );
    has(
        &e,
        "spec.regionLinks[2].regions",
        "the same pair of regions as spec.regionLinks[0]",
    );
}

#[test]
fn one_member_cluster_stands_for_the_operators_own() {
    let second_home = "apiVersion: nextmini.io/v1alpha1\nkind: MemberCluster\nmetadata: {name: also-home}\nspec: {region: us}\n---\n";
    let e = errors_of(&format!(
        "{CLUSTERS}{second_home}apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: t}}\nspec:\n  nodes: [{{name: a, region: eu}}]\n"
    ));
    has(
        &e,
        "spec.kubeconfigSecretRef",
        "MemberCluster \"home\" already stands for the operator's own cluster",
    );
}

#[test]
fn in_a_cluster_a_bad_member_cluster_stops_only_topologies_that_place_nodes() {
    let second_home = "apiVersion: nextmini.io/v1alpha1\nkind: MemberCluster\nmetadata: {name: also-home}\nspec: {region: us}\n---\n";
    let plain = "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: t}\nspec:\n  nodes: [{name: a}, {name: b}]\n  links: [{endpoints: [a, b]}]\n";
    let m = parse("m.yaml", &format!("{CLUSTERS}{second_home}{plain}"));
    assert!(plan_manifest(&m).is_ok(), "another team's topology runs on");
    assert!(
        plan_manifest_here(&m).is_err(),
        "on one machine the user wrote it: refused"
    );
    let placing = plain.replace("{name: b}", "{name: b, cluster: far}");
    let m = parse("m.yaml", &format!("{CLUSTERS}{second_home}{placing}"));
    assert!(plan_manifest(&m).is_err());
}

#[test]
fn spread_needs_generated_nodes() {
    let e = errors_of(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: t}\nspec:\n  spread: {regions: [a]}\n  nodes: [{name: a}]\n",
    );
    has(&e, "spec.spread", "spec.generator makes none");
}

#[test]
fn a_scenario_event_is_held_to_the_same_floor() {
    let topology = "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: t}\nspec:\n  nodes: [{name: a}, {name: b, cluster: far}]\n  links: [{endpoints: [a, b], delay: 30ms}]\n  scenario:\n    events:\n      - {at: 1s, link: a-b, set: {delay: 25ms}}\n      - {at: 2s, link: a-b, set: {delay: 5ms}}\n";
    let e = errors_of(&format!("{CLUSTERS}{topology}"));
    has(
        &e,
        "spec.scenario.events[1].set.delay",
        "shorter than the real one-way delay",
    );
    assert!(
        !e.iter().any(|e| e.starts_with("spec.scenario.events[0]")),
        "25 ms covers 10 ms: {e:#?}"
    );
    let fine = topology.replace("delay: 5ms", "delay: 15ms");
    let p = plan("ok.yaml", &format!("{CLUSTERS}{fine}"));
    let set = |i: usize| match &p.scenario[i].change {
        EventChange::Params(pair) => (pair.forward.delay, pair.backward.delay),
        other => panic!("{other:?}"),
    };
    assert_eq!(set(0), (ms(15), ms(15)), "25 ms asked, 10 ms real");
    assert_eq!(set(1), (ms(5), ms(5)));
}

#[test]
fn spread_clusters_take_blocks_in_order() {
    let p = plan(
        "spread.yaml",
        &format!(
            "{CLUSTERS}apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: t}}\nspec:\n  generator: {{ring: {{nodes: 6}}}}\n  spread: {{clusters: [far, home]}}\n"
        ),
    );
    for n in ["n0", "n1", "n2"] {
        assert_eq!(site(&p, n), owned("far", "us"), "{n}");
    }
    for n in ["n3", "n4", "n5"] {
        assert_eq!(site(&p, n), owned("home", "eu"), "{n}");
    }
}
