//! Timed scenarios (`spec.scenario`, issue 18.2) on live traffic. The example
//! manifest's b-c link slows from 16 to 4 Mbit/s at 5 s, goes down at 8 s and
//! comes back at 9 s, under paced UDP from a to c at 24 Mbit/s. Every check
//! is made against the times PostgreSQL recorded: each event took effect on
//! both ends within 10 ms of its planned instant, the rate before and after
//! the change is the configured one, and the outage starts and ends where the
//! recorded down and up events say. A second topology's middle node is
//! killed and restarted by its scenario.

use nextmini_e2e::udp_sink::{Arrival, UdpSink};
use nextmini_e2e::{Env, repo_path};
use nextmini_operator::observe::dashboards;
use std::time::{Duration, Instant};

const TOPOLOGY: &str = "scenario";
/// Datagram payload; with UDP and IPv4 headers 28 bytes more go through the
/// shaper, which counts IP bytes.
const PAYLOAD: usize = 1200;
const IP_BYTES: f64 = (PAYLOAD + 28) as f64;
/// The planned offsets of the example manifest's link events.
const SLOW_AT: f64 = 5.0;
const DOWN_AT: f64 = 8.0;
const UP_AT: f64 = 9.0;
/// A link's event may take effect this long after its instant on an agent.
const SKEW_LIMIT_US: i64 = 10_000;
/// A node's event: the hub's runtime sends a signal (about 1–2 ms after the
/// instant) or forks and execs the agent (4–7 ms on two busy cores), so the
/// bound leaves room for a loaded CI machine.
const NODE_SKEW_LIMIT_US: i64 = 25_000;

/// Sends numbered datagrams of argv[2] bytes to argv[1]:9000 at argv[3]
/// datagrams per second for argv[4] seconds, paced every 4 ms.
const SENDER: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
size, pps, secs = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
t0 = time.monotonic()
i = 0
while time.monotonic() - t0 < secs:
    due = int((time.monotonic() - t0) * pps)
    while i < due:
        try:
            s.sendto(b"%08d" % i + b"x" * (size - 8), (sys.argv[1], 9000))
        except OSError:
            pass
        i += 1
    time.sleep(0.004)
"#;

/// One event as PostgreSQL recorded it: planned instant and, per agent, when
/// it took effect (µs since the Unix epoch).
#[derive(Debug)]
struct Recorded {
    planned_us: i64,
    applied_us: Vec<i64>,
    skews_us: Vec<i64>,
}

fn recorded(env: &Env) -> Vec<Recorded> {
    let rows = env.psql(&format!(
        "SELECT e.idx, (extract(epoch FROM r.starts_at) * 1e6)::bigint + e.at_us, \
                (extract(epoch FROM a.applied_at) * 1e6)::bigint, a.skew_us \
         FROM scenario_events e JOIN topologies t ON t.id = e.topology_id \
         JOIN scenario_runs r ON r.topology_id = t.id \
         JOIN scenario_applied a ON a.topology_id = t.id AND a.idx = e.idx \
         WHERE t.name = '{TOPOLOGY}' AND a.error = '' ORDER BY e.idx, a.node"
    ));
    let mut out: Vec<Recorded> = Vec::new();
    for line in rows.lines().filter(|l| !l.is_empty()) {
        let f: Vec<i64> = line
            .split('|')
            .map(|v| v.parse().expect("numbers"))
            .collect();
        let idx = f[0] as usize;
        while out.len() <= idx {
            out.push(Recorded {
                planned_us: f[1],
                applied_us: Vec::new(),
                skews_us: Vec::new(),
            });
        }
        out[idx].planned_us = f[1];
        out[idx].applied_us.push(f[2]);
        out[idx].skews_us.push(f[3]);
    }
    out
}

/// Received IP bits per second between two wall-clock instants (µs).
fn rate_bps(arrivals: &[Arrival], from_us: i64, to_us: i64) -> f64 {
    let n = arrivals
        .iter()
        .filter(|a| {
            let us = (a.at_ns / 1000) as i64;
            us >= from_us && us < to_us
        })
        .count();
    n as f64 * IP_BYTES * 8.0 / ((to_us - from_us) as f64 / 1e6)
}

