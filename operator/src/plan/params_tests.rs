//! Link parameters from YAML: parsing, inheritance and validation.

use super::tests::{expect, parse, parse_errors, plan, plan_errors, topology_with};
use super::*;
use std::time::Duration;

const SHAPED: &str = include_str!("../../../manifests/examples/shaped.yaml");
const MERGE: &str = include_str!("../../tests/fixtures/params-merge.yaml");
const BAD_PARAMS: &str = include_str!("../../tests/fixtures/bad-params.yaml");

fn link<'p>(p: &'p Plan, name: &str) -> &'p PlannedLink {
    p.link(name).unwrap_or_else(|| panic!("no link {name}"))
}

#[test]
fn shaped_example_has_its_own_parameters_per_direction() {
    let p = plan("shaped.yaml", SHAPED);
    let access = link(&p, "access");
    assert_eq!(
        (access.dialer.as_str(), access.acceptor.as_str()),
        ("router", "client")
    );
    let defaults_queue = QueueParams {
        limit_packets: Some(1000),
        limit_bytes: None,
        aqm: Aqm::TailDrop,
    };
    let down = LinkParams {
        rate_bps: Some(20_000_000),
        delay: Some(Duration::from_millis(10)),
        jitter: Some(Duration::from_millis(2)),
        jitter_distribution: JitterDistribution::Normal,
        loss_ppm: Some(1_000),
        queue: defaults_queue.clone(),
        ..LinkParams::default()
    };
    assert_eq!(access.forward, down);
    assert_eq!(
        access.backward,
        LinkParams {
            rate_bps: Some(2_000_000),
            burst_bytes: Some(16_000),
            loss_ppm: Some(5_000),
            loss_correlation_ppm: Some(250_000),
            ..down
        },
        "the override replaces what it sets and inherits the rest"
    );

    let core = link(&p, "core");
    assert_eq!(core.transport, Transport::Tcp);
    assert_eq!(core.forward, core.backward);
    let tcp = Some(6);
    assert_eq!(
        core.forward,
        LinkParams {
            rate_bps: Some(100_000_000),
            delay: Some(Duration::from_millis(20)),
            queue: QueueParams {
                limit_packets: Some(500),
                limit_bytes: None,
                aqm: Aqm::Red {
                    min_packets: 50,
                    max_packets: 150,
                    max_p_ppm: 100_000,
                    weight_ppm: 2_000,
                    ecn: true,
                },
            },
            scheduler: SchedulerKind::Wrr {
                weights: vec![4, 1]
            },
            classes: vec![
                ClassRule {
                    queue: 0,
                    dscp: Some(46),
                    ..ClassRule::default()
                },
                ClassRule {
                    queue: 0,
                    protocol: tcp,
                    dst_port: Some(22),
                    ..ClassRule::default()
                },
                ClassRule {
                    queue: 0,
                    protocol: tcp,
                    src_port: Some(22),
                    ..ClassRule::default()
                },
            ],
            ..LinkParams::default()
        }
    );
}

