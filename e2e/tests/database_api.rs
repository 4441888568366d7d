//! The database as an API (issue 22), on a running topology in local mode:
//! a corpus of bad SQL writes is refused with messages and changes nothing;
//! a valid change still reaches the agents; a bad row written behind the
//! checks keeps its last good state while every other change applies, and
//! shows in `nextmini status`, the metrics and a NOTIFY until it is repaired;
//! random parameter documents are either refused or applied exactly.

#[allow(dead_code)] // this suite watches notifications, not node states
#[path = "support/node_states.rs"]
mod node_states;

use nextmini_e2e::{Env, all_acked, ping_avg_ms};
use node_states::{wait_state, watch_channel};
use std::time::Duration;

const DIAMOND: &str = "\
apiVersion: nextmini.io/v1alpha1
kind: Topology
metadata:
  name: dia
spec:
  telemetry:
    interval: 200ms
  linkDefaults:
    rate: 50Mbit
    delay: 1ms
  nodes: [{name: s}, {name: x}, {name: y}, {name: t}]
  links:
    - {name: s-x, endpoints: [s, x]}
    - {name: s-y, endpoints: [s, y]}
    - {name: x-t, endpoints: [x, t]}
    - {name: y-t, endpoints: [y, t]}
";

fn set_params(link: &str, column: &str, json: &str) -> String {
    format!("UPDATE links SET {column} = {column} || '{json}' WHERE name = '{link}'")
}

