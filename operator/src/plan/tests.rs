//! Planner tests driven by the YAML fixtures in `operator/tests/fixtures/`.

use super::*;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const LINE3: &str = include_str!("../../tests/fixtures/line3.yaml");
const RING6: &str = include_str!("../../tests/fixtures/ring6.yaml");
const FATTREE: &str = include_str!("../../tests/fixtures/fattree-k4.yaml");
const BAD_PARSE: &str = include_str!("../../tests/fixtures/bad-parse.yaml");
const BAD_TOPOLOGY: &str = include_str!("../../tests/fixtures/bad-topology.yaml");
const BAD_FLOWS: &str = include_str!("../../tests/fixtures/bad-flows.yaml");
const BAD_GENERATOR: &str = include_str!("../../tests/fixtures/bad-generator.yaml");

pub(super) fn parse(source: &str, text: &str) -> Manifest {
    parse_manifest(source, text).unwrap_or_else(|e| panic!("{source} should parse:\n{e}"))
}

fn plans(source: &str, text: &str) -> Vec<Plan> {
    plan_manifest(&parse(source, text)).unwrap_or_else(|e| panic!("{source} should plan:\n{e}"))
}

pub(super) fn plan(source: &str, text: &str) -> Plan {
    let mut all = plans(source, text);
    assert_eq!(all.len(), 1, "{source} holds one topology");
    all.remove(0)
}

pub(super) fn parse_errors(source: &str, text: &str) -> Vec<FieldError> {
    match parse_manifest(source, text) {
        Ok(m) => panic!("{source} should not parse, got {m:?}"),
        Err(e) => e.0,
    }
}

pub(super) fn plan_errors(source: &str, text: &str) -> Vec<FieldError> {
    match plan_manifest(&parse(source, text)) {
        Ok(p) => panic!("{source} should not plan, got {p:?}"),
        Err(e) => e.0,
    }
}

/// Asserts that exactly this (document, field) pair was reported, with `reason` in it.
#[track_caller]
pub(super) fn expect(errors: &[FieldError], document: &str, field: &str, reason: &str) {
    let found: Vec<&FieldError> = errors
        .iter()
        .filter(|e| e.document == document && e.field == field)
        .collect();
    assert!(
        found.iter().any(|e| e.reason.contains(reason)),
        "no error {document}: {field}: ...{reason}...; got:\n{}",
        ValidationErrors(errors.to_vec())
    );
}

fn hop<'a>(
    hops: &'a std::collections::BTreeMap<String, Vec<NextHop>>,
    from: &str,
    to: &str,
) -> Option<&'a str> {
    let table = hops
        .get(from)
        .unwrap_or_else(|| panic!("no table for {from}"));
    let entry = table
        .iter()
        .find(|h| h.dst == to)
        .unwrap_or_else(|| panic!("{from} has no route to {to}"));
    entry.link.as_deref()
}

/// Follows next hops from `from` to `to`, returning the links taken.
fn route(
    plan: &Plan,
    hops: &std::collections::BTreeMap<String, Vec<NextHop>>,
    from: &str,
    to: &str,
) -> Vec<String> {
    let mut at = from.to_owned();
    let mut taken = Vec::new();
    while at != to {
        let link = hop(hops, &at, to).unwrap_or_else(|| panic!("{at} -> {to} has no link"));
        let l = plan
            .link(link)
            .unwrap_or_else(|| panic!("unknown link {link}"));
        at = if l.dialer == at {
            l.acceptor.clone()
        } else {
            l.dialer.clone()
        };
        taken.push(link.to_owned());
        assert!(
            taken.len() <= plan.nodes.len(),
            "routing loop from {from} to {to}"
        );
    }
    taken
}

// ---------------------------------------------------------------------------------------
// Parsing

#[test]
fn documents_are_labelled_with_file_index_kind_and_name() {
    let m = parse("line3.yaml", LINE3);
    assert_eq!(m.topologies.len(), 1);
    assert_eq!(
        m.topologies[0].origin,
        "line3.yaml document 1 (Topology/line3)"
    );
    assert_eq!(m.links[0].origin, "line3.yaml document 2 (Link/a-b)");
    assert_eq!(m.links[1].origin, "line3.yaml document 3 (Link/b-c)");
    assert_eq!(m.flows[0].origin, "line3.yaml document 4 (Flow/bulk)");
}

