//! The database as an API (issue 22) against a real PostgreSQL: the rules the
//! database applies to a control script's writes are the ones the hub applies
//! to rows it loads, they refuse what the YAML refuses, and a refused write
//! changes nothing.
//!
//! "As a user" below means a connection without the operator's
//! `nextmini.writer` mark, as psql or the Python package opens it.

#[path = "support/private_db.rs"]
mod private_db;

use nextmini_operator::plan::{LinkParams, Plan};
use nextmini_operator::store::Store;
use nextmini_operator::store::rules::{self, Context};
use private_db::{Db, hashes, planned, start_db};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection, Row};
use std::collections::BTreeMap;

fn diamond() -> Plan {
    let text = r#"
apiVersion: nextmini.io/v1alpha1
kind: Topology
metadata: {name: dia}
spec:
  linkDefaults: {rate: 20Mbit, delay: 1ms}
  nodes: [{name: s}, {name: x}, {name: y}, {name: t}]
  links:
    - {name: s-x, endpoints: [s, x]}
    - {name: s-y, endpoints: [s, y]}
    - {name: x-t, endpoints: [x, t]}
    - {name: y-t, endpoints: [y, t]}
"#;
    planned("dia.yaml", text)
}

/// A database holding the diamond, the operator's store on it, and a
/// connection as a user.
async fn stored(name: &str) -> (Db, Store, PgConnection) {
    let db = start_db(name, 57300);
    let store = Store::connect(&db.pg.url()).await.expect("connect");
    let plan = diamond();
    store
        .apply_plan(&plan, "netns", "source", &hashes(&plan))
        .await
        .expect("apply");
    let user = PgConnection::connect(&db.pg.url()).await.expect("user");
    (db, store, user)
}

/// The database's verdict on `params` and the value as it stored it.
async fn database_verdict(user: &mut PgConnection, params: &Value) -> (Option<String>, Value) {
    let row = sqlx::query(
        "SELECT nextmini_link_params_problem(t.id, $1::jsonb, 'p') AS problem, $1::jsonb::text AS stored \
         FROM topologies t WHERE t.name = 'dia'",
    )
    .bind(params.to_string())
    .fetch_one(&mut *user)
    .await
    .expect("check");
    let stored: String = row.get("stored");
    (
        row.get("problem"),
        serde_json::from_str(&stored).expect("jsonb text is JSON"),
    )
}

