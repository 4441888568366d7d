//! A Python control algorithm steering real traffic: flow A (4 TCP streams) and
//! flow B share one of two 50 Mbit/s paths; `python/examples/least_loaded.py`, reacting to metric
//! NOTIFYs, moves one flow to the idle path, and that flow's throughput rises.

use nextmini_e2e::{Env, repo_path};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

#[test]
fn least_loaded_script_moves_a_flow_to_the_idle_path() {
    let mut env = Env::new("scripts");
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
    // Both flows start on the path through x.
    env.psql(
        "WITH t AS (SELECT id FROM topologies WHERE name = 'dia') \
         INSERT INTO routes (topology_id, id, name, path) \
         SELECT id, 1, 'via-x', ARRAY['s','x','d'] FROM t UNION ALL SELECT id, 2, 'via-y', ARRAY['s','y','d'] FROM t",
    );
    env.psql(
        "INSERT INTO route_rules (topology_id, src, dst, protocol, dst_port, route_id) \
         SELECT id, 's', 'd', 6, 5201, 1 FROM topologies WHERE name = 'dia' \
         UNION ALL SELECT id, 's', 'd', 6, 5202, 1 FROM topologies WHERE name = 'dia'",
    );
    std::thread::sleep(Duration::from_millis(500));

    let run_for = "16";
    let mut a = env
        .command(&[
            "exec", "s", "--", "iperf3", "-c", "d", "-p", "5201", "-t", run_for, "-P", "4",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("flow A");
    let b = env
        .command(&[
            "exec", "s", "--", "iperf3", "-J", "-c", "d", "-p", "5202", "-t", run_for, "-i", "1",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("flow B");
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(5));

    let url = env.ok(&["db", "url"]).trim().to_string();
    let script_started = started.elapsed().as_secs_f64();
    let mut script = Command::new("python3")
        .arg(repo_path("python/examples/least_loaded.py"))
        .args([
            "--topology",
            "dia",
            "--src",
            "s",
            "--dst",
            "d",
            "--protocol",
            "tcp",
            "--dst-port",
            "5202",
        ])
        .env("NEXTMINI_DATABASE_URL", &url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("least_loaded.py");

    let out = b.wait_with_output().expect("flow B");
    let _ = a.wait();
    let _ = script.kill();
    let script_out = script.wait_with_output().expect("script output");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&script_out.stdout),
        String::from_utf8_lossy(&script_out.stderr)
    );
    assert!(out.status.success(), "flow B failed");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("iperf3 JSON");
    let rate_between = |from: f64, to: f64| {
        let v: Vec<f64> = report["intervals"]
            .as_array()
            .expect("intervals")
            .iter()
            .filter_map(|i| {
                Some((
                    i["sum"]["end"].as_f64()?,
                    i["sum"]["bits_per_second"].as_f64()?,
                ))
            })
            .filter(|(end, _)| *end > from && *end <= to)
            .map(|(_, bps)| bps)
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let before = rate_between(1.0, script_started);
    let after = rate_between(script_started + 5.0, 16.0);
    println!(
        "flow B: {:.1} Mbit/s sharing the path, {:.1} Mbit/s after the script moved it\nscript said:\n{log}",
        before / 1e6,
        after / 1e6
    );
    let moved: String = env.psql(
        "SELECT r.route_id FROM route_rules r JOIN topologies t ON t.id = r.topology_id \
         WHERE t.name = 'dia' AND r.dst_port = 5202",
    );
    assert_eq!(
        moved, "2",
        "the script should have moved flow B onto the path through y"
    );
    assert!(
        after > 2.0 * before && after > 30e6,
        "flow B did not speed up: {before:.0} → {after:.0} bit/s"
    );
}