#[test]
fn parameters_are_inherited_field_by_field() {
    let p = plan("params-merge.yaml", MERGE);
    let defaults = LinkParams {
        rate_bps: Some(1_000_000_000),
        delay: Some(Duration::from_millis(1)),
        jitter: Some(Duration::from_micros(100)),
        loss_ppm: Some(100),
        duplicate_ppm: Some(1_000),
        corrupt_ppm: Some(1),
        queue: QueueParams {
            limit_packets: Some(100),
            limit_bytes: None,
            aqm: Aqm::Ecn {
                threshold_packets: 20,
            },
        },
        scheduler: SchedulerKind::Priority { bands: 3 },
        classes: vec![ClassRule {
            queue: 0,
            dscp: Some(46),
            ..ClassRule::default()
        }],
        ..LinkParams::default()
    };

    let plain = link(&p, "plain");
    assert_eq!(plain.transport, Transport::Quic);
    assert_eq!((&plain.forward, &plain.backward), (&defaults, &defaults));

    let mixed = link(&p, "mixed");
    let own = LinkParams {
        queue: QueueParams {
            aqm: Aqm::TailDrop,
            ..defaults.queue.clone()
        },
        ..defaults.clone()
    };
    assert_eq!(
        mixed.forward,
        LinkParams {
            rate_bps: Some(10_000_000),
            classes: vec![],
            ..own.clone()
        },
        "an empty class list drops the inherited one"
    );
    assert_eq!(
        mixed.backward,
        LinkParams {
            queue: QueueParams {
                limit_packets: None,
                limit_bytes: Some(64_000),
                aqm: Aqm::TailDrop,
            },
            ..own
        },
        "limit and aqm are inherited separately; a limit is one field"
    );

    let own = link(&p, "own");
    assert_eq!(own.transport, Transport::Tcp);
    assert_eq!(
        (own.dialer.as_str(), own.acceptor.as_str()),
        ("c", "a"),
        "endpoints[0] dials and sends forward"
    );
    let backward = LinkParams {
        reorder_ppm: Some(10_000),
        jitter_distribution: JitterDistribution::Pareto,
        scheduler: SchedulerKind::Drr {
            quantum_bytes: vec![1500, 3000],
        },
        classes: vec![
            ClassRule {
                queue: 1,
                protocol: Some(17),
                dst_port: Some(53),
                max_packet_bytes: Some(512),
                ..ClassRule::default()
            },
            ClassRule {
                queue: 0,
                protocol: Some(47),
                ..ClassRule::default()
            },
        ],
        ..defaults.clone()
    };
    assert_eq!(own.backward, backward);
    assert_eq!(
        own.forward,
        LinkParams {
            loss_ppm: Some(0),
            scheduler: SchedulerKind::Fcfs,
            classes: vec![ClassRule {
                queue: 0,
                src_port: Some(8080),
                ..ClassRule::default()
            }],
            ..backward
        },
        "a scheduler is one field: fcfs replaces drr with its quantum"
    );
}