#[test]
fn empty_documents_are_skipped_but_counted() {
    let m = parse("ring6.yaml", RING6);
    assert_eq!(m.topologies.len(), 1);
    assert_eq!(m.flows[0].origin, "ring6.yaml document 3 (Flow/around)");
    assert_eq!(parse("empty.yaml", ""), Manifest::default());
    assert_eq!(
        parse("comments.yaml", "# nothing\n---\n---\n"),
        Manifest::default()
    );
}

#[test]
fn parse_errors_name_document_field_and_reason() {
    let errors = parse_errors("bad-parse.yaml", BAD_PARSE);
    expect(
        &errors,
        "bad-parse.yaml document 1 (Link/typo)",
        "spec.rat",
        "unknown field `rat`, expected one of `topology`",
    );
    expect(
        &errors,
        "bad-parse.yaml document 1 (Link/typo)",
        "spec.rat",
        "(line 8, column 3)",
    );
    expect(
        &errors,
        "bad-parse.yaml document 2 (Link/bad-rate)",
        "spec.rate",
        "invalid rate \"100Mbt\": unknown unit \"Mbt\"; expected bit, kbit, Mbit",
    );
    expect(
        &errors,
        "bad-parse.yaml document 3 (Topology/future)",
        "apiVersion",
        "unknown apiVersion \"nextmini.io/v2\"; expected nextmini.io/v1alpha1",
    );
    expect(
        &errors,
        "bad-parse.yaml document 4 (Router/r1)",
        "kind",
        "unknown kind \"Router\"; expected Topology, Link, Flow, MemberCluster (nextmini.io/v1alpha1) or ConfigMap (v1)",
    );
    expect(
        &errors,
        "bad-parse.yaml document 5 (Flow/wrong-type)",
        "spec.count",
        "invalid type: string \"many\", expected u32",
    );
    expect(
        &errors,
        "bad-parse.yaml document 6 (Topology/bad-node)",
        "spec.nodes[0].resources.cpu",
        "invalid cpu \"2cores\"",
    );
    expect(
        &errors,
        "bad-parse.yaml document 7 (Link/bad-endpoint)",
        "spec.endpoints[1]",
        "invalid type: sequence, expected a string",
    );
    expect(
        &errors,
        "bad-parse.yaml document 8 (Flow/missing-dst)",
        "spec.dst",
        "missing field `dst`",
    );
    expect(
        &errors,
        "bad-parse.yaml document 9 (Flow)",
        "metdata",
        "unknown field `metdata`",
    );
    assert_eq!(errors.len(), 10, "{}", ValidationErrors(errors.clone()));
}

#[test]
fn yaml_syntax_errors_stop_the_stream() {
    let text =
        "apiVersion: nextmini.io/v1alpha1\nkind: Flow\n---\nkey: [unclosed\n---\nkind: Link\n";
    let errors = parse_errors("broken.yaml", text);
    assert_eq!(errors.len(), 3, "{}", ValidationErrors(errors.clone()));
    // The first document is well-formed YAML but lacks metadata and spec.
    expect(
        &errors,
        "broken.yaml document 1 (Flow)",
        "metadata",
        "missing",
    );
    expect(&errors, "broken.yaml document 1 (Flow)", "spec", "missing");
    expect(
        &errors,
        "broken.yaml document 2",
        WHOLE_DOCUMENT,
        "invalid YAML",
    );
}

#[test]
fn documents_must_be_mappings_with_names() {
    let errors = parse_errors("odd.yaml", "- a\n- b\n");
    expect(
        &errors,
        "odd.yaml document 1",
        WHOLE_DOCUMENT,
        "expected a mapping with apiVersion, kind, metadata and spec",
    );

    let text =
        "apiVersion: nextmini.io/v1alpha1\nkind: Flow\nmetadata: {labels: {}, nmae: x}\nspec: {}\n";
    let errors = parse_errors("meta.yaml", text);
    expect(
        &errors,
        "meta.yaml document 1 (Flow)",
        "metadata.nmae",
        "unknown field `nmae`",
    );
    expect(
        &errors,
        "meta.yaml document 1 (Flow)",
        "metadata.name",
        "missing; every object needs a name",
    );
}

