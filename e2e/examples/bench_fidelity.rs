//! Benchmark (issue 14.2): fidelity at scale on this machine's cores.
//!
//! Three experiments, each on its own topology, each with iperf3 TCP for
//! `NEXTMINI_BENCH_SECS` (default 10) seconds:
//! - `fattree-one`: a fat-tree of k = 4 (20 switches, 16 hosts), 300 Mbit/s and
//!   2 ms per link, one flow between the farthest hosts (host-0-0-0 →
//!   host-3-1-1, seven agents on its path). Target: within 3% of the expected
//!   goodput with under 0.1% retransmissions.
//! - `fattree-four`: the same, four flows at once from the hosts of pod 0 to
//!   those of pod 3. Target: each within 5% of its fair share. The routes
//!   decide which links the flows share, so the bench finds each flow's path
//!   first (a burst of UDP from client to server, alone, then the links whose
//!   sent bytes grew by the burst) and computes the max-min fair shares of
//!   those paths by water-filling.
//! - `line7-1g`: a line of 7 nodes at 1 Gbit/s and 1 ms per link, n0 → n6.
//!   Target: within 3%.
//!
//! Each row also gives the agents' CPU and what the fidelity guard said during
//! the run: where the emulator, not the emulated network, limited the traffic,
//! the guard must say so. A miss is printed, not fatal. Results go to
//! bench/results/fidelity.json.
//!
//! `sudo NEXTMINI_BIN_DIR=$PWD/target/release cargo run --release -p nextmini-e2e --example bench_fidelity`

use anyhow::Context;
use nextmini_e2e::bench;
use nextmini_e2e::{Env, agent_pids_of, fidelity_episodes, iperf3, tcp_goodput, tcp_payload_ratio};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// A direction of a link: (link, sending node).
type Hop = (String, String);

/// Bytes each link direction of `topology` has sent so far.
fn sent_bytes(env: &Env, topology: &str) -> BTreeMap<Hop, i64> {
    env.psql(&format!(
        "SELECT c.link, c.node, c.tx_bytes FROM link_counters c JOIN topologies t ON t.id = c.topology_id \
         WHERE t.name = '{topology}'"
    ))
    .lines()
    .filter_map(|line| {
        let mut cols = line.split('|');
        let (link, node, bytes) = (cols.next()?, cols.next()?, cols.next()?);
        Some(((link.to_owned(), node.to_owned()), bytes.trim().parse().ok()?))
    })
    .collect()
}

/// The link directions a packet from `client` to `server` crosses: those that
/// carry a 600 KB burst of UDP sent alone (the server's ICMP answers are tiny).
fn path_of(env: &Env, topology: &str, client: &str, server: &str) -> BTreeSet<Hop> {
    const PACKETS: usize = 500;
    const PAYLOAD: usize = 1200;
    let before = sent_bytes(env, topology);
    let send = format!(
        "import socket, time\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nfor _ in range({PACKETS}):\n    s.sendto(b'x' * {PAYLOAD}, ('{server}', 9))\n    time.sleep(0.0002)\n"
    );
    env.exec(client, &["python3", "-c", &send]);
    // Counters arrive with each agent's 1 s report.
    std::thread::sleep(Duration::from_millis(2500));
    let after = sent_bytes(env, topology);
    let burst = (PACKETS * PAYLOAD) as i64;
    after
        .into_iter()
        .filter(|(hop, bytes)| bytes - before.get(hop).copied().unwrap_or(0) >= burst * 9 / 10)
        .map(|(hop, _)| hop)
        .collect()
}

/// Max-min fair rates of flows over `paths`, every link direction carrying
/// `capacity`: raise all unfrozen flows together until a link fills, freeze the
/// flows on it, repeat.
fn fair_shares(paths: &[BTreeSet<Hop>], capacity: f64) -> Vec<f64> {
    let mut rate = vec![0.0; paths.len()];
    let mut frozen = vec![false; paths.len()];
    let mut left: BTreeMap<&Hop, f64> = paths.iter().flatten().map(|h| (h, capacity)).collect();
    while frozen.iter().any(|f| !f) {
        let users = |hop: &Hop, frozen: &[bool]| {
            paths
                .iter()
                .zip(frozen)
                .filter(|(p, f)| !**f && p.contains(hop))
                .count()
        };
        let step = left
            .iter()
            .filter_map(|(hop, cap)| match users(hop, &frozen) {
                0 => None,
                n => Some(cap / n as f64),
            })
            .fold(f64::INFINITY, f64::min);
        if !step.is_finite() {
            // A flow whose path was not found: no link limits it here.
            break;
        }
        for (i, f) in frozen.iter().enumerate() {
            if !f {
                rate[i] += step;
            }
        }
        let full: Vec<&Hop> = left
            .iter_mut()
            .filter_map(|(hop, cap)| {
                let n = users(hop, &frozen);
                *cap -= step * n as f64;
                (n > 0 && *cap <= capacity * 1e-9).then_some(*hop)
            })
            .collect();
        for (i, path) in paths.iter().enumerate() {
            if full.iter().any(|h| path.contains(*h)) {
                frozen[i] = true;
            }
        }
    }
    rate
}