#[test]
fn a_flap_scenario_runs_at_its_recorded_times() {
    let mut env = Env::new("scenarios");
    let manifest =
        std::fs::read_to_string(repo_path("manifests/examples/scenario.yaml")).expect("manifest");
    env.apply_yaml(TOPOLOGY, &manifest);
    // The sink waits out the one-second outage.
    let sink = UdpSink::start_wall_clock(&mut env, "c", 9000, Duration::from_secs(3));
    let size = PAYLOAD.to_string();
    // 24 Mbit/s of IP packets: above both of the link's rates.
    let pps = (24e6 / (IP_BYTES * 8.0)).round().to_string();
    env.spawn_in("a", &["python3", "-c", SENDER, "c", &size, &pps, "16"]);
    let start_us: i64 = {
        let mut start = String::new();
        env.wait_for("the scenario to start", Duration::from_secs(15), || {
            start = env.psql(&format!(
                "SELECT (extract(epoch FROM r.starts_at) * 1e6)::bigint FROM scenario_runs r \
                 JOIN topologies t ON t.id = r.topology_id WHERE t.name = '{TOPOLOGY}'"
            ));
            !start.is_empty()
        });
        start.parse().expect("start")
    };
    // Every event reported by both ends of b-c.
    let deadline = Instant::now() + Duration::from_secs(30);
    let events = loop {
        let events = recorded(&env);
        // The example's link events (its node events come later).
        if events.len() >= 3 && events[..3].iter().all(|e| e.applied_us.len() == 2) {
            break events;
        }
        assert!(
            Instant::now() < deadline,
            "not every event was recorded by both agents: {events:?}\n{}",
            env.ok(&["status", TOPOLOGY])
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let arrivals = sink.arrivals(&env, Duration::from_secs(30));
    let status = env.ok(&["status", TOPOLOGY]);
    println!("{status}");
    assert!(
        status.contains("scenario (started") && status.contains("WORST SKEW"),
        "status shows no scenario:\n{status}"
    );

    // The link dashboard's annotations mark the events.
    let link_dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_path("grafana/dashboards/nextmini-link.json"))
            .expect("link dashboard"),
    )
    .expect("dashboard JSON");
    let annotations: Vec<String> = dashboards::queries(&link_dashboard)
        .into_iter()
        .filter(|q| q.panel.starts_with("annotation"))
        .map(|q| {
            env.psql(&dashboards::substitute(
                &q.text,
                &[("topology", "'scenario'")],
            ))
        })
        .collect();
    assert!(
        annotations
            .iter()
            .any(|rows| ["b-c set", "b-c down", "b-c up"]
                .iter()
                .all(|e| rows.contains(e))),
        "the dashboard's annotations miss events: {annotations:?}"
    );

    // Each event at its offset, on both agents, within the limit.
    for (e, offset) in events.iter().zip([SLOW_AT, DOWN_AT, UP_AT]) {
        let planned = start_us + (offset * 1e6) as i64;
        assert_eq!(
            e.planned_us, planned,
            "event at {offset} s planned elsewhere"
        );
        println!("event at {offset} s: skew per agent {:?} µs", e.skews_us);
        for skew in &e.skews_us {
            assert!(
                (0..=SKEW_LIMIT_US).contains(skew),
                "event at {offset} s took effect {skew} µs from its instant (limit {SKEW_LIMIT_US} µs)"
            );
        }
    }
    let took_effect = |i: usize| *events[i].applied_us.iter().max().expect("applied");
    let (slow, down, up) = (took_effect(0), took_effect(1), took_effect(2));

    // The sender ran from before the first window to after the last.
    let first = arrivals
        .first()
        .map_or(i64::MAX, |a| (a.at_ns / 1000) as i64);
    let last = arrivals.last().map_or(0, |a| (a.at_ns / 1000) as i64);
    assert!(
        first < slow - 2_500_000 && last > up + 1_500_000,
        "traffic from {first} to {last} µs does not cover the scenario ({slow}..{up})"
    );

    // The rate before and after the change: the shaper's, not the sender's.
    let before = rate_bps(&arrivals, slow - 2_000_000, slow);
    let after = rate_bps(&arrivals, slow + 500_000, down);
    let back = rate_bps(&arrivals, up + 200_000, up + 1_200_000);
    println!(
        "received {:.2} Mbit/s before the change, {:.2} after, {:.2} after the outage",
        before / 1e6,
        after / 1e6,
        back / 1e6
    );
    for (what, got, want) in [
        ("before the change", before, 16e6),
        ("after the change", after, 4e6),
        ("after the outage", back, 4e6),
    ] {
        assert!(
            (got - want).abs() <= want * 0.1,
            "{what}: {:.2} Mbit/s, configured {:.2}",
            got / 1e6,
            want / 1e6
        );
    }

    // The outage: the longest silence around the down event starts when the
    // link went down (plus the 5 ms delay and what its 20-packet queue still
    // held: 49 ms at 4 Mbit/s) and ends when it came up (plus the delay).
    let window: Vec<i64> = arrivals
        .iter()
        .map(|a| (a.at_ns / 1000) as i64)
        .filter(|us| *us > down - 1_000_000 && *us < up + 1_000_000)
        .collect();
    let (gap_start, gap_end) = window
        .windows(2)
        .map(|w| (w[0], w[1]))
        .max_by_key(|(a, b)| b - a)
        .expect("arrivals around the outage");
    assert!(
        gap_end - gap_start >= (up - down) * 8 / 10,
        "no outage: the longest silence between the recorded down and up was {:.1} ms",
        (gap_end - gap_start) as f64 / 1000.0
    );
    println!(
        "outage seen from {:+.1} ms after the recorded down to {:+.1} ms after the recorded up",
        (gap_start - down) as f64 / 1000.0,
        (gap_end - up) as f64 / 1000.0
    );
    assert!(
        (-5_000..=80_000).contains(&(gap_start - down)),
        "the last datagram before the outage arrived {} ms after the link went down",
        (gap_start - down) as f64 / 1000.0
    );
    assert!(
        (0..=40_000).contains(&(gap_end - up)),
        "the first datagram after the outage arrived {} ms after the link came up",
        (gap_end - up) as f64 / 1000.0
    );
}

