//! The rule documents, generated from the plan's types.

use crate::plan::LinkParams;
use serde_json::Value;

/// Name of the link parameters' document in `nextmini_schemas`.
pub const LINK_PARAMS: &str = "link_params";

/// The JSON Schema of one direction's link parameters (`links.params_forward`,
/// `links.params_backward`).
pub fn link_params() -> Value {
    schemars::schema_for!(LinkParams).to_value()
}

/// Every document the database checks writes against, by name.
pub fn documents() -> Vec<(&'static str, &'static Value)> {
    vec![(LINK_PARAMS, super::link_params_cached())]
}

#[cfg(test)]
mod tests {
    use super::link_params;
    use crate::plan::{LinkParams, Plan, parse_manifest, plan_manifest};
    use crate::store::rules::{Context, problem};
    use serde_json::{Value, json};

    fn plans(name: &str, text: &str) -> Vec<Plan> {
        let manifest = parse_manifest(name, text).expect("parses");
        plan_manifest(&manifest).expect("plans")
    }

    fn check(v: &Value) -> Option<String> {
        problem(&link_params(), v, "p", Context { mtu: Some(1400) })
    }

    /// Whatever the YAML accepts, the stored rules accept: the operator writes
    /// planned rows without the database's checks, so this is what keeps them true.
    #[test]
    fn every_planned_link_obeys_the_stored_rules() {
        let sources = [
            (
                "line3",
                include_str!("../../../../manifests/examples/line3.yaml"),
            ),
            (
                "shaped",
                include_str!("../../../../manifests/examples/shaped.yaml"),
            ),
            (
                "flows",
                include_str!("../../../../manifests/examples/flows.yaml"),
            ),
            (
                "merge",
                include_str!("../../../tests/fixtures/params-merge.yaml"),
            ),
            (
                "fattree",
                include_str!("../../../tests/fixtures/fattree-k4.yaml"),
            ),
            ("limits", LIMITS),
        ];
        let mut checked = 0;
        for (name, text) in sources {
            for plan in plans(name, text) {
                let ctx = Context {
                    mtu: Some(u64::from(plan.dataplane.mtu)),
                };
                for link in &plan.links {
                    for (dir, p) in [("forward", &link.forward), ("backward", &link.backward)] {
                        let v = serde_json::to_value(p).expect("serializes");
                        assert_eq!(
                            problem(&link_params(), &v, dir, ctx),
                            None,
                            "{name}: link {} {dir}: {v}",
                            link.name
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 40, "{checked}");
    }

    /// Every parameter at the YAML's limit, so every stored key is set.
    const LIMITS: &str = r#"
apiVersion: nextmini.io/v1alpha1
kind: Topology
metadata: {name: limits}
spec:
  dataplane: {mtu: 1400}
  nodes: [{name: a}, {name: b}, {name: c}]
  links:
    - name: top
      endpoints: [a, b]
      rate: 10Tbit
      burst: 1400B
      delay: 60s
      jitter: 60s
      jitterDistribution: pareto
      loss: 100%
      lossCorrelation: 100%
      reorder: 100%
      duplicate: 100%
      corrupt: 100%
      queue: {limit: 4294967295pkt, aqm: {red: {min: 4294967294, max: 4294967295, maxP: 100%, weight: 1}}}
      scheduler: {priority: {bands: 8}}
      classes: [{queue: 7, dscp: 63, srcPort: 65535, dstPort: 1, protocol: 255, maxPacketSize: 4294967295}]
      backward: {trace: {inline: "0\n4294967295\n"}}
    - name: bytes
      endpoints: [b, c]
      queue: {limit: 1400B, aqm: {ecn: {threshold: 1}}}
      scheduler: {wrr: {weights: [1, 4294967295]}}
"#;

    /// A key the stored rules know and the YAML cannot set (or the reverse) is a
    /// drift: the YAML at its limits must set every stored key to a non-default,
    /// in one direction or the other (a trace and a rate exclude each other).
    #[test]
    fn the_yaml_reaches_every_stored_key() {
        let plan = plans("limits", LIMITS).remove(0);
        let top = plan.link("top").expect("top");
        let backward = serde_json::to_value(&top.backward).expect("json");
        let mut top = serde_json::to_value(&top.forward).expect("json");
        top["trace_ms"] = backward["trace_ms"].clone();
        let schema = link_params();
        let keys: Vec<&String> = schema["properties"]
            .as_object()
            .expect("properties")
            .keys()
            .collect();
        let defaults = serde_json::to_value(LinkParams::default()).expect("json");
        for key in &keys {
            assert_ne!(
                top[key.as_str()],
                defaults[key.as_str()],
                "the YAML at its limits leaves {key} at its default"
            );
        }
        assert_eq!(
            top.as_object().expect("object").len(),
            keys.len(),
            "stored keys and rule keys differ: {top}"
        );
    }

    #[test]
    fn one_past_each_limit_is_refused_with_the_key() {
        let plan = plans("limits", LIMITS).remove(0);
        let top = serde_json::to_value(&plan.link("top").expect("top").forward).expect("json");
        let with = |pointer: &str, v: Value| {
            let mut doc = top.clone();
            let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
            match doc.pointer_mut(parent).expect(pointer) {
                Value::Object(o) => {
                    o.insert(key.to_owned(), v);
                }
                Value::Array(a) => a[key.parse::<usize>().expect("index")] = v,
                other => panic!("{pointer}: {other}"),
            }
            check(&doc)
        };
        for (pointer, bad, says) in [
            (
                "/rate_bps",
                json!(10_000_000_000_001u64),
                "p.rate_bps: must be at most 10000000000000",
            ),
            ("/rate_bps", json!(0), "p.rate_bps: must be at least 1"),
            (
                "/rate_bps",
                json!("abc"),
                "p.rate_bps: must be an integer or null, got \"abc\"",
            ),
            (
                "/burst_bytes",
                json!(1399),
                "p.burst_bytes: must be at least the MTU (1400 bytes)",
            ),
            (
                "/delay_us",
                json!(60_000_001),
                "p.delay_us: must be at most 60000000",
            ),
            ("/jitter_us", json!(-1), "p.jitter_us: must be at least 0"),
            (
                "/loss_ppm",
                json!(1_000_001),
                "p.loss_ppm: must be at most 1000000",
            ),
            (
                "/loss_ppm",
                json!(0.5),
                "p.loss_ppm: must be an integer or null, got 0.5",
            ),
            (
                "/jitter_distribution",
                json!("cauchy"),
                "p.jitter_distribution: must be one of uniform, normal, pareto",
            ),
            (
                "/queue/limit_packets",
                json!(0),
                "p.queue.limit_packets: must be at least 1",
            ),
            (
                "/queue/limit_bytes",
                json!(1500),
                "p.queue: set at most one of limit_packets, limit_bytes",
            ),
            (
                "/queue/aqm/red/min_packets",
                json!(4_294_967_295u64),
                "p.queue.aqm.red.min_packets: must be less than red.max_packets",
            ),
            (
                "/queue/aqm/red/max_p_ppm",
                json!(0),
                "p.queue.aqm.red.max_p_ppm: must be at least 1",
            ),
            (
                "/queue/aqm/red/ecn",
                json!("yes"),
                "p.queue.aqm.red.ecn: must be true or false",
            ),
            (
                "/queue/aqm",
                json!("codel"),
                "p.queue.aqm: must be one of taildrop, red, ecn, scheme, got \"codel\"",
            ),
            (
                "/scheduler/priority/bands",
                json!(9),
                "p.scheduler.priority.bands: must be at most 8",
            ),
            (
                "/scheduler",
                json!("nonsense"),
                "p.scheduler: must be one of fcfs, wrr, drr, priority, scheme",
            ),
            (
                "/scheduler",
                json!({"scheme": {"name": "fifo", "settings": {}}}),
                "p.scheduler.scheme.name: must be one of pfabric",
            ),
            (
                "/scheduler",
                json!("fcfs"),
                "p.classes[0].queue: queue 7 does not exist: the scheduler has 1 queue(s)",
            ),
            (
                "/classes/0/dscp",
                json!(64),
                "p.classes[0].dscp: must be at most 63",
            ),
            (
                "/classes/0/src_port",
                json!(65_536),
                "p.classes[0].src_port: must be at most 65535",
            ),
            (
                "/classes/0/colour",
                json!(1),
                "p.classes[0]: unknown key colour (known keys: dscp, dst_port",
            ),
            (
                "/colour",
                json!(1),
                "p: unknown key colour (known keys: burst_bytes, classes",
            ),
        ] {
            let got = with(pointer, bad.clone());
            assert!(
                got.as_deref().is_some_and(|g| g.starts_with(says)),
                "{pointer} = {bad}: expected {says:?}, got {got:?}"
            );
        }
        let mut limited = top.clone();
        limited["queue"]["limit_packets"] = json!(100);
        assert!(
            check(&limited).is_some_and(|p| p
                .starts_with("p.queue.aqm.red.max_packets: must not exceed limit_packets (100)")),
            "{:?}",
            check(&limited)
        );
        assert_eq!(check(&top), None);
        assert_eq!(check(&json!({})), None, "every key may be left out");
        assert!(check(&json!([])).is_some_and(|p| p.starts_with("p: must be an object")));
    }
}