#[test]
fn errors_display_one_per_line() {
    let e = ValidationErrors(vec![
        FieldError::new("f.yaml document 1 (Link/x)", "spec.rate", "bad"),
        FieldError::new("f.yaml document 2", "kind", "worse"),
    ]);
    assert_eq!(
        e.to_string(),
        "f.yaml document 1 (Link/x): spec.rate: bad\nf.yaml document 2: kind: worse"
    );
    assert_eq!(
        e.0[0].to_string(),
        "f.yaml document 1 (Link/x): spec.rate: bad"
    );
}

// ---------------------------------------------------------------------------------------
// Planning the good fixtures

#[test]
fn line3_addresses_dialers_and_params() {
    let p = plan("line3.yaml", LINE3);
    assert_eq!(p.topology, "line3");
    assert_eq!(p.placement, Placement::Netns);
    assert_eq!(
        p.dataplane,
        Dataplane {
            processors: 2,
            mapping: Mapping::Sequential,
            mtu: 1400,
            ttl_decrement: false,
        }
    );
    assert_eq!(p.overlay.to_string(), "198.18.0.0/16");
    assert_eq!(p.underlay.to_string(), "198.19.0.0/17");

    let names: Vec<(&str, u32, Ipv4Addr, Ipv4Addr)> = p
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.index, n.overlay, n.underlay))
        .collect();
    assert_eq!(
        names,
        [
            (
                "a",
                0,
                Ipv4Addr::new(198, 18, 0, 1),
                Ipv4Addr::new(198, 19, 0, 1)
            ),
            (
                "b",
                1,
                Ipv4Addr::new(198, 18, 0, 2),
                Ipv4Addr::new(198, 19, 0, 2)
            ),
            (
                "c",
                2,
                Ipv4Addr::new(198, 18, 0, 3),
                Ipv4Addr::new(198, 19, 0, 3)
            ),
        ]
    );
    let b = p.node("b").expect("b");
    assert_eq!(
        b.resources,
        Resources {
            cpu_millis: Some(500),
            memory_bytes: Some(64 << 20)
        }
    );
    assert_eq!(
        p.node("a").map(|n| n.resources.clone()),
        Some(Resources::default())
    );

    let ab = p.link("a-b").expect("a-b");
    assert_eq!((ab.dialer.as_str(), ab.acceptor.as_str()), ("a", "b"));
    assert_eq!(ab.transport, Transport::Tcp);
    assert_eq!(
        ab.forward,
        LinkParams {
            rate_bps: Some(100_000_000),
            delay: Some(Duration::from_millis(5)),
            loss_ppm: Some(1_000),
            ..LinkParams::default()
        }
    );
    assert_eq!(
        ab.backward, ab.forward,
        "no override: both directions alike"
    );
    let bc = p.link("b-c").expect("b-c");
    assert_eq!((bc.dialer.as_str(), bc.acceptor.as_str()), ("b", "c"));
    assert_eq!(bc.transport, Transport::Quic);
    assert_eq!(bc.forward.rate_bps, Some(50_000_000));

    assert_eq!(
        p.flows,
        [PlannedFlow {
            name: "bulk".into(),
            src: "a".into(),
            dst: "c".into(),
            path: None,
            params: FlowParams {
                amount: FlowAmount::Bytes(100_000_000),
                count: 4,
                ..FlowParams::default()
            },
            defined_generation: 0,
            route_id: None,
        }]
    );
}

#[test]
fn line3_routes() {
    let p = plan("line3.yaml", LINE3);
    let hops = next_hops(&p);
    assert_eq!(hops.len(), 3);
    assert_eq!(hop(&hops, "a", "c"), Some("a-b"));
    assert_eq!(hop(&hops, "b", "c"), Some("b-c"));
    assert_eq!(hop(&hops, "c", "a"), Some("b-c"));
    assert_eq!(hop(&hops, "b", "a"), Some("a-b"));
    assert_eq!(hop(&hops, "a", "a"), None);
    assert_eq!(route(&p, &hops, "a", "c"), ["a-b", "b-c"]);
    // Destinations come in node order, the node itself included.
    let dsts: Vec<&str> = hops["b"].iter().map(|h| h.dst.as_str()).collect();
    assert_eq!(dsts, ["a", "b", "c"]);
}