const NODES_TOPOLOGY: &str = "scenario-nodes";

/// A node's agent killed at 3 s and restarted at 5 s under paced UDP from a
/// to c through it: the hub's runtime applies both at their instants and
/// records them, the supervisor leaves the killed agent down until the
/// restart, and traffic stops at the kill and comes back after the restart.
#[test]
fn a_node_killed_and_restarted_by_the_scenario() {
    let mut env = Env::new("scenario-nodes");
    let manifest = format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata:\n  name: {NODES_TOPOLOGY}\nspec:\n  \
         nodes: [{{name: a}}, {{name: b}}, {{name: c}}]\n  links:\n    - endpoints: [a, b]\n    \
         - endpoints: [b, c]\n  scenario:\n    events:\n      - {{at: 3s, node: b, action: kill}}\n      \
         - {{at: 5s, node: b, action: restart}}\n"
    );
    env.apply_yaml(NODES_TOPOLOGY, &manifest);
    let pid_of_b = |env: &Env| {
        env.psql(&format!(
            "SELECT n.pid FROM nodes n JOIN topologies t ON t.id = n.topology_id \
             WHERE t.name = '{NODES_TOPOLOGY}' AND n.name = 'b'"
        ))
    };
    let first_pid = pid_of_b(&env);
    let sink = UdpSink::start_wall_clock(&mut env, "c", 9000, Duration::from_secs(6));
    env.spawn_in("a", &["python3", "-c", SENDER, "c", "200", "500", "12"]);
    let query = format!(
        "SELECT a.idx, (extract(epoch FROM a.planned_at) * 1e6)::bigint, \
                (extract(epoch FROM a.applied_at) * 1e6)::bigint, a.skew_us, a.error \
         FROM scenario_applied a JOIN topologies t ON t.id = a.topology_id \
         WHERE t.name = '{NODES_TOPOLOGY}' ORDER BY a.idx"
    );
    let mut rows = String::new();
    env.wait_for("both node events recorded", Duration::from_secs(30), || {
        rows = env.psql(&query);
        rows.lines().count() == 2
    });
    let events: Vec<Vec<String>> = rows
        .lines()
        .map(|l| l.split('|').map(str::to_owned).collect())
        .collect();
    for e in &events {
        assert_eq!(e[4], "", "event {} failed: {}", e[0], e[4]);
        let skew: i64 = e[3].parse().expect("skew");
        println!("node event {}: skew {skew} µs", e[0]);
        assert!(
            (0..=NODE_SKEW_LIMIT_US).contains(&skew),
            "node event {} took effect {skew} µs from its instant",
            e[0]
        );
    }
    let kill: i64 = events[0][2].parse().expect("kill time");
    let restart: i64 = events[1][2].parse().expect("restart time");
    let arrivals = sink.arrivals(&env, Duration::from_secs(40));
    let times: Vec<i64> = arrivals.iter().map(|a| (a.at_ns / 1000) as i64).collect();
    let (gap_start, gap_end) = times
        .windows(2)
        .map(|w| (w[0], w[1]))
        .max_by_key(|(a, b)| b - a)
        .expect("arrivals");
    println!(
        "traffic stopped {:+.1} ms after the recorded kill and came back {:+.1} ms after the recorded restart",
        (gap_start - kill) as f64 / 1000.0,
        (gap_end - restart) as f64 / 1000.0
    );
    // Nothing crosses b once its agent is dead (what was in flight on the
    // unshaped links lands within milliseconds).
    assert!(
        (-10_000..=20_000).contains(&(gap_start - kill)),
        "the last datagram arrived {} ms from the recorded kill",
        (gap_start - kill) as f64 / 1000.0
    );
    // Held down until the restart (the supervisor would restart it within
    // a second), then back once the new agent has its config and links.
    assert!(
        gap_end > restart && gap_end - restart < 3_000_000,
        "traffic came back {} ms from the recorded restart",
        (gap_end - restart) as f64 / 1000.0
    );
    let second_pid = pid_of_b(&env);
    assert_ne!(first_pid, second_pid, "b runs the same agent as before");
    assert!(nextmini_e2e::all_acked(&env, NODES_TOPOLOGY));
}