/// Bad writes a control script could make, each with what its refusal must say.
fn corpus() -> Vec<(String, &'static str)> {
    let fwd = |json: &str| set_params("s-y", "params_forward", json);
    vec![
        // Types and ranges of each parameter.
        (fwd(r#"{"rate_bps": "abc"}"#), r#"links s-y: params_forward.rate_bps: must be an integer or null, got "abc""#),
        (fwd(r#"{"rate_bps": -5}"#), "params_forward.rate_bps: must be at least 1, got -5"),
        (fwd(r#"{"rate_bps": 0}"#), "params_forward.rate_bps: must be at least 1, got 0"),
        (fwd(r#"{"rate_bps": 10000000000001}"#), "params_forward.rate_bps: must be at most 10000000000000"),
        (fwd(r#"{"rate_bps": 1.5}"#), "params_forward.rate_bps: must be an integer or null, got 1.5"),
        (fwd(r#"{"delay_us": 99999999999}"#), "params_forward.delay_us: must be at most 60000000"),
        (fwd(r#"{"jitter_us": -1}"#), "params_forward.jitter_us: must be at least 0"),
        (fwd(r#"{"loss_ppm": 2000000}"#), "params_forward.loss_ppm: must be at most 1000000, got 2000000"),
        (fwd(r#"{"loss_correlation_ppm": true}"#), "params_forward.loss_correlation_ppm: must be an integer or null, got true"),
        (fwd(r#"{"reorder_ppm": "1%"}"#), "params_forward.reorder_ppm: must be an integer or null"),
        (fwd(r#"{"duplicate_ppm": 1000001}"#), "params_forward.duplicate_ppm: must be at most 1000000"),
        (fwd(r#"{"corrupt_ppm": {}}"#), "params_forward.corrupt_ppm: must be an integer or null, got {}"),
        (fwd(r#"{"burst_bytes": 100}"#), "params_forward.burst_bytes: must be at least the MTU (1400 bytes), got 100"),
        (fwd(r#"{"jitter_distribution": "cauchy"}"#), "params_forward.jitter_distribution: must be one of uniform, normal, pareto"),
        (fwd(r#"{"jitter_distribution": null}"#), "params_forward.jitter_distribution: must be a string, got null"),
        // Unknown keys.
        (fwd(r#"{"rate": "10Mbit"}"#), "params_forward: unknown key rate (known keys: burst_bytes"),
        (fwd(r#"{"delay_ms": 5}"#), "params_forward: unknown key delay_ms"),
        ("UPDATE links SET params_forward = '[]' WHERE name = 's-y'".into(), "params_forward: must be an object, got []"),
        ("UPDATE links SET params_forward = 'null' WHERE name = 's-y'".into(), "params_forward: must be an object, got null"),
        // Queues and their AQM.
        (fwd(r#"{"queue": {"limit_packets": 0}}"#), "params_forward.queue.limit_packets: must be at least 1, got 0"),
        (fwd(r#"{"queue": {"limit_packets": 100, "limit_bytes": 64000}}"#), "params_forward.queue: set at most one of limit_packets, limit_bytes"),
        (fwd(r#"{"queue": {"limit_bytes": 10}}"#), "params_forward.queue.limit_bytes: must be at least the MTU"),
        (fwd(r#"{"queue": {"aqm": "codel"}}"#), r#"params_forward.queue.aqm: must be one of taildrop, red, ecn, scheme, got "codel""#),
        (fwd(r#"{"queue": {"aqm": {"red": {"min_packets": 50, "max_packets": 20, "max_p_ppm": 100000, "weight_ppm": 2000, "ecn": false}}}}"#), "params_forward.queue.aqm.red.min_packets: must be less than red.max_packets (20), got 50"),
        (fwd(r#"{"queue": {"aqm": {"red": {"min_packets": 5, "max_packets": 20, "max_p_ppm": 100000, "ecn": false}}}}"#), "params_forward.queue.aqm.red: missing key weight_ppm"),
        (fwd(r#"{"queue": {"limit_packets": 10, "aqm": {"red": {"min_packets": 5, "max_packets": 20, "max_p_ppm": 100000, "weight_ppm": 2000, "ecn": true}}}}"#), "params_forward.queue.aqm.red.max_packets: must not exceed limit_packets (10), got 20"),
        (fwd(r#"{"queue": {"aqm": {"ecn": {"threshold_packets": 0}}}}"#), "params_forward.queue.aqm.ecn.threshold_packets: must be at least 1, got 0"),
        (fwd(r#"{"queue": {"size": 100}}"#), "params_forward.queue: unknown key size"),
        // Schedulers and classes.
        (fwd(r#"{"scheduler": "nonsense"}"#), r#"params_forward.scheduler: must be one of fcfs, wrr, drr, priority, scheme, got "nonsense""#),
        (fwd(r#"{"scheduler": {"wrr": {"weights": []}}}"#), "params_forward.scheduler.wrr.weights: must list at least 1 item(s), got 0"),
        (fwd(r#"{"scheduler": {"wrr": {"weights": [3, 0]}}}"#), "params_forward.scheduler.wrr.weights[1]: must be at least 1, got 0"),
        (fwd(r#"{"scheduler": {"priority": {"bands": 9}}}"#), "params_forward.scheduler.priority.bands: must be at most 8, got 9"),
        // A registered scheme must exist in the agent's registry.
        (fwd(r#"{"scheduler": {"scheme": {"name": "fifo", "settings": {}}}}"#), r#"params_forward.scheduler.scheme.name: must be one of pfabric, got "fifo""#),
        (fwd(r#"{"queue": {"aqm": {"scheme": {"name": "codel"}}}}"#), r#"params_forward.queue.aqm.scheme.name: must be one of"#),
        (r#"UPDATE links SET params_forward = params_forward || jsonb_build_object('scheduler', jsonb_build_object('drr', jsonb_build_object('quantum_bytes', (SELECT jsonb_agg(1500) FROM generate_series(1, 65))))) WHERE name = 's-y'"#.to_string(), "params_forward.scheduler.drr.quantum_bytes: must list at most 64 item(s), got 65"),
        (fwd(r#"{"scheduler": "fcfs", "classes": [{"queue": 3}]}"#), "params_forward.classes[0].queue: queue 3 does not exist: the scheduler has 1 queue(s)"),
        (fwd(r#"{"classes": [{"queue": 0, "dscp": 64}]}"#), "params_forward.classes[0].dscp: must be at most 63, got 64"),
        (fwd(r#"{"classes": [{"queue": 0, "src_port": 0}]}"#), "params_forward.classes[0].src_port: must be at least 1, got 0"),
        (fwd(r#"{"classes": {"queue": 0}}"#), "params_forward.classes: must be an array"),
        (set_params("x-t", "params_backward", r#"{"loss_ppm": 2000000}"#), "links x-t: params_backward.loss_ppm: must be at most 1000000"),
        // Structure that may not change live.
        ("UPDATE links SET transport = 'carrier-pigeon' WHERE name = 's-y'".into(), "links s-y: column transport must be tcp or quic, got 'carrier-pigeon'"),
        ("UPDATE links SET dialer = 'x' WHERE name = 's-y'".into(), "links s-y: column dialer may not change live"),
        ("UPDATE links SET acceptor = 's' WHERE name = 'x-t'".into(), "links x-t: column acceptor may not change live"),
        ("UPDATE links SET name = 's-y2' WHERE name = 's-y'".into(), "links s-y: column name may not change live"),
        ("INSERT INTO links (topology_id, name, dialer, acceptor, transport, params_forward, params_backward) SELECT id, 's-t', 's', 't', 'tcp', '{}', '{}' FROM topologies WHERE name = 'dia'".into(), "links s-t: a link is added in the topology's YAML, not by INSERT"),
        ("DELETE FROM links WHERE name = 'y-t'".into(), "links y-t: a link is removed in the topology's YAML, not by DELETE"),
        ("UPDATE nodes SET overlay_addr = '10.1.1.1' WHERE name = 'x'".into(), "nodes x: column overlay_addr may not change live"),
        ("UPDATE nodes SET underlay_addr = '10.1.1.1' WHERE name = 'x'".into(), "nodes x: column underlay_addr may not change live"),
        ("UPDATE nodes SET socks = '[{\"listen\": \"0.0.0.0:1080\"}]' WHERE name = 's'".into(), "nodes s: column socks may not change live"),
        ("DELETE FROM nodes WHERE name = 'y'".into(), "nodes y: a node is removed in the topology's YAML, not by DELETE"),
        ("UPDATE topologies SET mtu = 9000 WHERE name = 'dia'".into(), "topologies dia: column mtu may not change live"),
        ("UPDATE topologies SET overlay = '10.99.0.0/16' WHERE name = 'dia'".into(), "topologies dia: column overlay may not change live"),
        ("UPDATE topologies SET processors = 8 WHERE name = 'dia'".into(), "topologies dia: column processors may not change live"),
        ("UPDATE topologies SET generation = 1 WHERE name = 'dia'".into(), "topologies dia: column generation may only grow"),
        ("DELETE FROM topologies WHERE name = 'dia'".into(), "topologies dia: a topology is removed with nextmini down or kubectl delete"),
        ("INSERT INTO flows (topology_id, name, src, dst, count) SELECT id, 'f', 's', 't', 1 FROM topologies WHERE name = 'dia'".into(), "flows f: flows are defined by Flow documents"),
        ("INSERT INTO settings (key, value) VALUES ('metrics_retension', '1 day')".into(), "settings metrics_retension: unknown key (known keys: metrics_retention)"),
        ("UPDATE settings SET value = 'a fortnight' WHERE key = 'metrics_retention'".into(), "settings metrics_retention: column value must be an interval"),
        ("UPDATE topologies SET report_interval_ms = 5 WHERE name = 'dia'".into(), "topologies_report_interval_ms_check"),
        // Routes and rules: dangling references and broken paths.
        ("INSERT INTO routes (topology_id, id, name, path) SELECT id, 9, 'ghost', ARRAY['s','q','t'] FROM topologies WHERE name = 'dia'".into(), "route ghost: path[1] names unknown node q"),
        ("INSERT INTO routes (topology_id, id, name, path) SELECT id, 9, 'jump', ARRAY['s','t'] FROM topologies WHERE name = 'dia'".into(), "route jump: no link between s and t"),
        ("INSERT INTO routes (topology_id, id, name, path) SELECT id, 9, 'loop', ARRAY['s','x','s'] FROM topologies WHERE name = 'dia'".into(), "visits a node twice"),
        ("INSERT INTO route_rules (topology_id, src, dst, route_id) SELECT id, 's', 't', 42 FROM topologies WHERE name = 'dia'".into(), "route_rules_topology_id_route_id_fkey"),
        ("UPDATE route_rules SET dst_port = 70000".into(), "route_rules_dst_port_check"),
        ("UPDATE route_rules SET weight = -1".into(), "route_rules_weight_check"),
        ("INSERT INTO route_rules (topology_id, src, dst, route_id) SELECT id, 't', 's', 1 FROM topologies WHERE name = 'dia'".into(), "route rule t->s: route 1 runs from s to t"),
    ]
}

/// Every row a script could write, as text: what a refused write must leave alone.
const SNAPSHOT: &str = "SELECT md5(string_agg(x, '|' ORDER BY x)) FROM ( \
    SELECT to_jsonb(l)::text AS x FROM links l UNION ALL \
    SELECT (to_jsonb(n) - 'state_changed_at' - 'last_seen' - 'acked_generation' - 'agent_state' - 'pid')::text FROM nodes n UNION ALL \
    SELECT (to_jsonb(t) - 'updated_at')::text FROM topologies t UNION ALL \
    SELECT to_jsonb(f)::text FROM flows f UNION ALL \
    SELECT to_jsonb(s)::text FROM settings s UNION ALL \
    SELECT to_jsonb(r)::text FROM routes r UNION ALL \
    SELECT (to_jsonb(rr) - 'id')::text FROM route_rules rr) q";

fn applied(env: &Env, sql: &str) {
    env.psql(sql);
    env.wait_for(
        "every agent to apply the change",
        Duration::from_secs(10),
        || all_acked(env, "dia"),
    );
}

fn status_json(env: &Env) -> serde_json::Value {
    serde_json::from_str(&env.ok(&["status", "dia", "-o", "json"])).expect("status json")
}

fn problems(env: &Env) -> Vec<serde_json::Value> {
    status_json(env)["topologies"][0]["problems"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn hub_metric(env: &Env, name: &str) -> Option<f64> {
    let doc = status_json(env);
    let url = doc["hub"]["metrics"].as_str()?.to_string();
    let out = std::process::Command::new("curl")
        .args(["-sf", "--max-time", "5", &url])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn the_database_refuses_bad_writes_and_a_bad_row_never_freezes_a_topology() {
    let env = Env::new("dbapi");
    let manifest = env.state_dir.join("dia.yaml");
    std::fs::write(&manifest, DIAMOND).expect("manifest");
    env.ok(&["up", "-f", manifest.to_str().expect("path")]);
    applied(
        &env,
        "WITH t AS (SELECT id FROM topologies WHERE name = 'dia') \
         INSERT INTO routes (topology_id, id, name, path) SELECT id, 1, 'via-x', ARRAY['s','x','t'] FROM t",
    );
    applied(
        &env,
        "INSERT INTO route_rules (topology_id, src, dst, route_id) SELECT id, 's', 't', 1 FROM topologies WHERE name = 'dia'",
    );

    // (1) The corpus: each write refused with its message; nothing changes.
    let before = env.psql(SNAPSHOT);
    let corpus = corpus();
    assert!(corpus.len() >= 40, "{} bad writes", corpus.len());
    for (sql, says) in &corpus {
        match env.try_psql(sql) {
            Ok(out) => panic!("accepted: {sql}\n{out}"),
            Err(e) => assert!(e.contains(says), "{sql}\nrefused with {e:?}, not {says:?}"),
        }
        assert_eq!(
            env.psql(SNAPSHOT),
            before,
            "refused, yet changed something: {sql}"
        );
    }
    println!("{} bad writes refused, each with its message", corpus.len());
    assert!(problems(&env).is_empty(), "{:?}", problems(&env));

    // A valid change still goes through, and the agents run it.
    applied(
        &env,
        &set_params("s-y", "params_forward", r#"{"delay_us": 20000}"#),
    );
    applied(
        &env,
        &set_params("s-y", "params_backward", r#"{"delay_us": 20000}"#),
    );
    let rtt = ping_avg_ms(&env, "s", "y", 5);
    assert!(
        rtt > 38.0,
        "s-y runs 20 ms each way, yet the RTT is {rtt:.1} ms"
    );

    // (2) Rows written behind the checks (triggers off, as a restore or an
    // older schema would): s-y's forward parameters and the route's path.
    let events = watch_channel(env.database_url(), "nextmini_topology");
    env.psql(
        "SET session_replication_role = replica; \
         UPDATE links SET params_forward = params_forward || '{\"rate_bps\": \"abc\", \"delay_us\": 1000}' WHERE name = 's-y'; \
         UPDATE routes SET path = ARRAY['s','t'] WHERE name = 'via-x'",
    );
    // Another link's valid change: the hub must apply it despite the bad rows.
    applied(
        &env,
        &set_params("x-t", "params_forward", r#"{"delay_us": 15000}"#),
    );
    wait_state(&events, "dia problems=2", Duration::from_secs(10));
    let found = problems(&env);
    let subjects: Vec<&str> = found.iter().filter_map(|p| p["subject"].as_str()).collect();
    assert_eq!(
        subjects,
        ["links s-y params_forward", "routes via-x path"],
        "{found:?}"
    );
    assert!(
        found[0]["problem"]
            .as_str()
            .is_some_and(|p| p.contains("params_forward.rate_bps: must be an integer or null")),
        "{found:?}"
    );
    assert_eq!(found[0]["consequence"], "runs its last good parameters");
    assert_eq!(found[1]["consequence"], "runs its last good path s-x-t");
    let table = env.ok(&["status", "dia"]);
    assert!(
        table.contains("cannot run as written") && table.contains("links s-y params_forward"),
        "{table}"
    );
    assert_eq!(
        hub_metric(&env, "nextmini_hub_topology_problems{topology=\"dia\"}"),
        Some(2.0)
    );
    let s_y = ping_avg_ms(&env, "s", "y", 5);
    assert!(
        s_y > 38.0,
        "s-y must keep its last good 20 ms, yet the RTT is {s_y:.1} ms"
    );
    let x_t = ping_avg_ms(&env, "x", "t", 5);
    assert!(
        x_t > 15.0,
        "x-t's valid change must apply beside the bad rows: RTT {x_t:.1} ms"
    );

    // Repaired by SQL, the problems go.
    applied(
        &env,
        "UPDATE links SET params_forward = params_forward || '{\"rate_bps\": 50000000, \"delay_us\": 5000}' WHERE name = 's-y'",
    );
    applied(
        &env,
        "UPDATE routes SET path = ARRAY['s','x','t'] WHERE name = 'via-x'",
    );
    wait_state(&events, "dia problems=0", Duration::from_secs(10));
    assert!(problems(&env).is_empty());
    assert_eq!(
        hub_metric(&env, "nextmini_hub_topology_problems{topology=\"dia\"}"),
        Some(0.0)
    );
    let repaired = ping_avg_ms(&env, "s", "y", 5);
    assert!(
        (22.0..35.0).contains(&repaired),
        "s-y now runs 5 ms forward and 20 ms back: RTT {repaired:.1} ms"
    );

    // (4) Random parameter documents: each refused, or applied exactly (the
    // hub serves it with no problem), and the hub and status stay up.
    let hub = env.hub_pid().expect("hub pid");
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    const VALUES: [&str; 10] = [
        "0", "1", "-3", "1400", "1000000", "1000001", "60000001", "\"x\"", "null", "2.5",
    ];
    const KEYS: [&str; 8] = [
        "rate_bps",
        "delay_us",
        "jitter_us",
        "loss_ppm",
        "burst_bytes",
        "reorder_ppm",
        "corrupt_ppm",
        "bandwidth",
    ];
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..40 {
        let doc: Vec<String> = (0..1 + next(3))
            .map(|_| {
                let key = KEYS[next(KEYS.len() as u64) as usize];
                let value = VALUES[next(VALUES.len() as u64) as usize];
                format!("\"{key}\": {value}")
            })
            .collect();
        let doc = format!("{{{}}}", doc.join(", "));
        let read = || env.psql("SELECT params_backward::text FROM links WHERE name = 'y-t'");
        let was = read();
        match env.try_psql(&format!(
            "UPDATE links SET params_backward = '{doc}' WHERE name = 'y-t'"
        )) {
            Ok(_) => {
                accepted += 1;
                let stored = read();
                assert_eq!(
                    env.psql(&format!("SELECT '{stored}'::jsonb = '{doc}'::jsonb")),
                    "t",
                    "{doc} stored as {stored}"
                );
                env.wait_for("the agents to apply it", Duration::from_secs(10), || {
                    all_acked(&env, "dia")
                });
                assert!(
                    problems(&env).is_empty(),
                    "{doc} accepted, yet the hub cannot run it"
                );
            }
            Err(e) => {
                refused += 1;
                assert!(e.contains("links y-t: params_backward"), "{doc}: {e}");
                assert_eq!(read(), was, "{doc} refused, yet the row changed");
            }
        }
    }
    println!("random documents: {accepted} applied, {refused} refused");
    assert!(
        accepted > 0 && refused > 0,
        "{accepted} applied, {refused} refused"
    );
    assert_eq!(env.hub_pid(), Some(hub), "the hub restarted");
    assert!(nextmini_e2e::is_running(hub), "the hub died");
    env.ok(&["status", "dia"]);
}
