//! Live routing by SQL: rows in `routes` and `route_rules` steer real flows (two
//! iperf3 flows between the same pair of nodes on different paths, a weighted
//! split of an aggregate), seen on per-link counters; metrics history is kept.

#[path = "support/node_states.rs"]
mod node_states;

use nextmini_e2e::{Env, all_acked, kill9, link_counter};
use node_states::{wait_state, watch_node_states};
use std::process::{Child, Stdio};
use std::time::Duration;
use std::time::Instant;

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
    queue:
      limit: 200pkt
  nodes: [{name: s}, {name: x}, {name: y}, {name: d}]
  links:
    - endpoints: [s, x]
    - endpoints: [x, d]
    - endpoints: [s, y]
    - endpoints: [y, d]
";

fn iperf(env: &Env, port: &str, parallel: &str) -> Child {
    env.command(&[
        "exec", "s", "--", "iperf3", "-c", "d", "-p", port, "-t", "3", "-P", parallel,
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("iperf3 client")
}

/// Bytes s sent on s-x and on s-y while `run` ran.
fn sent_by_s(env: &Env, run: impl FnOnce()) -> (i64, i64) {
    let read = || {
        (
            link_counter(env, "dia", "s-x", "s", "tx_bytes"),
            link_counter(env, "dia", "s-y", "s", "tx_bytes"),
        )
    };
    let before = read();
    run();
    // Two report intervals, so the counters include the end of the run.
    std::thread::sleep(Duration::from_millis(600));
    let after = read();
    (after.0 - before.0, after.1 - before.1)
}

fn sql_change(env: &Env, sql: &str) {
    env.psql(sql);
    env.wait_for(
        "agents to apply the route change",
        Duration::from_secs(5),
        || all_acked(env, "dia"),
    );
}

#[test]
fn routes_in_sql_steer_flows_and_split_aggregates() {
    let mut env = Env::new("routing");
    let manifest = env.state_dir.join("dia.yaml");
    std::fs::write(&manifest, DIAMOND).expect("manifest");
    env.ok(&["up", "-f", manifest.to_str().expect("path")]);
    for port in ["5201", "5202"] {
        env.spawn_in("d", &["iperf3", "-s", "-p", port]);
    }
    env.wait_for("iperf3 servers", Duration::from_secs(10), || {
        env.exec("d", &["sh", "-c", "ss -ltn | grep -q ':5202 '"])
            .status
            .success()
    });
    let both = |env: &Env| {
        let mut a = iperf(env, "5201", "1");
        let mut b = iperf(env, "5202", "1");
        assert!(a.wait().expect("iperf3").success() && b.wait().expect("iperf3").success());
    };
    const MB: i64 = 1_000_000;

    // Shortest path: both flows share one of the two equal paths.
    let (sx, sy) = sent_by_s(&env, || both(&env));
    println!("shortest path: s-x {} MB, s-y {} MB", sx / MB, sy / MB);
    assert!(
        sx > 10 * MB && sy < MB,
        "both flows should take s-x (lowest link name)"
    );

    // One flow per path, chosen by destination port.
    sql_change(
        &env,
        "WITH t AS (SELECT id FROM topologies WHERE name = 'dia') \
         INSERT INTO routes (topology_id, id, name, path) \
         SELECT id, 1, 'via-x', ARRAY['s','x','d'] FROM t UNION ALL SELECT id, 2, 'via-y', ARRAY['s','y','d'] FROM t",
    );
    sql_change(
        &env,
        "INSERT INTO route_rules (topology_id, src, dst, protocol, dst_port, route_id) \
         SELECT id, 's', 'd', 6, 5201, 1 FROM topologies WHERE name = 'dia' \
         UNION ALL SELECT id, 's', 'd', 6, 5202, 2 FROM topologies WHERE name = 'dia'",
    );
    let (sx, sy) = sent_by_s(&env, || both(&env));
    println!("per-port routes: s-x {} MB, s-y {} MB", sx / MB, sy / MB);
    assert!(
        sx > 10 * MB && sy > 10 * MB,
        "each path should carry one flow"
    );
    // Transit nodes saw the labelled traffic.
    assert!(link_counter(&env, "dia", "y-d", "y", "tx_bytes") > 10 * MB);

    // An invalid route is refused by the database, naming what is wrong.
    let url = env.ok(&["db", "url"]);
    assert!(
        url.starts_with("postgres://"),
        "`nextmini db url` printed {url:?}"
    );
    let refused = std::process::Command::new("psql")
        .args(["-h"])
        .arg(env.state_dir.join("postgres-run"))
        .args(["-p", &env.pg_port.to_string(), "-U", "postgres", "-d", "nextmini", "-tAc"])
        .arg("INSERT INTO routes (topology_id, id, name, path) SELECT id, 3, 'bad', ARRAY['s','d'] FROM topologies WHERE name = 'dia'")
        .output()
        .expect("psql");
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && message.contains("no link between s and d"),
        "{message}"
    );

    // Weighted multipath for the aggregate: 16 parallel flows split over both paths.
    sql_change(&env, "DELETE FROM route_rules WHERE dst_port IS NOT NULL");
    sql_change(
        &env,
        "INSERT INTO route_rules (topology_id, src, dst, route_id, weight) \
         SELECT id, 's', 'd', 1, 1 FROM topologies WHERE name = 'dia' \
         UNION ALL SELECT id, 's', 'd', 2, 1 FROM topologies WHERE name = 'dia'",
    );
    let (sx, sy) = sent_by_s(&env, || {
        assert!(iperf(&env, "5201", "16").wait().expect("iperf3").success());
    });
    println!(
        "weighted multipath 1:1, 16 flows: s-x {} MB, s-y {} MB",
        sx / MB,
        sy / MB
    );
    assert!(
        sx > 5 * MB && sy > 5 * MB,
        "the aggregate should use both paths"
    );

    // The metrics history holds the samples, with rates computable in SQL.
    let samples: i64 = env
        .psql("SELECT count(*) FROM link_metrics m JOIN topologies t ON t.id = m.topology_id WHERE t.name = 'dia'")
        .parse()
        .expect("count");
    assert!(samples > 50, "only {samples} metric samples");
    let peak: f64 = env
        .psql("SELECT COALESCE(max(tx_bps), 0) FROM link_rates r JOIN topologies t ON t.id = r.topology_id WHERE t.name = 'dia' AND link = 's-y' AND node = 's'")
        .parse()
        .expect("rate");
    assert!(
        peak > 20e6 && peak < 60e6,
        "peak s-y rate {peak} bit/s should be near the 50 Mbit/s limit"
    );

    // A dead agent: its node is marked down, and its neighbours report the link down.
    let pid: i32 = env
        .psql("SELECT n.pid FROM nodes n JOIN topologies t ON t.id = n.topology_id WHERE t.name = 'dia' AND n.name = 'y'")
        .parse()
        .expect("pid of y's agent");
    // The local runtime restarts the agent within half a second, quicker than
    // polling can be sure to see; the schema's notifications show every change.
    let events = watch_node_states(env.ok(&["db", "url"]).trim().to_string());
    // s's side of s-y, as `connected|connects`. The restarted agent can bring
    // the link back between two reports, so a connection counted after the
    // kill shows the outage as surely as a report of it down.
    let s_y = || {
        env.psql("SELECT connected || '|' || connects FROM link_counters c JOIN topologies t ON t.id = c.topology_id WHERE t.name = 'dia' AND c.link = 's-y' AND c.node = 's'")
    };
    let connects_before: u64 = s_y()
        .split_once('|')
        .and_then(|(_, n)| n.parse().ok())
        .expect("s's counters of s-y");
    let killed = Instant::now();
    kill9(pid);
    let marked = wait_state(&events, "dia/y disconnected", Duration::from_secs(5)) - killed;
    env.wait_for("s to report s-y down", Duration::from_secs(5), || {
        let now = s_y();
        let (up, connects) = now.split_once('|').unwrap_or(("", "0"));
        up == "false" || connects.parse::<u64>().is_ok_and(|n| n > connects_before)
    });
    println!(
        "dead agent: node marked down after {marked:?}, link reported down after {:?}",
        killed.elapsed()
    );
}