const MTU: u32 = 1400;
/// TCP payload of a full packet: MTU less IPv4, TCP and timestamp headers.
const MSS: u32 = MTU - 20 - 32;

struct Case {
    name: &'static str,
    generator: &'static str,
    link: &'static str,
    rate_mbit: f64,
    /// (client, server) pairs, all run at once.
    flows: &'static [(&'static str, &'static str)],
    /// Allowed shortfall of each flow from its expected goodput.
    tolerance: f64,
    /// Most retransmissions per data packet, where the issue sets one.
    max_retransmit_ratio: Option<f64>,
}

const CASES: [Case; 3] = [
    Case {
        name: "fattree-one",
        generator: "{fatTree: {k: 4}}",
        link: "{rate: 300Mbit, delay: 2ms}",
        rate_mbit: 300.0,
        flows: &[("host-0-0-0", "host-3-1-1")],
        tolerance: 0.03,
        max_retransmit_ratio: Some(0.001),
    },
    Case {
        name: "fattree-four",
        generator: "{fatTree: {k: 4}}",
        link: "{rate: 300Mbit, delay: 2ms}",
        rate_mbit: 300.0,
        flows: &[
            ("host-0-0-0", "host-3-0-0"),
            ("host-0-0-1", "host-3-0-1"),
            ("host-0-1-0", "host-3-1-0"),
            ("host-0-1-1", "host-3-1-1"),
        ],
        tolerance: 0.05,
        max_retransmit_ratio: None,
    },
    Case {
        name: "line7-1g",
        generator: "{line: {nodes: 7}}",
        link: "{rate: 1Gbit, delay: 1ms}",
        rate_mbit: 1000.0,
        flows: &[("n0", "n6")],
        tolerance: 0.03,
        max_retransmit_ratio: None,
    },
];

fn manifest(topology: &str, case: &Case) -> String {
    format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata:\n  name: {topology}\nspec:\n  dataplane:\n    mtu: {MTU}\n  generator: {}\n  linkDefaults: {}\n",
        case.generator, case.link
    )
}

fn measure(env: &mut Env, case: &Case, secs: u64) -> anyhow::Result<Value> {
    let topology = format!("fid-{}", case.name);
    let file = env.state_dir.join(format!("{topology}.yaml"));
    std::fs::write(&file, manifest(&topology, case))?;
    eprintln!("{}: bringing the topology up", case.name);
    env.ok(&["up", "-f", file.to_str().expect("UTF-8 path")]);
    for (i, (_, server)) in case.flows.iter().enumerate() {
        let port = (5201 + i).to_string();
        env.spawn_in(server, &["iperf3", "-s", "-1", "-p", &port]);
        env.wait_for("iperf3 server", Duration::from_secs(10), || {
            env.exec(
                server,
                &["sh", "-c", &format!("ss -ltn | grep -q ':{port} '")],
            )
            .status
            .success()
        });
    }
    let pids = agent_pids_of(&topology);
    let paths: Vec<BTreeSet<Hop>> = if case.flows.len() > 1 {
        eprintln!("{}: finding each flow's path", case.name);
        case.flows
            .iter()
            .map(|(client, server)| path_of(env, &topology, client, server))
            .collect()
    } else {
        Vec::new()
    };
    let episodes_before = fidelity_episodes(env, &topology).len();
    let cpu_before = bench::cpu_seconds(&pids)?;
    eprintln!("{}: {} flow(s) for {secs} s", case.name, case.flows.len());
    let reports: Vec<Value> = std::thread::scope(|s| {
        let env = &*env;
        let handles: Vec<_> = case
            .flows
            .iter()
            .enumerate()
            .map(|(i, (client, server))| {
                let port = (5201 + i).to_string();
                let secs = secs.to_string();
                s.spawn(move || iperf3(env, client, &["-c", server, "-p", &port, "-t", &secs]))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Value::Null))
            .collect()
    });
    let cpu = bench::cpu_seconds(&pids)? - cpu_before;
    // The guard judges each 1 s report window: wait for the last one.
    std::thread::sleep(Duration::from_millis(2500));
    let episodes: Vec<String> = fidelity_episodes(env, &topology)
        .into_iter()
        .skip(episodes_before)
        .collect();
    env.ok(&["down", &topology]);

    let link_goodput = case.rate_mbit * 1e6 * tcp_payload_ratio(MTU);
    let shares = if paths.is_empty() {
        vec![link_goodput; case.flows.len()]
    } else {
        fair_shares(&paths, link_goodput)
    };
    let flows: Vec<Value> = case
        .flows
        .iter()
        .zip(&reports)
        .enumerate()
        .map(|(i, ((client, server), report))| {
            let sent = &report["end"]["sum_sent"];
            let packets = sent["bytes"].as_f64().unwrap_or(f64::NAN) / f64::from(MSS);
            let retransmits = sent["retransmits"].as_u64().unwrap_or(0);
            let path: Vec<String> = paths
                .get(i)
                .into_iter()
                .flatten()
                .map(|(link, node)| format!("{link}@{node}"))
                .collect();
            json!({
                "from": client,
                "to": server,
                "path": path,
                "expected_goodput_bps": shares[i],
                "goodput_bps": tcp_goodput(report),
                "retransmits": retransmits,
                "retransmit_ratio": retransmits as f64 / packets,
            })
        })
        .collect();
    let goodputs: Vec<f64> = flows
        .iter()
        .map(|f| f["goodput_bps"].as_f64().unwrap_or(0.0))
        .collect();
    let sum: f64 = goodputs.iter().sum();
    let squares: f64 = goodputs.iter().map(|g| g * g).sum();
    let jain = sum * sum / (goodputs.len() as f64 * squares);
    Ok(json!({
        "case": case.name,
        "generator": case.generator,
        "link": case.link,
        "seconds": secs,
        "agents": pids.len(),
        "agents_cpu_seconds": cpu,
        "link_goodput_bps": link_goodput,
        "tolerance": case.tolerance,
        "flows": flows,
        "jain_fairness": jain,
        "fidelity_episodes": episodes,
    }))
}