#[test]
fn parameter_rules_name_the_field_and_the_layer_to_fix() {
    let errors = plan_errors("bad-params.yaml", BAD_PARAMS);
    let topo = "bad-params.yaml document 1 (Topology/t)";
    let cd = "bad-params.yaml document 2 (Link/c-d)";
    let cases = [
        // linkDefaults on its own
        (
            topo,
            "spec.linkDefaults.burst",
            "must be at least the MTU (1400 bytes), got 1000 bytes",
        ),
        (
            topo,
            "spec.linkDefaults.queue.limit",
            "could never hold a full-size packet",
        ),
        (
            topo,
            "spec.linkDefaults.scheduler.wrr.weights[1]",
            "must be greater than 0",
        ),
        (
            topo,
            "spec.linkDefaults.classes[0].queue",
            "queue 5 does not exist: the scheduler at spec.linkDefaults.scheduler has 2 queue(s), 0 to 1",
        ),
        // ranges and units of one link
        (topo, "spec.links[0].rate", "must be greater than 0"),
        (
            topo,
            "spec.links[0].delay",
            "1.5us is not a whole number of microseconds",
        ),
        (
            topo,
            "spec.links[0].queue.aqm.red.min",
            "must be less than max (5), got 10",
        ),
        (
            topo,
            "spec.links[0].queue.aqm.red.maxP",
            "must be greater than 0%",
        ),
        (
            topo,
            "spec.links[0].queue.aqm.red.weight",
            "must be greater than 0 (at most 1)",
        ),
        (
            topo,
            "spec.links[0].scheduler",
            "set exactly one of fcfs, wrr, drr, priority, scheme",
        ),
        (
            topo,
            "spec.links[0].classes[0].dscp",
            "must be between 0 and 63, got 64",
        ),
        (
            topo,
            "spec.links[0].classes[0].srcPort",
            "must be between 1 and 65535, got 0",
        ),
        (
            topo,
            "spec.links[0].classes[0].dstPort",
            "must be between 1 and 65535, got 70000",
        ),
        (
            topo,
            "spec.links[0].classes[0].maxPacketSize",
            "must be in bytes",
        ),
        (
            topo,
            "spec.links[1].queue.aqm",
            "set exactly one of taildrop, red, ecn, scheme",
        ),
        (
            topo,
            "spec.links[1].queue.aqm.ecn.threshold",
            "must be at least 1 packet",
        ),
        (
            topo,
            "spec.links[1].scheduler.priority.bands",
            "must be between 1 and 8, got 9",
        ),
        // netem's dependencies, blamed on the more specific of the two fields
        (
            topo,
            "spec.links[1].reorder",
            "needs a delay greater than 0",
        ),
        (
            topo,
            "spec.links[1].forward.delay",
            "must be greater than 0 for spec.links[1].reorder",
        ),
        (
            topo,
            "spec.links[1].jitterDistribution",
            "needs a jitter greater than 0",
        ),
        // a Link object against linkDefaults and its own override
        (
            cd,
            "spec.scheduler.drr.quantum[1]",
            "must be greater than 0",
        ),
        (
            cd,
            "spec.scheduler.drr.quantum[2]",
            "must be in bytes, e.g. 1500",
        ),
        (
            cd,
            "spec.scheduler",
            "has 3 queue(s), but spec.linkDefaults.classes[0] in bad-params.yaml document 1 (Topology/t) sends packets to queue 5",
        ),
        (
            cd,
            "spec.queue.aqm.red.max",
            "must not exceed the queue limit of 100 packets (spec.queue.limit), got 200",
        ),
        (
            cd,
            "spec.backward.classes[0].queue",
            "queue 3 does not exist: the scheduler at spec.scheduler has 3 queue(s), 0 to 2",
        ),
        (
            cd,
            "spec.backward.queue.limit",
            "is below the 200 packets of spec.queue.aqm.red.max",
        ),
    ];
    for (document, field, reason) in cases {
        expect(&errors, document, field, reason);
    }
    assert_eq!(
        errors.len(),
        cases.len(),
        "each problem once, though both directions inherit it:\n{}",
        ValidationErrors(errors.clone())
    );
}

#[test]
fn classes_without_a_scheduler_have_one_queue() {
    let text = topology_with(
        "{nodes: [{name: a}, {name: b}], links: [{endpoints: [a, b], classes: [{queue: 0}, {queue: 1}]}]}",
    );
    let errors = plan_errors("one.yaml", &text);
    expect(
        &errors,
        "one.yaml document 1 (Topology/t)",
        "spec.links[0].classes[1].queue",
        "without a scheduler the link has one queue, 0",
    );
    assert_eq!(errors.len(), 1);
}

#[test]
fn netem_like_combinations_are_accepted() {
    // Jitter without delay (delay 0 ± jitter, clamped at 0) and jitter above delay are
    // fine in netem; so are QUIC links and a defaults template that only some links
    // complete.
    let text = topology_with(
        "{linkDefaults: {reorder: 1%, jitterDistribution: normal, transport: quic}, \
         nodes: [{name: a}, {name: b}, {name: c}], links: [\
         {endpoints: [a, b], jitter: 5ms}, \
         {endpoints: [b, c], delay: 1ms, jitter: 50ms, reorder: 0%}]}",
    );
    let p = plan("netem.yaml", &text);
    let ab = link(&p, "a-b");
    assert_eq!(ab.transport, Transport::Quic);
    assert_eq!(ab.forward.jitter, Some(Duration::from_millis(5)));
    assert_eq!(ab.forward.delay, None);
    assert_eq!(link(&p, "b-c").forward.reorder_ppm, Some(0));
}

