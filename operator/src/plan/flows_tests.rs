//! Flows from YAML: workloads resolved into plan parameters, and every rule
//! with the document and field it blames.

use super::*;

fn plan(name: &str, text: &str) -> Plan {
    let m = parse_manifest(name, text).expect("parses");
    plan_manifest(&m).expect("plans").remove(0)
}

fn errors(name: &str, text: &str) -> Vec<FieldError> {
    let m = parse_manifest(name, text).expect("parses");
    plan_manifest(&m).expect_err("invalid").0
}

fn expect(errors: &[FieldError], flow: &str, field: &str, reason: &str) {
    assert!(
        errors
            .iter()
            .any(|e| e.document.ends_with(&format!("(Flow/{flow})"))
                && e.field == field
                && e.reason.contains(reason)),
        "no error for {flow} {field} containing {reason:?} in:\n{}",
        ValidationErrors(errors.to_vec())
    );
}

const WORKLOADS: &str = include_str!("../../tests/fixtures/workloads.yaml");
const BAD: &str = include_str!("../../tests/fixtures/bad-workloads.yaml");

#[test]
fn workloads_become_plan_parameters() {
    let p = plan("workloads.yaml", WORKLOADS);
    let flow = |name: &str| p.flows.iter().find(|f| f.name == name).expect(name);

    let web = &flow("web").params;
    let FlowAmount::Cdf(points) = &web.amount else {
        panic!("web-search sizes: {:?}", web.amount);
    };
    assert_eq!(points.len(), 12);
    assert!((cdf_mean(points) - 1_711_250.0).abs() < 1.0);
    // 30% of 100 Mbit/s over a mean of 1,711,250 bytes: 2.19 flows per second.
    let expected = 1e6 / (0.3 * 100e6 / (8.0 * 1_711_250.0));
    let gap = web.mean_interarrival_us.expect("poisson") as f64;
    assert!((gap - expected).abs() < 1.0, "{gap} µs");
    assert_eq!((web.count, web.seed, web.parallelism), (500, 7, 0));
    assert_eq!(web.dscp_by_size, [(100_000, 46)]);
    assert_eq!(flow("web").path.as_ref().map(Vec::len), Some(3));

    // c → b → a crosses b-c backwards, where the rate is 10 Mbit/s.
    let back = &flow("back").params;
    let expected: f64 = 1e6 / (0.5 * 10e6 / (8.0 * 1e6));
    assert_eq!(back.mean_interarrival_us, Some(expected.round() as u64));

    let custom = &flow("custom").params;
    assert_eq!(
        custom.amount,
        FlowAmount::Cdf(vec![(1000, 0.5), (3000, 1.0)]),
        "percent scaled, header and comments skipped"
    );
    assert_eq!(custom.mean_interarrival_us, Some(250_000));
    assert_eq!((custom.parallelism, custom.window_bytes), (1, 256 * 1024));
    assert_eq!(custom.congestion_control, CongestionControl::Reno);
    assert_eq!(custom.start_delay_us, 2_000_000);

    let cbr = &flow("cbr").params;
    assert_eq!(cbr.protocol, FlowProtocol::Udp);
    assert_eq!(cbr.amount, FlowAmount::DurationUs(10_000_000));
    assert_eq!((cbr.rate_bps, cbr.dscp), (Some(5_000_000), 10));
    assert_eq!(cbr.window_bytes, DEFAULT_WINDOW);
}

#[test]
fn flow_params_round_trip_through_the_store_json() {
    let p = plan("workloads.yaml", WORKLOADS);
    for f in &p.flows {
        let json = serde_json::to_string(&f.params).expect("serializes");
        let back: FlowParams = serde_json::from_str(&json).expect("parses");
        assert_eq!(back, f.params, "{json}");
    }
}