fn main() -> anyhow::Result<()> {
    let secs = bench::bench_secs(10);
    let provenance = bench::provenance("bench_fidelity");
    let rows = bench::with_env("bench-fidelity", |env| {
        CASES
            .iter()
            .map(|case| measure(env, case, secs).with_context(|| format!("case {}", case.name)))
            .collect::<anyhow::Result<Vec<_>>>()
    })?;

    println!(
        "| case | flow | goodput | expected (fair share) | retransmits | agents' CPU | guard |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (row, case) in rows.iter().zip(&CASES) {
        let episodes = row["fidelity_episodes"].as_array().map_or(0, Vec::len);
        for flow in row["flows"].as_array().into_iter().flatten() {
            let goodput = flow["goodput_bps"].as_f64().unwrap_or(f64::NAN);
            let expected = flow["expected_goodput_bps"].as_f64().unwrap_or(f64::NAN);
            let ratio = flow["retransmit_ratio"].as_f64().unwrap_or(f64::NAN);
            println!(
                "| {} | {} → {} | {:.1} Mbit/s ({:+.1}%) | {:.1} Mbit/s | {} ({:.3}%) | {:.1} s | {} |",
                case.name,
                flow["from"].as_str().unwrap_or("?"),
                flow["to"].as_str().unwrap_or("?"),
                goodput / 1e6,
                (goodput - expected) / expected * 100.0,
                expected / 1e6,
                flow["retransmits"],
                ratio * 100.0,
                row["agents_cpu_seconds"].as_f64().unwrap_or(f64::NAN),
                if episodes == 0 {
                    "faithful".to_owned()
                } else {
                    format!("{episodes} episode(s)")
                },
            );
            if let Some(max) = case.max_retransmit_ratio
                && (ratio.is_nan() || ratio > max)
            {
                println!(
                    "MISS: {} {} → {}: {:.3}% of data packets retransmitted, target < {:.1}%",
                    case.name,
                    flow["from"].as_str().unwrap_or("?"),
                    flow["to"].as_str().unwrap_or("?"),
                    ratio * 100.0,
                    max * 100.0
                );
            }
            // NaN (no measurement) is a miss too.
            if goodput.is_nan() || goodput < expected * (1.0 - case.tolerance) {
                println!(
                    "MISS: {} {} → {}: {:.1} Mbit/s, more than {:.0}% below its expected {:.1} Mbit/s{}",
                    case.name,
                    flow["from"].as_str().unwrap_or("?"),
                    flow["to"].as_str().unwrap_or("?"),
                    goodput / 1e6,
                    case.tolerance * 100.0,
                    expected / 1e6,
                    if episodes == 0 {
                        "; the fidelity guard said nothing"
                    } else {
                        "; the fidelity guard flagged the run"
                    }
                );
            }
        }
        for episode in row["fidelity_episodes"]
            .as_array()
            .into_iter()
            .flatten()
            .take(3)
        {
            println!("  guard: {}", episode.as_str().unwrap_or("?"));
        }
        if case.flows.len() > 1 {
            for flow in row["flows"].as_array().into_iter().flatten() {
                println!(
                    "  path {} → {}: {}",
                    flow["from"].as_str().unwrap_or("?"),
                    flow["to"].as_str().unwrap_or("?"),
                    flow["path"].as_array().map_or(String::new(), |p| p
                        .iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(" "))
                );
            }
            println!(
                "  {}: Jain's fairness over the flows {:.3}",
                case.name,
                row["jain_fairness"].as_f64().unwrap_or(f64::NAN)
            );
        }
    }
    bench::write_results(
        "fidelity",
        &json!({
            "benchmark": "fidelity",
            "provenance": provenance,
            "mtu": MTU,
            "rows": rows,
        }),
    )?;
    Ok(())
}