#[test]
fn path_links_follows_explicit_paths() {
    let p = plan("line3.yaml", LINE3);
    let path =
        |nodes: &[&str]| path_links(&p, &nodes.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(
        path(&["a", "b", "c"]),
        Some(vec!["a-b".to_owned(), "b-c".to_owned()])
    );
    assert_eq!(path(&["c", "b"]), Some(vec!["b-c".to_owned()]));
    assert_eq!(path(&["a"]), Some(vec![]));
    assert_eq!(path(&["a", "c"]), None);
    assert_eq!(path(&["a", "x"]), None);
    assert_eq!(path(&[]), None);
}

#[test]
fn ring6_generator_inline_links_and_defaults() {
    let p = plan("ring6.yaml", RING6);
    let names: Vec<&str> = p.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["n0", "n1", "n2", "n3", "n4", "n5"]);
    assert_eq!(
        p.node("n5").map(|n| n.overlay),
        Some(Ipv4Addr::new(10, 10, 0, 6))
    );
    assert_eq!(
        p.node("n5").map(|n| n.underlay),
        Some(Ipv4Addr::new(10, 20, 0, 6))
    );
    assert_eq!(
        p.dataplane,
        Dataplane {
            processors: 4,
            mapping: Mapping::Concurrent,
            mtu: 1400,
            ttl_decrement: true,
        }
    );

    let links: Vec<&str> = p.links.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        links,
        [
            "n0-n1", "n1-n2", "n2-n3", "n3-n4", "n4-n5", "n5-n0", "shortcut"
        ],
        "sorted by name"
    );
    let wrap = p.link("n5-n0").expect("n5-n0");
    assert_eq!((wrap.dialer.as_str(), wrap.acceptor.as_str()), ("n5", "n0"));
    assert_eq!(wrap.forward.rate_bps, Some(200_000_000));
    assert_eq!(wrap.forward.queue.limit_packets, Some(1000));
    let shortcut = p.link("shortcut").expect("shortcut");
    assert_eq!(
        shortcut.forward.delay,
        Some(Duration::from_millis(20)),
        "own value wins"
    );
    assert_eq!(
        shortcut.forward.rate_bps,
        Some(200_000_000),
        "default fills in"
    );
    assert_eq!(
        (
            shortcut.forward.queue.limit_packets,
            shortcut.forward.queue.limit_bytes
        ),
        (None, Some(140_000)),
        "the limit is one field: the link's byte limit replaces the default packet limit"
    );

    assert_eq!(
        p.flows[0].path.as_deref(),
        Some(&["n0", "n5", "n4", "n3"].map(String::from)[..])
    );
    let hops = next_hops(&p);
    // The shortcut n1-n4 makes n0 -> n4 two hops either way; the lower link name wins.
    assert_eq!(hop(&hops, "n0", "n4"), Some("n0-n1"));
    assert_eq!(route(&p, &hops, "n0", "n4"), ["n0-n1", "shortcut"]);
}

#[test]
fn ring_routes_take_the_shorter_way_round() {
    let text = "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: r}\nspec: {generator: {ring: {nodes: 6}}}\n";
    let p = plan("ring.yaml", text);
    let hops = next_hops(&p);
    assert_eq!(hop(&hops, "n0", "n2"), Some("n0-n1"));
    assert_eq!(hop(&hops, "n0", "n4"), Some("n5-n0"));
    assert_eq!(hop(&hops, "n0", "n5"), Some("n5-n0"));
    // n3 is three hops either way: the lowest link name breaks the tie.
    assert_eq!(hop(&hops, "n0", "n3"), Some("n0-n1"));
    assert_eq!(route(&p, &hops, "n1", "n5"), ["n0-n1", "n5-n0"]);
    for (from, table) in &hops {
        assert_eq!(table.len(), 6, "{from} reaches every node");
    }
}