#[test]
fn workload_rules() {
    let e = errors("bad-workloads.yaml", BAD);
    expect(
        &e,
        "both",
        "spec.duration",
        "set at most one of size, sizes, duration",
    );
    expect(
        &e,
        "udp-no-rate",
        "spec.rate",
        "udp flows send at a constant rate",
    );
    expect(&e, "udp-no-rate", "spec.size", "must be greater than 0");
    expect(&e, "maxed", "spec.mode", "max mode relays TCP connections");
    expect(
        &e,
        "maxed",
        "spec.rate",
        "max mode runs at the speed of the machine",
    );
    expect(&e, "maxed", "spec.parallelism", "must be at least 1");
    expect(
        &e,
        "broken-csv",
        "spec.sizes.csv",
        "point 2: sizes and probabilities must not decrease",
    );
    expect(
        &e,
        "off-path",
        "spec.arrivals.poisson.link",
        "link \"a-b\" is not on the flow's path b → c",
    );
    expect(
        &e,
        "no-rate",
        "spec.arrivals.poisson.link",
        "link \"b-c\" has no rate from \"b\" to \"c\"",
    );
    expect(
        &e,
        "no-size",
        "spec.arrivals.poisson",
        "set either load and link, or meanInterval",
    );
    expect(
        &e,
        "no-size",
        "spec.window",
        "must be between 4KiB and 64MiB",
    );
    expect(
        &e,
        "no-size",
        "spec.dscpBySize[0].maxSize",
        "must be in bytes",
    );
    expect(
        &e,
        "no-size",
        "spec.dscpBySize[0].dscp",
        "must be between 0 and 63",
    );
    expect(
        &e,
        "incomplete",
        "spec.sizes.csv",
        "the last probability is 0.5",
    );
    expect(
        &e,
        "incomplete",
        "spec.arrivals.poisson.load",
        "the link needs a load",
    );
}

#[test]
fn csv_sizes_name_the_bad_line() {
    assert_eq!(
        parse_csv("10,0.5\nten,1\n").err().as_deref(),
        Some("line 2: \"ten,1\" is not two numbers")
    );
    assert_eq!(
        parse_csv("10;0.5;3\n").err().as_deref(),
        Some("line 1: expected `bytes,probability`, found \"10;0.5;3\"")
    );
    assert_eq!(parse_csv("# nothing\n").err().as_deref(), Some("no points"));
    assert_eq!(
        parse_csv("10 0.25\n20\t1.0\n"),
        Ok(vec![(10, 0.25), (20, 1.0)]),
        "spaces and tabs separate too"
    );
    let web = parse_csv(WEB_SEARCH_CSV).expect("the shipped file parses");
    assert_eq!(web.first(), Some(&(0, 0.0)));
    assert_eq!(web.last(), Some(&(30_000_000, 1.0)));
}

#[test]
fn the_flows_example_plans() {
    let p = plan(
        "flows.yaml",
        include_str!("../../../manifests/examples/flows.yaml"),
    );
    assert_eq!(p.flows.len(), 3);
    let web = p.flows.iter().find(|f| f.name == "web").expect("web");
    // 30% of 100 Mbit/s over the web-search mean: 2.19 arrivals per second.
    assert_eq!(web.params.mean_interarrival_us, Some(456_333));
}

#[test]
fn the_experiment_seed_reaches_the_plan_and_seeds_flows_without_their_own() {
    let unseeded = plan("workloads.yaml", WORKLOADS);
    assert_eq!(unseeded.seed, None);
    let seeded_text = WORKLOADS.replacen("spec:\n", "spec:\n  seed: 42\n", 1);
    let seeded = plan("workloads.yaml", &seeded_text);
    assert_eq!(seeded.seed, Some(42));
    let other = plan(
        "workloads.yaml",
        &WORKLOADS.replacen("spec:\n", "spec:\n  seed: 43\n", 1),
    );
    let seed_of = |p: &Plan, name: &str| {
        p.flows
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.params.seed)
            .expect("flow")
    };
    // A flow with no seed: 1 without an experiment seed, a stream of it with one.
    let plain = unseeded
        .flows
        .iter()
        .find(|f| f.params.seed == 1)
        .map(|f| f.name.as_str())
        .expect("an unseeded flow in the fixture");
    assert_ne!(seed_of(&seeded, plain), 1);
    assert_ne!(seed_of(&seeded, plain), seed_of(&other, plain));
    let names: Vec<&str> = seeded.flows.iter().map(|f| f.name.as_str()).collect();
    let unseeded_flows: Vec<u64> = names
        .iter()
        .filter(|n| seed_of(&unseeded, n) == 1)
        .map(|n| seed_of(&seeded, n))
        .collect();
    assert!(
        unseeded_flows.len() >= 2
            && unseeded_flows
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len()
                == unseeded_flows.len(),
        "flows of one experiment get streams of their own: {unseeded_flows:?}"
    );
    // A flow's own seed stays its own.
    let own = seeded
        .flows
        .iter()
        .find(|f| seed_of(&unseeded, &f.name) == 7)
        .expect("the fixture's seeded flow");
    assert_eq!(own.params.seed, 7);
}
