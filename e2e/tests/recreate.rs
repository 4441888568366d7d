//! A topology taken down and brought up again under the same name runs what
//! its new manifest says, whether or not another topology kept the hub (and
//! its cached views) alive in between; and `down` returns only when the
//! topology's processes and namespaces are gone.

use nextmini_e2e::{Env, agent_pids_of, is_running, link_counter, namespaces_of, repo_path};
use std::time::Duration;

const TOPOLOGY: &str = "relink";

/// A 3-node line x — y — z whose links all carry `link_defaults`.
fn manifest(link_defaults: &str) -> String {
    format!(
        "apiVersion: nextmini.io/v1alpha1
kind: Topology
metadata:
  name: {TOPOLOGY}
spec:
  generator: {{line: {{nodes: 3}}}}
  linkDefaults: {link_defaults}
"
    )
}

fn write(env: &Env, file: &str, text: &str) -> String {
    let path = env.state_dir.join(file);
    std::fs::write(&path, text).expect("manifest");
    path.to_str().expect("UTF-8 path").to_string()
}

/// Summary of `count` pings n0 → n2: (loss %, avg ms, max ms).
fn ping_summary(env: &Env, count: u32, interval: &str) -> (f64, f64, f64) {
    let out = env.exec(
        "n0",
        &[
            "ping",
            "-q",
            "-c",
            &count.to_string(),
            "-i",
            interval,
            "-W",
            "3",
            "n2",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let loss = text
        .split(',')
        .find(|p| p.contains("packet loss"))
        .and_then(|p| p.trim().split('%').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no loss figure in ping output: {text}"));
    let rtt: Vec<f64> = text
        .lines()
        .find(|l| l.contains("min/avg/max"))
        .and_then(|l| l.split('=').nth(1))
        .map(|v| {
            v.trim()
                .trim_end_matches(" ms")
                .split('/')
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    assert!(rtt.len() >= 3, "no rtt summary in ping output: {text}");
    (loss, rtt[1], rtt[2])
}

fn recreate_runs_the_new_parameters(keep_hub_alive: bool) {
    let mut env = Env::new(if keep_hub_alive {
        "recreate-shared"
    } else {
        "recreate-alone"
    });
    if keep_hub_alive {
        let line3 = repo_path("manifests/examples/line3.yaml");
        env.ok(&["up", "-f", line3.to_str().expect("path")]);
    }

    // The first creation: fast, short links without loss.
    let fast = write(&env, "fast.yaml", &manifest("{rate: 200Mbit, delay: 1ms}"));
    env.ok(&["up", "-f", &fast]);
    let (_, avg, _) = ping_summary(&env, 20, "0.05");
    assert!(
        (3.5..8.0).contains(&avg),
        "first creation: n0→n2 RTT {avg:.2} ms, expected about 4 ms"
    );
    // A process of the user's inside a node must not outlive the topology.
    let server = env.spawn_in("n2", &["iperf3", "-s"]);
    env.wait_for("iperf3 in n2", Duration::from_secs(10), || {
        std::fs::read_link(format!("/proc/{server}/exe"))
            .is_ok_and(|exe| exe.to_string_lossy().contains("iperf3"))
    });

    env.ok(&["down", TOPOLOGY]);
    // Checked at once: `down` has returned, so nothing of the topology may run.
    let agents = agent_pids_of(TOPOLOGY);
    assert!(
        agents.is_empty(),
        "agents {agents:?} still run after `down` returned"
    );
    let namespaces = namespaces_of(TOPOLOGY);
    assert!(
        namespaces.is_empty(),
        "namespaces {namespaces:?} left after `down` returned"
    );
    assert!(
        !is_running(server as i32),
        "iperf3 started in n2 still runs after `down` returned"
    );

    // The same name again, with every link parameter changed.
    let slow = write(
        &env,
        "slow.yaml",
        &manifest("{rate: 12Mbit, delay: 9ms, loss: 3%, queue: {limit: 50pkt}}"),
    );
    env.ok(&["up", "-f", &slow]);
    let status = env.ok(&["status", TOPOLOGY]);
    assert!(
        status.contains("12"),
        "status does not show 12Mbit: {status}"
    );

    // Delay and loss: 4 link crossings per round trip, 9 ms and 3 % each.
    let (loss, avg, _) = ping_summary(&env, 200, "0.02");
    assert!(
        (33.0..42.0).contains(&avg),
        "n0→n2 RTT {avg:.2} ms, expected about 36 ms (4 × 9 ms)"
    );
    let expected_loss = 100.0 * (1.0 - 0.97f64.powi(4));
    assert!(
        (3.0..25.0).contains(&loss),
        "ping loss {loss}%, expected about {expected_loss:.1}% (3% per crossing)"
    );

    // Rate and queue: UDP at 30 Mbit/s into a 12 Mbit/s line with 50-packet queues.
    env.spawn_in("n2", &["iperf3", "-s", "-1"]);
    std::thread::sleep(Duration::from_millis(500));
    let flood = env
        .command(&[
            "exec", "n0", "--", "iperf3", "-J", "-u", "-b", "30M", "-l", "1200", "-t", "5", "-c",
            "n2",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("iperf3 client");
    std::thread::sleep(Duration::from_secs(2));
    // 40 pings, not 20: each must find room in full 50-packet queues and
    // cross 3% loss four times, so few come back; of 20, none did once.
    let (_, _, max_under_load) = ping_summary(&env, 40, "0.05");
    let out = flood.wait_with_output().expect("iperf3 client");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "iperf3 gave no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let delivered = report["end"]["sum"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0)
        * (1.0
            - report["end"]["sum"]["lost_percent"]
                .as_f64()
                .unwrap_or(100.0)
                / 100.0);
    // The shaper counts IP bytes (1,228 per 1,200-byte datagram); two lossy hops.
    let expected = 12e6 * 1200.0 / 1228.0 * 0.97 * 0.97;
    assert!(
        (delivered / expected - 1.0).abs() < 0.12,
        "UDP delivered {:.2} Mbit/s, expected about {:.2} Mbit/s (12 Mbit/s links)",
        delivered / 1e6,
        expected / 1e6
    );
    // A 50-packet queue at 12 Mbit/s holds 41 ms; the default queue holds far more.
    let bound = 36.0 + 41.0 + 40.0;
    assert!(
        max_under_load < bound,
        "max RTT under load {max_under_load:.1} ms, a 50-packet queue allows < {bound} ms"
    );
    env.wait_for("queue drops reported", Duration::from_secs(5), || {
        link_counter(&env, TOPOLOGY, "n0-n1", "n0", "drops_queue") > 0
    });
    env.ok(&["down", TOPOLOGY]);
}

#[test]
fn recreated_topology_runs_its_new_parameters_while_another_keeps_the_hub() {
    recreate_runs_the_new_parameters(true);
}

#[test]
fn recreated_topology_runs_its_new_parameters_alone() {
    recreate_runs_the_new_parameters(false);
}