#[test]
fn fat_tree_routes_have_textbook_lengths() {
    let p = plan("fattree-k4.yaml", FATTREE);
    assert_eq!(p.placement, Placement::PodPerNode);
    assert_eq!(p.nodes.len(), 36);
    assert_eq!(p.links.len(), 48);
    assert!(
        p.links
            .iter()
            .all(|l| l.transport == Transport::Quic && l.forward.rate_bps == Some(10_000_000_000))
    );
    let hosts: Vec<&PlannedNode> = p
        .nodes
        .iter()
        .filter(|n| n.name.starts_with("host-"))
        .collect();
    assert_eq!(hosts.len(), 16);
    let uplink = p.link("edge-0-0-host-0-0-0").expect("edge-host link");
    assert_eq!(
        (uplink.dialer.as_str(), uplink.acceptor.as_str()),
        ("edge-0-0", "host-0-0-0")
    );

    let hops = next_hops(&p);
    assert_eq!(
        route(&p, &hops, "host-0-0-0", "host-0-0-1").len(),
        2,
        "same edge switch"
    );
    assert_eq!(
        route(&p, &hops, "host-0-0-0", "host-0-1-0").len(),
        4,
        "same pod"
    );
    assert_eq!(
        route(&p, &hops, "host-0-0-0", "host-3-1-1").len(),
        6,
        "across pods"
    );
    for a in &hosts {
        for b in &hosts {
            let len = route(&p, &hops, &a.name, &b.name).len();
            assert!(
                matches!(len, 0 | 2 | 4 | 6),
                "{} -> {}: {len} hops",
                a.name,
                b.name
            );
        }
    }
    assert!(hops.values().all(|t| t.len() == 36));
}

#[test]
fn thousand_node_line_and_ring_plan_quickly() {
    for (shape, far, first_link) in [("line", "n999", "n0-n1"), ("ring", "n600", "n999-n0")] {
        let text = format!(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: big}}\nspec: {{generator: {{{shape}: {{nodes: 1000}}}}}}\n"
        );
        let started = Instant::now();
        let p = plan("big.yaml", &text);
        let hops = next_hops(&p);
        let elapsed = started.elapsed();
        assert_eq!(p.nodes.len(), 1000);
        assert_eq!(
            p.node("n999").map(|n| n.overlay),
            Some(Ipv4Addr::new(198, 18, 3, 232))
        );
        assert_eq!(hop(&hops, "n0", far), Some(first_link), "{shape}");
        assert_eq!(hops["n500"].len(), 1000);
        // Generous for unoptimized builds on a busy machine; O(n^2) would be far below it
        // and an O(n^3) algorithm far above.
        assert!(
            elapsed < Duration::from_secs(20),
            "{shape} of 1000 nodes took {elapsed:?}"
        );
    }
}

#[test]
fn links_and_flows_may_come_from_other_files() {
    let mut m = parse(
        "topo.yaml",
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: t}\nspec: {nodes: [{name: x}, {name: y}]}\n",
    );
    m.extend(parse("links.yaml", "apiVersion: nextmini.io/v1alpha1\nkind: Link\nmetadata: {name: x-y}\nspec: {topology: t, endpoints: [y, x]}\n"));
    let p = plan_manifest(&m).expect("plans");
    assert_eq!(p[0].links[0].dialer, "y");
    assert_eq!(p[0].links[0].acceptor, "x");
}

// ---------------------------------------------------------------------------------------
// Validation rules