#[test]
fn parameter_parse_errors_point_at_the_field() {
    let link = |spec: &str| {
        format!(
            "apiVersion: nextmini.io/v1alpha1\nkind: Link\nmetadata: {{name: l}}\nspec: {spec}\n"
        )
    };
    let doc = "p.yaml document 1 (Link/l)";
    let cases = [
        (
            "{topology: t, endpoints: [a, b], forward: {transport: quic}}",
            "spec.forward.transport",
            "unknown field `transport`",
        ),
        (
            "{topology: t, endpoints: [a, b], queue: 1000pkt}",
            "spec.queue",
            "expected a mapping such as {limit: 1000pkt",
        ),
        (
            "{topology: t, endpoints: [a, b], queue: {aqm: {red: {min: 1, max: 2, maxP: 1%}}}}",
            "spec.queue.aqm.red.weight",
            "missing field `weight`",
        ),
        (
            "{topology: t, endpoints: [a, b], queue: {aqm: {red: {min: 1, max: 2, maxP: 1%, weight: 1.5}}}}",
            "spec.queue.aqm.red.weight",
            "invalid fraction \"1.5\": it exceeds the maximum of 1",
        ),
        (
            "{topology: t, endpoints: [a, b], classes: [{queue: 0, protocol: sctp}]}",
            "spec.classes[0].protocol",
            "expected tcp, udp, icmp or a number from 0 to 255",
        ),
        (
            "{topology: t, endpoints: [a, b], jitterDistribution: gaussian}",
            "spec.jitterDistribution",
            "unknown variant `gaussian`",
        ),
        (
            "{topology: t, endpoints: [a, b], scheduler: {fcfs: {quantum: 1}}}",
            "spec.scheduler.fcfs.quantum",
            "unknown field `quantum`",
        ),
    ];
    for (spec, field, reason) in cases {
        let errors = parse_errors("p.yaml", &link(spec));
        expect(&errors, doc, field, reason);
        assert_eq!(errors.len(), 1, "{spec}");
    }
    // A weight written as a string parses too.
    let m = parse(
        "w.yaml",
        &link(
            "{topology: t, endpoints: [a, b], queue: {aqm: {red: {min: 1, max: 2, maxP: 1%, weight: '0.25'}}}}",
        ),
    );
    let red = m.links[0]
        .object
        .spec
        .queue
        .as_ref()
        .and_then(|q| q.aqm.as_ref())
        .and_then(|a| a.red.as_ref());
    assert_eq!(red.map(|r| r.weight.ppm()), Some(250_000));
}