/// Every key of `sent` is in `got` with the same value (numbers by value):
/// what an agent is given is what was written.
fn contained(sent: &Value, got: &Value) -> bool {
    match (sent, got) {
        (Value::Object(s), Value::Object(g)) => s
            .iter()
            .all(|(k, v)| g.get(k).is_some_and(|gv| contained(v, gv))),
        (Value::Array(s), Value::Array(g)) => {
            s.len() == g.len() && s.iter().zip(g).all(|(a, b)| contained(a, b))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        _ => sent == got,
    }
}

/// Random parameter documents that stay close to the rules: mostly the
/// known keys, values around each limit, now and then a wrong type or key.
struct Documents {
    rng: StdRng,
}

impl Documents {
    fn number(&mut self) -> Value {
        const AROUND: [&str; 22] = [
            "0",
            "1",
            "-1",
            "7",
            "63",
            "64",
            "1399",
            "1400",
            "65535",
            "65536",
            "999999",
            "1000000",
            "1000001",
            "60000000",
            "60000001",
            "4294967295",
            "4294967296",
            "10000000000000",
            "10000000000001",
            "18446744073709551615",
            "1e20",
            "0.5",
        ];
        let text = AROUND[self.rng.random_range(0..AROUND.len())];
        serde_json::from_str(text).expect("a JSON number")
    }

    fn value(&mut self) -> Value {
        const TYPICAL: [u64; 6] = [1, 2, 20, 1500, 64_000, 1_000_000];
        match self.rng.random_range(0..17) {
            0..=7 => json!(TYPICAL[self.rng.random_range(0..TYPICAL.len())]),
            8..=12 => self.number(),
            13 => Value::Null,
            14 => json!("abc"),
            15 => json!(true),
            _ => json!({}),
        }
    }

    fn maybe(&mut self, o: &mut serde_json::Map<String, Value>, key: &str, v: Value) {
        if self.rng.random_bool(0.3) {
            o.insert(key.into(), v);
        }
    }

    fn aqm(&mut self) -> Value {
        match self.rng.random_range(0..6) {
            0 => json!("taildrop"),
            1 | 2 => {
                let mut red = serde_json::Map::new();
                for key in ["min_packets", "max_packets", "max_p_ppm", "weight_ppm"] {
                    if self.rng.random_bool(0.95) {
                        let v = self.value();
                        red.insert(key.into(), v);
                    }
                }
                red.insert("ecn".into(), json!(self.rng.random_bool(0.5)));
                json!({ "red": red })
            }
            3 => json!({ "ecn": { "threshold_packets": self.number() } }),
            4 => json!("codel"),
            _ => json!({ "red": {}, "ecn": {} }),
        }
    }

    fn scheduler(&mut self) -> Value {
        let list = |d: &mut Documents| {
            let n = d.rng.random_range(0..4);
            Value::Array((0..n).map(|_| d.number()).collect())
        };
        match self.rng.random_range(0..6) {
            0 => json!("fcfs"),
            1 => json!({ "wrr": { "weights": list(self) } }),
            2 => json!({ "drr": { "quantum_bytes": list(self) } }),
            3 => json!({ "priority": { "bands": self.number() } }),
            4 => json!("nonsense"),
            _ => json!({ "wrr": { "weights": [1] }, "bands": 2 }),
        }
    }

    fn class(&mut self) -> Value {
        let mut c = serde_json::Map::new();
        for key in [
            "queue",
            "dscp",
            "src_port",
            "dst_port",
            "protocol",
            "max_packet_bytes",
        ] {
            let v = self.value();
            self.maybe(&mut c, key, v);
        }
        if self.rng.random_bool(0.05) {
            c.insert("colour".into(), json!(1));
        }
        Value::Object(c)
    }

    fn document(&mut self) -> Value {
        let mut o = serde_json::Map::new();
        for key in [
            "rate_bps",
            "burst_bytes",
            "delay_us",
            "jitter_us",
            "loss_ppm",
            "loss_correlation_ppm",
            "reorder_ppm",
            "duplicate_ppm",
            "corrupt_ppm",
        ] {
            let v = self.value();
            self.maybe(&mut o, key, v);
        }
        let distribution = ["uniform", "normal", "pareto", "cauchy"][self.rng.random_range(0..4)];
        self.maybe(&mut o, "jitter_distribution", json!(distribution));
        let mut queue = serde_json::Map::new();
        for key in ["limit_packets", "limit_bytes"] {
            let v = self.value();
            self.maybe(&mut queue, key, v);
        }
        let aqm = self.aqm();
        self.maybe(&mut queue, "aqm", aqm);
        self.maybe(&mut o, "queue", Value::Object(queue));
        let scheduler = self.scheduler();
        self.maybe(&mut o, "scheduler", scheduler);
        let n = self.rng.random_range(0..3);
        let classes = Value::Array((0..n).map(|_| self.class()).collect());
        self.maybe(&mut o, "classes", classes);
        if self.rng.random_bool(0.05) {
            o.insert("rate".into(), json!("10Mbit"));
        }
        Value::Object(o)
    }
}

/// Whether the problem names the same place in both walks (the text up to the
/// first ": "); the wording of the reason may differ.
fn place(problem: &str) -> &str {
    problem.split(": ").next().unwrap_or(problem)
}

/// Random documents through the database's rules, the hub's rules and serde:
/// the two rule walks agree on every one, and a document both accept is one the
/// hub deserializes to exactly what was written. Every tenth also goes through
/// the links trigger, which must refuse exactly what the rules refuse.
#[tokio::test]
async fn the_database_and_the_hub_apply_the_same_rules_to_random_documents() {
    let (_db, store, mut user) = stored("random").await;
    let seed: u64 = std::env::var("NEXTMINI_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(22);
    let mut docs = Documents {
        rng: StdRng::seed_from_u64(seed),
    };
    let schema = rules::link_params();
    let (mut accepted, mut refused, mut through_trigger) = (0, 0, 0);
    for case in 0..1500 {
        let doc = docs.document();
        let (db_verdict, stored) = database_verdict(&mut user, &doc).await;
        let hub_verdict = rules::problem(&schema, &stored, "p", Context { mtu: Some(1400) });
        match (&db_verdict, &hub_verdict) {
            (None, None) => {
                accepted += 1;
                let parsed: LinkParams =
                    serde_json::from_value(stored.clone()).unwrap_or_else(|e| {
                        panic!(
                            "seed {seed} case {case}: {stored} passed both walks but not serde: {e}"
                        )
                    });
                let applied = serde_json::to_value(&parsed).expect("serializes");
                assert!(
                    contained(&stored, &applied),
                    "seed {seed} case {case}: wrote {stored}, the hub would apply {applied}"
                );
            }
            (Some(d), Some(h)) => {
                refused += 1;
                assert_eq!(
                    place(d),
                    place(h),
                    "seed {seed} case {case}: {stored}: the database says {d:?}, the hub {h:?}"
                );
            }
            _ => panic!(
                "seed {seed} case {case}: {stored}: the database says {db_verdict:?}, the hub {hub_verdict:?}"
            ),
        }
        if case % 10 == 0 {
            through_trigger += 1;
            let before: String = sqlx::query_scalar(
                "SELECT params_forward::text FROM links l JOIN topologies t ON t.id = l.topology_id \
                 WHERE t.name = 'dia' AND l.name = 's-y'",
            )
            .fetch_one(store.pool())
            .await
            .expect("read");
            let done = sqlx::query(
                "UPDATE links SET params_forward = $1::jsonb FROM topologies t \
                 WHERE t.id = links.topology_id AND t.name = 'dia' AND links.name = 's-y'",
            )
            .bind(doc.to_string())
            .execute(&mut user)
            .await;
            let after: String = sqlx::query_scalar(
                "SELECT params_forward::text FROM links l JOIN topologies t ON t.id = l.topology_id \
                 WHERE t.name = 'dia' AND l.name = 's-y'",
            )
            .fetch_one(store.pool())
            .await
            .expect("read");
            match (&db_verdict, done) {
                (None, Ok(_)) => {
                    assert_eq!(serde_json::from_str::<Value>(&after).expect("json"), stored)
                }
                (Some(p), Err(e)) => {
                    let message = e.to_string();
                    assert!(
                        message.contains(&format!(
                            "links s-y: params_forward{}",
                            p.trim_start_matches('p')
                        )),
                        "seed {seed} case {case}: {message} does not carry {p}"
                    );
                    assert_eq!(before, after, "a refused write changed the row");
                }
                (v, done) => panic!("seed {seed} case {case}: rules {v:?}, trigger {done:?}"),
            }
        }
    }
    println!(
        "seed {seed}: {accepted} accepted, {refused} refused, {through_trigger} through the trigger"
    );
    assert!(
        accepted >= 50 && refused >= 500,
        "the documents test too little: {accepted} accepted, {refused} refused"
    );
}

/// The database knows every parameter the hub knows: each key of the rules,
/// set wrong by a user, is refused naming that key; set right, it is stored.
#[tokio::test]
async fn every_parameter_is_checked_by_the_database() {
    let (_db, _store, mut user) = stored("keys").await;
    let schema = rules::link_params();
    let good: BTreeMap<&str, Value> = [
        ("rate_bps", json!(5_000_000)),
        ("burst_bytes", json!(3000)),
        ("delay_us", json!(2000)),
        ("jitter_us", json!(100)),
        ("jitter_distribution", json!("normal")),
        ("loss_ppm", json!(10_000)),
        ("loss_correlation_ppm", json!(250_000)),
        ("reorder_ppm", json!(1000)),
        ("duplicate_ppm", json!(1000)),
        ("corrupt_ppm", json!(10)),
        (
            "queue",
            json!({"limit_packets": 100, "aqm": {"ecn": {"threshold_packets": 20}}}),
        ),
        ("scheduler", json!({"wrr": {"weights": [1, 3]}})),
        ("classes", json!([{"queue": 1, "dscp": 46}])),
        ("trace_ms", json!([1, 1, 2])),
    ]
    .into_iter()
    .collect();
    let keys: Vec<String> = schema["properties"]
        .as_object()
        .expect("properties")
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        keys.iter().map(String::as_str).collect::<Vec<_>>(),
        good.keys().copied().collect::<Vec<_>>(),
        "a parameter was added or removed: give it a good value here"
    );
    for key in &keys {
        // The classes' queue 1 needs the two-queue scheduler beside them.
        let write = |v: &Value| {
            let mut doc = json!({ "scheduler": good["scheduler"] });
            doc[key.as_str()] = v.clone();
            doc.to_string()
        };
        let update = "UPDATE links SET params_backward = $1::jsonb FROM topologies t \
                      WHERE t.id = links.topology_id AND t.name = 'dia' AND links.name = 's-x'";
        sqlx::query(update)
            .bind(write(&good[key.as_str()]))
            .execute(&mut user)
            .await
            .unwrap_or_else(|e| panic!("{key} = {}: {e}", good[key.as_str()]));
        let bad = json!("abc");
        let err = sqlx::query(update)
            .bind(write(&bad))
            .execute(&mut user)
            .await
            .expect_err(key);
        assert!(
            err.to_string()
                .contains(&format!("links s-x: params_backward.{key}: must be")),
            "{key}: {err}"
        );
    }
}

async fn refused(user: &mut PgConnection, sql: &'static str, says: &str) {
    let err = sqlx::query(sql).execute(&mut *user).await.expect_err(sql);
    let db = err.as_database_error().expect("a database error");
    assert_eq!(db.code().as_deref(), Some("23514"), "{sql}: {err}");
    assert!(err.to_string().contains(says), "{sql}: {err}");
}

/// What may not change live is refused by the database for users, and stays
/// the operator's to change by re-applying the YAML.
#[tokio::test]
async fn structure_is_refused_live_and_stays_the_operators() {
    let (_db, store, mut user) = stored("structure").await;
    let snapshot = |store: Store| async move {
        sqlx::query_scalar::<_, String>(
            "SELECT string_agg(t::text, '|' ORDER BY t::text) FROM ( \
               SELECT to_jsonb(l) - 'topology_id' AS t FROM links l UNION ALL \
               SELECT to_jsonb(n) - 'topology_id' - 'state_changed_at' - 'last_seen' FROM nodes n UNION ALL \
               SELECT to_jsonb(tp) - 'updated_at' - 'generation' FROM topologies tp UNION ALL \
               SELECT to_jsonb(f) - 'topology_id' FROM flows f UNION ALL \
               SELECT to_jsonb(s) FROM settings s) x",
        )
        .fetch_one(store.pool())
        .await
        .expect("snapshot")
    };
    let before = snapshot(store.clone()).await;
    for (sql, says) in [
        (
            "UPDATE links SET dialer = 't' WHERE name = 's-y'",
            "links s-y: column dialer may not change live",
        ),
        (
            "UPDATE links SET acceptor = 's' WHERE name = 'x-t'",
            "links x-t: column acceptor may not change live",
        ),
        (
            "UPDATE links SET name = 'renamed' WHERE name = 's-y'",
            "links s-y: column name may not change live",
        ),
        (
            "UPDATE links SET transport = 'carrier-pigeon' WHERE name = 's-y'",
            "links s-y: column transport must be tcp or quic, got 'carrier-pigeon'",
        ),
        (
            "INSERT INTO links (topology_id, name, dialer, acceptor, transport, params_forward, params_backward) \
             SELECT id, 's-t', 's', 't', 'tcp', '{}', '{}' FROM topologies",
            "links s-t: a link is added in the topology's YAML",
        ),
        (
            "DELETE FROM links WHERE name = 's-y'",
            "links s-y: a link is removed in the topology's YAML",
        ),
        (
            "UPDATE nodes SET overlay_addr = '10.0.0.1' WHERE name = 'x'",
            "nodes x: column overlay_addr may not change live",
        ),
        (
            "UPDATE nodes SET cpu_millis = 100 WHERE name = 'x'",
            "nodes x: column cpu_millis may not change live",
        ),
        (
            "DELETE FROM nodes WHERE name = 'x'",
            "nodes x: a node is removed",
        ),
        (
            "UPDATE nodes SET endpoint = '203.0.113.9:7100' WHERE name = 'x'",
            "nodes x: column endpoint is where the operator found the node's pod",
        ),
        (
            "UPDATE topologies SET mtu = 9000",
            "topologies dia: column mtu may not change live",
        ),
        (
            "UPDATE topologies SET overlay = '10.9.0.0/16'",
            "topologies dia: column overlay may not change live",
        ),
        (
            "UPDATE topologies SET generation = 0",
            "topologies dia: column generation may only grow",
        ),
        (
            "DELETE FROM topologies",
            "topologies dia: a topology is removed with nextmini down",
        ),
        (
            "INSERT INTO flows (topology_id, name, src, dst, count) SELECT id, 'f', 's', 't', 1 FROM topologies",
            "flows f: flows are defined by Flow documents",
        ),
        (
            "INSERT INTO settings (key, value) VALUES ('retention', '1 hour')",
            "settings retention: unknown key",
        ),
        (
            "UPDATE settings SET value = 'forever' WHERE key = 'metrics_retention'",
            "settings metrics_retention: column value must be an interval",
        ),
        (
            "UPDATE settings SET value = '1 second' WHERE key = 'metrics_retention'",
            "must be between 1 minute and 10 years",
        ),
    ] {
        refused(&mut user, sql, says).await;
    }
    assert_eq!(
        snapshot(store.clone()).await,
        before,
        "a refused write changed something"
    );

    // What a script may do still works.
    sqlx::query("UPDATE topologies SET report_interval_ms = 500")
        .execute(&mut user)
        .await
        .expect("report interval");
    sqlx::query("UPDATE settings SET value = '2 hours' WHERE key = 'metrics_retention'")
        .execute(&mut user)
        .await
        .expect("retention");
    sqlx::query("UPDATE links SET transport = 'quic' WHERE name = 's-y'")
        .execute(&mut user)
        .await
        .expect("transport");
    // And the operator re-applies a changed structure.
    let mut changed = diamond();
    changed.dataplane.mtu = 1300;
    changed.links.retain(|l| l.name != "y-t");
    store
        .apply_plan(&changed, "netns", "source", &hashes(&changed))
        .await
        .expect("the operator changes the structure");
    let (plan, _) = store.load_plan("dia").await.expect("load").expect("exists");
    assert_eq!(plan.dataplane.mtu, 1300);
    assert_eq!(plan.links.len(), 3);
}

/// Timed scenarios (migration 0015): the planned events read back as they
/// were planned, column by column; the run's start is chosen once; agents'
/// reports make the timeline; and a script writes none of it.
#[tokio::test]
async fn the_scenario_round_trips_and_is_written_by_nextmini_alone() {
    let (_db, store, mut user) = stored("scenario").await;
    let text = r#"
apiVersion: nextmini.io/v1alpha1
kind: Topology
metadata: {name: dia}
spec:
  linkDefaults: {rate: 20Mbit, delay: 1ms}
  nodes: [{name: s}, {name: x}, {name: y}, {name: t}]
  links:
    - {name: s-x, endpoints: [s, x], backward: {loss: 1%}}
    - {name: s-y, endpoints: [s, y]}
    - {name: x-t, endpoints: [x, t]}
    - {name: y-t, endpoints: [y, t]}
  scenario:
    events:
      - {at: 1500ms, link: s-x, set: {rate: 5Mbit, delay: 3ms}}
      - {at: 2s, link: s-x, state: down}
      - {at: 2s, link: y-t, state: up}
"#;
    let plan = planned("dia.yaml", text);
    assert_eq!(plan.scenario.len(), 3);
    store
        .apply_plan(&plan, "netns", "source", &hashes(&plan))
        .await
        .expect("apply");
    let (loaded, _) = store.load_plan("dia").await.expect("load").expect("exists");
    // Offset, link, kind and both directions' parameters, all read back.
    assert_eq!(loaded.scenario, plan.scenario);

    let id: i64 = sqlx::query_scalar("SELECT id FROM topologies WHERE name = 'dia'")
        .fetch_one(store.pool())
        .await
        .expect("id");
    assert_eq!(store.scenario_started(id).await.expect("read"), None);
    let start = store
        .start_scenario(id, std::time::Duration::from_secs(1))
        .await
        .expect("start");
    let again = store
        .start_scenario(id, std::time::Duration::from_secs(5))
        .await
        .expect("start again");
    assert_eq!(start, again, "a run starts once");
    let at = |ms: i64| start + chrono::Duration::milliseconds(ms);
    let row = |idx, planned, applied, error: &str| nextmini_operator::store::AppliedRow {
        idx,
        planned_at: at(planned),
        applied_at: at(applied),
        error: error.into(),
    };
    store
        .record_scenario_applied(id, "s", &[row(0, 1500, 1501, ""), row(1, 2000, 2000, "")])
        .await
        .expect("s reports");
    store
        .record_scenario_applied(id, "x", &[row(0, 1500, 1503, ""), row(1, 2000, 2009, "x")])
        .await
        .expect("x reports");
    // A report repeated after a reconnect changes nothing.
    store
        .record_scenario_applied(id, "x", &[row(0, 1500, 1600, "")])
        .await
        .expect("repeat");
    let timeline = store.scenario_timeline("dia").await.expect("timeline");
    let summary: Vec<String> = timeline
        .iter()
        .map(|t| {
            format!(
                "{} {} {} skew {:?} agents {} errors {:?}",
                t.idx, t.target, t.kind, t.worst_skew_us, t.agents, t.errors
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            "0 s-x set skew Some(3000) agents 2 errors \"\"",
            "1 s-x down skew Some(9000) agents 2 errors \"x: x\"",
            "2 y-t up skew None agents 0 errors \"\"",
        ]
    );
    assert_eq!(timeline[0].planned_at, Some(at(1500)));
    assert_eq!(timeline[0].last_applied_at, Some(at(1503)));
    assert_eq!(timeline[0].at_us, 1_500_000);

    let before = store.scenario_timeline("dia").await.expect("timeline");
    for sql in [
        "UPDATE scenario_events SET at_us = 0",
        "INSERT INTO scenario_events (topology_id, idx, at_us, link, kind) SELECT id, 9, 0, 's-y', 'down' FROM topologies",
        "UPDATE scenario_runs SET starts_at = now()",
        "UPDATE scenario_applied SET skew_us = 0",
        "INSERT INTO scenario_applied (topology_id, idx, node, planned_at, applied_at, skew_us) \
         SELECT id, 2, 'y', now(), now(), 0 FROM topologies",
    ] {
        refused(
            &mut user,
            sql,
            "written by Nextmini from the Topology's spec.scenario",
        )
        .await;
    }
    assert_eq!(
        store.scenario_timeline("dia").await.expect("timeline"),
        before,
        "a refused write changed the timeline"
    );
}

/// Issue 17.3: the operator records where a node is dialed across clusters;
/// a change moves the generation (so the hub tells the dialers), a record
/// that changes nothing does not, and what is not `host:port` is refused
/// even from the operator.
#[tokio::test]
async fn endpoints_are_recorded_by_the_operator_and_move_the_generation() {
    let (_db, store, _user) = stored("endpoint-rows").await;
    let generation = |store: Store| async move {
        sqlx::query_scalar::<_, i64>("SELECT plan_generation FROM topologies WHERE name = 'dia'")
            .fetch_one(store.pool())
            .await
            .expect("generation")
    };
    let g0 = generation(store.clone()).await;
    let wanted = BTreeMap::from([
        ("x".to_owned(), Some("198.18.64.9:7100".to_owned())),
        ("y".to_owned(), None),
    ]);
    assert!(
        store
            .record_endpoints("dia", &wanted)
            .await
            .expect("record")
    );
    let g1 = generation(store.clone()).await;
    assert_eq!(g1, g0 + 1, "a new endpoint is a new plan generation");
    assert_eq!(
        store.endpoints("dia").await.expect("endpoints"),
        [("x".to_owned(), "198.18.64.9:7100".to_owned())].into()
    );
    assert!(!store.record_endpoints("dia", &wanted).await.expect("again"));
    assert_eq!(
        generation(store.clone()).await,
        g1,
        "nothing changed, nothing sent"
    );
    // A node left out loses its endpoint.
    assert!(
        store
            .record_endpoints("dia", &BTreeMap::new())
            .await
            .expect("none")
    );
    assert!(store.endpoints("dia").await.expect("endpoints").is_empty());
    let bad = BTreeMap::from([("x".to_owned(), Some("http://x/".to_owned()))]);
    let err = store
        .record_endpoints("dia", &bad)
        .await
        .expect_err("not host:port");
    assert!(
        err.to_string().contains("nodes_endpoint_host_port"),
        "{err}"
    );
    assert!(
        store.endpoints("dia").await.expect("endpoints").is_empty(),
        "refused whole"
    );
}