#[test]
fn topology_rules() {
    let errors = plan_errors("bad-topology.yaml", BAD_TOPOLOGY);
    let topo = "bad-topology.yaml document 1 (Topology/broken)";
    expect(
        &errors,
        topo,
        "spec.dataplane.processors",
        "must be between 1 and 64, got 65",
    );
    expect(
        &errors,
        topo,
        "spec.dataplane.mtu",
        "must be between 576 and 9000, got 100",
    );
    expect(
        &errors,
        topo,
        "spec.addressing.underlay",
        "10.0.128.0/17 overlaps the overlay pool 10.0.0.0/16",
    );
    expect(
        &errors,
        topo,
        "spec.linkDefaults.rate",
        "must be greater than 0",
    );
    expect(
        &errors,
        topo,
        "spec.nodes[2].name",
        "duplicate node name \"a\" (also spec.nodes[0].name)",
    );
    expect(
        &errors,
        topo,
        "spec.nodes[3].name",
        "\"Bad_Name\" is not a DNS label",
    );
    expect(
        &errors,
        topo,
        "spec.links[1].endpoints[1]",
        "no node \"ghost\" in topology \"broken\"",
    );
    expect(
        &errors,
        topo,
        "spec.links[2].endpoints[1]",
        "a link cannot connect node \"c\" to itself",
    );
    expect(
        &errors,
        "bad-topology.yaml document 2 (Link/a-b)",
        "metadata.name",
        "duplicate link name \"a-b\" (also bad-topology.yaml document 1 (Topology/broken) spec.links[0].endpoints)",
    );
    expect(
        &errors,
        "bad-topology.yaml document 3 (Link/again)",
        "spec.endpoints",
        "\"b\" and \"a\" are already linked by \"a-b\"",
    );
    expect(
        &errors,
        "bad-topology.yaml document 4 (Link/stray)",
        "spec.topology",
        "no Topology \"nowhere\" in the manifest",
    );
    assert_eq!(errors.len(), 11, "{}", ValidationErrors(errors.clone()));
}

#[test]
fn flow_rules() {
    let errors = plan_errors("bad-flows.yaml", BAD_FLOWS);
    let doc = |i: usize, name: &str| format!("bad-flows.yaml document {i} (Flow/{name})");
    expect(
        &errors,
        &doc(2, "to-ghost"),
        "spec.src",
        "no node \"ghost\" in topology \"islands\"",
    );
    expect(
        &errors,
        &doc(3, "to-island"),
        "spec.dst",
        "\"z\" cannot be reached from \"a\"",
    );
    expect(
        &errors,
        &doc(4, "skips"),
        "spec.path[1]",
        "no link between \"a\" and \"c\"",
    );
    expect(
        &errors,
        &doc(5, "loops"),
        "spec.path[2]",
        "node \"a\" appears twice: the path has a cycle",
    );
    expect(
        &errors,
        &doc(6, "wrong-ends"),
        "spec.path[0]",
        "the path must start at src \"a\", not \"b\"",
    );
    expect(
        &errors,
        &doc(6, "wrong-ends"),
        "spec.path[1]",
        "the path must end at dst \"d\", not \"c\"",
    );
    expect(
        &errors,
        &doc(7, "selfish"),
        "spec.count",
        "must be at least 1",
    );
    expect(
        &errors,
        &doc(7, "selfish"),
        "spec.dst",
        "src and dst are the same node \"a\"",
    );
    expect(
        &errors,
        &doc(8, "to-ghost"),
        "metadata.name",
        "duplicate Flow \"to-ghost\"",
    );
    expect(
        &errors,
        &doc(8, "to-ghost"),
        "spec.size",
        "must be in bytes, e.g. 100MB",
    );
}

#[test]
fn generator_rules() {
    let errors = plan_errors("bad-generator.yaml", BAD_GENERATOR);
    let doc = |i: usize, name: &str| format!("bad-generator.yaml document {i} (Topology/{name})");
    expect(
        &errors,
        &doc(1, "two-shapes"),
        "spec.generator",
        "set exactly one of ring, line, star, fatTree (found ring, line)",
    );
    expect(
        &errors,
        &doc(2, "odd-tree"),
        "spec.generator.fatTree.k",
        "k must be even and at least 2, got 3",
    );
    expect(
        &errors,
        &doc(3, "tiny-ring"),
        "spec.generator.ring.nodes",
        "a ring needs at least 3 nodes, got 2",
    );
    expect(
        &errors,
        &doc(4, "too-big"),
        "spec.generator.line.nodes",
        "300 nodes do not fit the address pools: the overlay pool 10.1.0.0/24 holds 254",
    );
    expect(
        &errors,
        &doc(5, "clash"),
        "spec.nodes[0].name",
        "duplicate node name \"n1\" (also generated by spec.generator.line)",
    );
    assert_eq!(
        errors.len(),
        5,
        "every topology reports, without follow-on noise:\n{}",
        ValidationErrors(errors.clone())
    );
}