#[test]
fn stored_json_uses_the_protocol_names_and_reads_old_rows() {
    let p = plan("shaped.yaml", SHAPED);
    let core = &link(&p, "core").forward;
    let json = serde_json::to_value(core).expect("serializes");
    assert_eq!(json["rate_bps"], serde_json::json!(100_000_000));
    assert_eq!(json["delay_us"], serde_json::json!(20_000));
    assert_eq!(
        json["queue"]["aqm"]["red"]["weight_ppm"],
        serde_json::json!(2_000)
    );
    assert_eq!(
        json["scheduler"],
        serde_json::json!({"wrr": {"weights": [4, 1]}})
    );
    assert_eq!(
        serde_json::from_value::<LinkParams>(json).ok().as_ref(),
        Some(core)
    );
    // What migration 0002 builds from a row of 0001.
    let migrated = serde_json::json!({
        "rate_bps": 1000, "burst_bytes": null, "delay_us": 5000, "jitter_us": null,
        "jitter_distribution": "uniform", "loss_ppm": 10, "loss_correlation_ppm": null,
        "reorder_ppm": null, "duplicate_ppm": null, "corrupt_ppm": null,
        "queue": {"limit_packets": 100, "limit_bytes": null, "aqm": "taildrop"},
        "scheduler": "fcfs", "classes": []
    });
    assert_eq!(
        serde_json::from_value::<LinkParams>(migrated).ok(),
        Some(LinkParams {
            rate_bps: Some(1000),
            delay: Some(Duration::from_millis(5)),
            loss_ppm: Some(10),
            queue: QueueParams {
                limit_packets: Some(100),
                ..QueueParams::default()
            },
            ..LinkParams::default()
        })
    );
    // Missing keys are unset; a misspelt one is an error, not an unshaped link.
    assert_eq!(
        serde_json::from_str::<LinkParams>("{}").ok(),
        Some(LinkParams::default())
    );
    assert!(serde_json::from_str::<LinkParams>(r#"{"rate": 5}"#).is_err());
}

const PFABRIC: &str = include_str!("../../../manifests/examples/pfabric.yaml");

#[test]
fn a_registered_scheme_reaches_the_agent_with_its_settings() {
    let p = plan("pfabric.yaml", PFABRIC);
    let bottleneck = link(&p, "bottleneck");
    let SchedulerKind::Scheme { name, settings } = &bottleneck.backward.scheduler else {
        panic!("not a scheme: {:?}", bottleneck.backward.scheduler)
    };
    assert_eq!(name, "pfabric");
    assert_eq!(
        settings["flows"][1],
        serde_json::json!({"port": 8003, "bytes": 200000})
    );
    // Two listed flows and everyone else.
    assert_eq!(bottleneck.backward.scheduler.queues(), 3);
    assert_eq!(bottleneck.forward.scheduler, SchedulerKind::Fcfs);
    let sent = crate::hub::params::to_proto(&bottleneck.backward);
    let Some(nextmini_proto::v1::scheduler_config::Kind::Scheme(scheme)) =
        sent.scheduler.as_ref().and_then(|s| s.kind.clone())
    else {
        panic!("the hub does not send the scheme")
    };
    assert_eq!(scheme.name, "pfabric");
    // What the agent builds from it: the same check the planner made.
    let cfg = nextmini_agent::sched::LinkConfig::from_params(&sent, 1500)
        .expect("the agent accepts what the planner accepted");
    assert_eq!(cfg.queues, 3);
}

#[test]
fn a_scheme_is_refused_by_name_and_by_setting() {
    const DOC: &str = "x.yaml document 1 (Topology/t)";
    let text = |scheduler: &str| {
        topology_with(&format!(
            "{{nodes: [{{name: a}}, {{name: b}}], links: [{{endpoints: [a, b], rate: 10Mbit, scheduler: {scheduler}}}]}}"
        ))
    };
    let errors = plan_errors("x.yaml", &text("{scheme: {name: fifo}}"));
    expect(
        &errors,
        DOC,
        "spec.links[0].scheduler.scheme.name",
        "no scheduler scheme is called \"fifo\"; registered: pfabric",
    );
    let errors = plan_errors(
        "x.yaml",
        &text(
            "{scheme: {name: pfabric, settings: {flows: [{port: 80, bytes: 1}, {port: 80000, bytes: 1}]}}}",
        ),
    );
    expect(
        &errors,
        DOC,
        "spec.links[0].scheduler.scheme.settings.flows[1].port",
        "80000",
    );
    let errors = plan_errors(
        "x.yaml",
        &text("{scheme: {name: pfabric, settings: {flows: [{port: 80, bytes: 0}]}}}"),
    );
    expect(
        &errors,
        DOC,
        "spec.links[0].scheduler.scheme.settings.flows[0].bytes",
        "must be greater than 0",
    );
    let errors = plan_errors(
        "x.yaml",
        &topology_with(
            "{nodes: [{name: a}, {name: b}], linkDefaults: {scheduler: {scheme: {name: pfabric, settings: {flows: []}}}}, links: [{endpoints: [a, b], classes: [{queue: 0, dscp: 46}]}]}",
        ),
    );
    expect(
        &errors,
        DOC,
        "spec.links[0].classes",
        "sorts packets into its queues itself; remove classes",
    );
    let errors = plan_errors(
        "x.yaml",
        &topology_with(
            "{nodes: [{name: a}, {name: b}], links: [{endpoints: [a, b], queue: {aqm: {scheme: {name: nothing}}}}]}",
        ),
    );
    expect(
        &errors,
        DOC,
        "spec.links[0].queue.aqm.scheme.name",
        "no AQM scheme is called \"nothing\"",
    );
}

#[test]
fn a_trace_replaces_a_less_specific_rate_and_reaches_the_agent() {
    let text = topology_with(
        "{nodes: [{name: a}, {name: b}], linkDefaults: {rate: 100Mbit, burst: 64KiB, delay: 5ms}, \
         links: [{endpoints: [a, b], trace: {inline: \"1\\n1\\n3\\n\\n4\\n\"}, backward: {rate: 2Mbit}}]}",
    );
    let p = plan("x.yaml", &text);
    let ab = link(&p, "a-b");
    assert_eq!(ab.forward.trace_ms, [1, 1, 3, 4]);
    assert_eq!(
        (ab.forward.rate_bps, ab.forward.burst_bytes),
        (None, None),
        "the link's trace wins over linkDefaults' rate and burst"
    );
    assert_eq!(ab.forward.delay, Some(Duration::from_millis(5)));
    // 4 opportunities of 1,500 bytes every 4 ms.
    assert_eq!(ab.forward.mean_rate_bps(), Some(12_000_000));
    assert!(ab.backward.trace_ms.is_empty(), "the override's rate wins");
    assert_eq!(ab.backward.rate_bps, Some(2_000_000));
    let sent = crate::hub::params::to_proto(&ab.forward);
    assert_eq!(sent.trace_ms, [1, 1, 3, 4]);
    let cfg = nextmini_agent::sched::LinkConfig::from_params(&sent, 1500)
        .expect("the agent accepts what the planner accepted");
    assert_eq!(cfg.shaper.mean_rate_bps(), 12_000_000);
    // What the store keeps and the hub loads back.
    let json = serde_json::to_value(&ab.forward).expect("json");
    assert_eq!(json["trace_ms"], serde_json::json!([1, 1, 3, 4]));
    assert!(ab.forward.problem_beyond_rules().is_none());
    let mut written = ab.forward.clone();
    written.trace_ms = vec![4, 2];
    assert_eq!(
        written.problem_beyond_rules(),
        Some((
            "trace_ms".into(),
            "entry 1 (2 ms) is before the one above it (4 ms): offsets must not decrease".into()
        ))
    );
    written.trace_ms = vec![1];
    written.rate_bps = Some(1);
    assert!(
        written
            .problem_beyond_rules()
            .is_some_and(|(k, _)| k == "trace_ms")
    );
}

#[test]
fn a_bad_trace_is_refused_by_line_and_beside_a_rate() {
    const DOC: &str = "x.yaml document 1 (Topology/t)";
    let errors = plan_errors(
        "x.yaml",
        &topology_with(
            "{nodes: [{name: a}, {name: b}], links: [{endpoints: [a, b], trace: {inline: \"1\\n2\\nfast\\n\"}}]}",
        ),
    );
    expect(
        &errors,
        DOC,
        "spec.links[0].trace.inline",
        "line 3: \"fast\" is not a whole number of milliseconds",
    );
    let errors = plan_errors(
        "x.yaml",
        &topology_with(
            "{nodes: [{name: a}, {name: b}], links: [{endpoints: [a, b], forward: {trace: {inline: \"5\\n3\\n\"}}}]}",
        ),
    );
    expect(
        &errors,
        DOC,
        "spec.links[0].forward.trace.inline",
        "entry 1 (3 ms) is before the one above it (5 ms)",
    );
    let errors = plan_errors(
        "x.yaml",
        &topology_with(
            "{nodes: [{name: a}, {name: b}], links: [{endpoints: [a, b], rate: 1Mbit, trace: {inline: \"1\\n\"}}]}",
        ),
    );
    expect(
        &errors,
        DOC,
        "spec.links[0].rate",
        "set either a rate (and burst) or a trace here",
    );
}

#[test]
fn the_trace_example_plans_a_traced_downlink_and_a_rated_uplink() {
    let p = plan(
        "trace.yaml",
        include_str!("../../../manifests/examples/trace.yaml"),
    );
    let link = &p.links[0];
    assert_eq!(link.forward.trace_ms.len(), 50);
    assert_eq!(link.forward.mean_rate_bps(), Some(6_000_000));
    assert_eq!(link.forward.delay, Some(Duration::from_millis(20)));
    assert!(link.backward.trace_ms.is_empty());
    assert_eq!(link.backward.rate_bps, Some(2_000_000));
}

const TRACE_MAP: &str = "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: lte}\ndata:\n  down: \"1\\n1\\n3\\n4\\n\"\n  up: \"2\\n4\\n\"\n";

#[test]
fn a_trace_read_from_a_configmap_of_the_manifest() {
    let text = topology_with(
        "{nodes: [{name: a}, {name: b}], linkDefaults: {trace: {configMap: {name: lte, key: down}}}, \
         links: [{endpoints: [a, b], backward: {trace: {configMap: {name: lte, key: up}}}}]}",
    ) + TRACE_MAP;
    let p = plan("x.yaml", &text);
    let ab = link(&p, "a-b");
    assert_eq!(ab.forward.trace_ms, [1, 1, 3, 4]);
    assert_eq!(ab.backward.trace_ms, [2, 4]);
    // A Link object's trace reads the same ConfigMaps.
    let link_doc = "---\napiVersion: nextmini.io/v1alpha1\nkind: Link\nmetadata: {name: l}\n\
                    spec: {topology: t, endpoints: [a, b], forward: {trace: {configMap: {name: lte, key: up}}}}\n";
    let text = topology_with("{nodes: [{name: a}, {name: b}]}") + link_doc + TRACE_MAP;
    let p = plan("x.yaml", &text);
    assert_eq!(link(&p, "l").forward.trace_ms, [2, 4]);
}

#[test]
fn a_configmap_trace_that_is_missing_or_bad_is_named() {
    const DOC: &str = "x.yaml document 1 (Topology/t)";
    let with = |trace: &str| {
        topology_with(&format!(
            "{{nodes: [{{name: a}}, {{name: b}}], links: [{{endpoints: [a, b], trace: {trace}}}]}}"
        )) + TRACE_MAP
    };
    let errors = plan_errors("x.yaml", &with("{configMap: {name: gone, key: down}}"));
    expect(
        &errors,
        DOC,
        "spec.links[0].trace.configMap",
        "no ConfigMap named gone",
    );
    let errors = plan_errors("x.yaml", &with("{configMap: {name: lte, key: side}}"));
    expect(
        &errors,
        DOC,
        "spec.links[0].trace.configMap",
        "ConfigMap lte has no key side (it has: down, up)",
    );
    let errors = plan_errors(
        "x.yaml",
        &with("{inline: \"1\\n\", configMap: {name: lte, key: down}}"),
    );
    expect(
        &errors,
        DOC,
        "spec.links[0].trace",
        "set exactly one of inline, configMap",
    );
    let bad = topology_with(
        "{nodes: [{name: a}, {name: b}], links: [{endpoints: [a, b], trace: {configMap: {name: lte, key: down}}}]}",
    ) + "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: lte}\ndata: {down: \"3\\n1\\n\"}\n";
    let errors = plan_errors("x.yaml", &bad);
    expect(
        &errors,
        DOC,
        "spec.links[0].trace.configMap",
        "ConfigMap lte key down: entry 1 (1 ms) is before the one above it (3 ms)",
    );
    // A ConfigMap document is held to ConfigMap's own header.
    let errors = parse_errors(
        "x.yaml",
        "apiVersion: nextmini.io/v1alpha1\nkind: ConfigMap\nmetadata: {name: m}\ndata: {}\n",
    );
    expect(
        &errors,
        "x.yaml document 1 (ConfigMap/m)",
        "apiVersion",
        "unknown apiVersion \"nextmini.io/v1alpha1\"; expected v1",
    );
}