pub(super) fn topology_with(spec: &str) -> String {
    format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: t}}\nspec: {spec}\n"
    )
}

#[test]
fn node_names_must_be_dns_labels() {
    let long = "x".repeat(64);
    let text = topology_with(&format!(
        "{{nodes: [{{name: ok-1}}, {{name: -a}}, {{name: {long}}}, {{name: a.b}}]}}"
    ));
    let errors = plan_errors("names.yaml", &text);
    let doc = "names.yaml document 1 (Topology/t)";
    expect(
        &errors,
        doc,
        "spec.nodes[1].name",
        "\"-a\" is not a DNS label",
    );
    expect(
        &errors,
        doc,
        "spec.nodes[2].name",
        "is 64 characters long; node names are host names of at most 63",
    );
    expect(
        &errors,
        doc,
        "spec.nodes[3].name",
        "\"a.b\" is not a DNS label",
    );
    assert_eq!(errors.len(), 3);
    assert_eq!(dns_label_problem(&"y".repeat(63)), None);
}

#[test]
fn nodes_must_fit_the_pools_and_exist() {
    let nodes: Vec<String> = (0..3).map(|i| format!("{{name: n{i}}}")).collect();
    let text = topology_with(&format!(
        "{{addressing: {{overlay: 10.0.0.0/30, underlay: 10.1.0.0/24}}, nodes: [{}]}}",
        nodes.join(", ")
    ));
    let errors = plan_errors("pool.yaml", &text);
    expect(
        &errors,
        "pool.yaml document 1 (Topology/t)",
        "spec.nodes",
        "3 nodes do not fit the address pools: the overlay pool 10.0.0.0/30 holds 2",
    );

    let errors = plan_errors("empty.yaml", &topology_with("{}"));
    expect(
        &errors,
        "empty.yaml document 1 (Topology/t)",
        "spec.nodes",
        "a topology needs at least one node",
    );
}

#[test]
fn link_shape_and_parameter_rules() {
    let text = topology_with(
        "{nodes: [{name: a}, {name: b}, {name: c}], links: [\
         {endpoints: [a, b, c]}, \
         {endpoints: [a, b], queue: {limit: 0pkt}, burst: 10pkt, rate: 0Mbit}, \
         {name: a-b, endpoints: [b, c]}]}",
    );
    let errors = plan_errors("links.yaml", &text);
    let doc = "links.yaml document 1 (Topology/t)";
    expect(
        &errors,
        doc,
        "spec.links[0].endpoints",
        "a link joins exactly 2 nodes, found 3",
    );
    expect(
        &errors,
        doc,
        "spec.links[1].queue.limit",
        "must hold at least 1 packet",
    );
    expect(
        &errors,
        doc,
        "spec.links[1].burst",
        "must be in bytes, e.g. 64KiB",
    );
    expect(&errors, doc, "spec.links[1].rate", "must be greater than 0");
    expect(
        &errors,
        doc,
        "spec.links[2].name",
        "duplicate link name \"a-b\" (also links.yaml document 1 (Topology/t) spec.links[1].endpoints)",
    );
    assert_eq!(errors.len(), 5, "{}", ValidationErrors(errors.clone()));
}

#[test]
fn node_resources_must_be_sensible() {
    let text = topology_with("{nodes: [{name: a, resources: {cpu: 0m, memory: 10pkt}}]}");
    let errors = plan_errors("res.yaml", &text);
    expect(
        &errors,
        "res.yaml document 1 (Topology/t)",
        "spec.nodes[0].resources.cpu",
        "must be greater than 0",
    );
    expect(
        &errors,
        "res.yaml document 1 (Topology/t)",
        "spec.nodes[0].resources.memory",
        "must be in bytes, e.g. 64Mi",
    );
}

#[test]
fn errors_from_every_topology_are_collected() {
    let text = format!(
        "{}---\n{}",
        topology_with("{nodes: [{name: a}, {name: a}]}"),
        topology_with("{dataplane: {processors: 0}, nodes: [{name: b}]}")
            .replace("name: t}", "name: u}")
    );
    let errors = plan_errors("two.yaml", &text);
    expect(
        &errors,
        "two.yaml document 1 (Topology/t)",
        "spec.nodes[1].name",
        "duplicate node name",
    );
    expect(
        &errors,
        "two.yaml document 2 (Topology/u)",
        "spec.dataplane.processors",
        "got 0",
    );

    let dup = format!(
        "{}---\n{}",
        topology_with("{nodes: [{name: a}]}"),
        topology_with("{nodes: [{name: b}]}")
    );
    let errors = plan_errors("dup.yaml", &dup);
    expect(
        &errors,
        "dup.yaml document 2 (Topology/t)",
        "metadata.name",
        "duplicate Topology \"t\" (also dup.yaml document 1 (Topology/t))",
    );
}

#[test]
fn link_objects_and_empty_paths_are_checked_too() {
    let text = format!(
        "{}---\n{}---\n{}",
        topology_with("{nodes: [{name: a}, {name: b}], links: [{endpoints: [a, b]}]}"),
        "apiVersion: nextmini.io/v1alpha1\nkind: Link\nmetadata: {name: lonely}\nspec: {topology: t, endpoints: [a]}\n",
        "apiVersion: nextmini.io/v1alpha1\nkind: Flow\nmetadata: {name: nowhere}\nspec: {topology: t, src: a, dst: b, path: []}\n",
    );
    let errors = plan_errors("misc.yaml", &text);
    expect(
        &errors,
        "misc.yaml document 2 (Link/lonely)",
        "spec.endpoints",
        "a link joins exactly 2 nodes, found 1",
    );
    expect(
        &errors,
        "misc.yaml document 3 (Flow/nowhere)",
        "spec.path",
        "must list the nodes from src to dst",
    );
    assert_eq!(errors.len(), 2, "{}", ValidationErrors(errors.clone()));
}

#[test]
fn namespace_mode_refuses_application_containers_by_field() {
    let text = "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: t}\nspec:\n  nodes:\n  - {name: a}\n  - name: b\n    containers: [{name: web, image: 'docker.io/nextmini/tools:dev'}]\n  links: [{endpoints: [a, b]}]\n";
    let manifest = parse("t.yaml", text);
    // Valid for a cluster (pod per node) ...
    assert_eq!(plan_manifest(&manifest).expect("plans").len(), 1);
    // ... but namespace mode would drop the containers without a word.
    let errors = check_local(&manifest).expect_err("refused locally");
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["spec.nodes[1].containers"]);
    assert!(check_local(&parse("line3.yaml", LINE3)).is_ok());
}

#[test]
fn namespace_mode_refuses_names_that_cannot_make_a_key() {
    let text = "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: a/b, namespace: Team_A}\nspec:\n  nodes: [{name: a}, {name: b}]\n  links: [{endpoints: [a, b]}]\n";
    let errors = check_local(&parse("t.yaml", text)).expect_err("refused locally");
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["metadata.namespace", "metadata.name"]);
    let named = text.replace(
        "{name: a/b, namespace: Team_A}",
        "{name: wan, namespace: team-a}",
    );
    assert!(check_local(&parse("t.yaml", &named)).is_ok());
}

#[test]
fn ttl_decrement_warns_when_a_path_outlives_the_default_ttl() {
    let line = |nodes: u32, ttl: &str| {
        plan(
            "line.yaml",
            &format!(
                "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: l}}\n\
                 spec: {{dataplane: {{ttl: {ttl}}}, generator: {{line: {{nodes: {nodes}}}}}}}\n"
            ),
        )
    };
    // 65 links: the 64th transit node gets a TTL-64 packet with 1 left.
    let long = line(66, "decrement");
    assert_eq!(crate::plan::longest_path(&long), 65);
    let warnings = crate::plan::warnings(&long);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("spec.dataplane.ttl") && warnings[0].contains("65 links"));
    assert!(
        crate::plan::warnings(&line(65, "decrement")).is_empty(),
        "64 links fit"
    );
    assert!(crate::plan::warnings(&line(300, "transparent")).is_empty());
}
