//! Benchmark (issue 14.1): CPU per packet of a shaped hop.
//!
//! A 3-node line n0 – n1 – n2 carries one iperf3 TCP flow n0 → n2 for
//! `NEXTMINI_BENCH_SECS` (default 10) seconds, three times, one topology each:
//! - `unshaped`: no link parameters, the baseline measured in the same run (the
//!   agents pass the kernel's super-packets whole, so it is the floor);
//! - `plain`: 200 Mbit/s and 5 ms on every link;
//! - `impaired`: the same plus RED, WRR with two classes, 1 ms of jitter and
//!   1% loss.
//!
//! The agents' CPU is read from /proc/<pid>/stat (utime + stime, all threads)
//! just before and after the transfer; µs per packet per agent is that CPU ÷
//! the data packets (bytes iperf3 sent ÷ the MSS) ÷ the three agents, as in
//! the issue. ACKs are work too, but are not counted as packets. Targets: ≤ 3
//! µs plain, ≤ 5 µs impaired; a miss is printed, not fatal. Results go to
//! bench/results/shaped.json.
//!
//! `sudo NEXTMINI_BIN_DIR=$PWD/target/release cargo run --release -p nextmini-e2e --example bench_shaped`

use anyhow::Context;
use nextmini_e2e::bench::{self, interrupt};
use nextmini_e2e::{Env, agent_pids_of, all_acked, iperf3, tcp_goodput, tcp_payload_ratio};
use serde_json::json;
use std::time::Duration;

const MTU: u32 = 1400;
/// TCP payload of a full packet: MTU less IPv4, TCP and timestamp headers.
const MSS: u32 = MTU - 20 - 32;
const RATE_MBIT: u64 = 200;
const TARGET_PLAIN_US: f64 = 3.0;
const TARGET_IMPAIRED_US: f64 = 5.0;

struct Case {
    name: &'static str,
    /// YAML of `linkDefaults`, empty for none.
    link: &'static str,
    target_us: Option<f64>,
}

const CASES: [Case; 3] = [
    Case {
        name: "unshaped",
        link: "",
        target_us: None,
    },
    Case {
        name: "plain",
        link: "rate: 200Mbit\ndelay: 5ms\n",
        target_us: Some(TARGET_PLAIN_US),
    },
    Case {
        name: "impaired",
        link: "rate: 200Mbit\ndelay: 5ms\njitter: 1ms\nloss: 1%\nqueue:\n  limit: 300pkt\n  aqm:\n    red: {min: 30, max: 120, maxP: 10%, weight: 0.002}\nscheduler: {wrr: {weights: [3, 1]}}\nclasses:\n  - {queue: 0, dstPort: 5201}\n",
        target_us: Some(TARGET_IMPAIRED_US),
    },
];

fn manifest(topology: &str, link: &str) -> String {
    let mut out = format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata:\n  name: {topology}\nspec:\n  dataplane:\n    mtu: {MTU}\n  generator: {{line: {{nodes: 3}}}}\n"
    );
    if !link.is_empty() {
        out.push_str("  linkDefaults:\n");
        for line in link.lines() {
            out.push_str(&format!("    {line}\n"));
        }
    }
    out
}

/// `perf record -g` of the agents during the transfer, when
/// NEXTMINI_BENCH_PERF names a directory for the profiles (`perf report -i`).
/// Stopped with SIGINT on drop, so perf writes its file.
struct Profiler {
    child: std::process::Child,
    registration: interrupt::Registration,
}

impl Profiler {
    fn start(dir: &std::path::Path, case: &str, pids: &[i32]) -> anyhow::Result<Profiler> {
        std::fs::create_dir_all(dir)?;
        let pids: Vec<String> = pids.iter().map(i32::to_string).collect();
        let child = std::process::Command::new("perf")
            .args(["record", "-g", "-F", "999", "-o"])
            .arg(dir.join(format!("{case}.perf.data")))
            .args(["-p", &pids.join(",")])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let pid = child.id() as i32;
        let registration = interrupt::on_interrupt(move || nextmini_e2e::kill9(pid));
        // perf needs a moment to attach before the transfer starts.
        std::thread::sleep(Duration::from_millis(500));
        Ok(Profiler {
            child,
            registration,
        })
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        );
        let _ = self.child.wait();
        interrupt::forget(self.registration);
    }
}

fn measure(env: &mut Env, case: &Case, secs: u64) -> anyhow::Result<serde_json::Value> {
    let topology = format!("shaped-{}", case.name);
    let file = env.state_dir.join(format!("{topology}.yaml"));
    std::fs::write(&file, manifest(&topology, case.link))?;
    env.ok(&["up", "-f", file.to_str().expect("UTF-8 path")]);
    env.wait_for("agents to apply", Duration::from_secs(30), || {
        all_acked(env, &topology)
    });
    // One test, then the server exits by itself.
    env.spawn_in("n2", &["iperf3", "-s", "-1", "-p", "5201"]);
    env.wait_for("iperf3 server", Duration::from_secs(10), || {
        env.exec("n2", &["sh", "-c", "ss -ltn | grep -q ':5201 '"])
            .status
            .success()
    });
    let pids = agent_pids_of(&topology);
    anyhow::ensure!(
        pids.len() == 3,
        "expected 3 agents of {topology}, found {}",
        pids.len()
    );
    let profiler = match std::env::var_os("NEXTMINI_BENCH_PERF") {
        Some(dir) => Some(Profiler::start(
            std::path::Path::new(&dir),
            case.name,
            &pids,
        )?),
        None => None,
    };
    let before = bench::cpu_seconds(&pids)?;
    let report = iperf3(
        env,
        "n0",
        &["-c", "n2", "-p", "5201", "-t", &secs.to_string()],
    );
    let after = bench::cpu_seconds(&pids)?;
    drop(profiler);
    env.ok(&["down", &topology]);

    let sent = &report["end"]["sum_sent"];
    let bytes = sent["bytes"].as_f64().unwrap_or(f64::NAN);
    let retransmits = sent["retransmits"].as_u64().unwrap_or(0);
    let goodput = tcp_goodput(&report);
    let packets = bytes / f64::from(MSS);
    let cpu = after - before;
    let us_per_packet = cpu * 1e6 / packets / pids.len() as f64;
    let expected = match case.link {
        "" => None,
        _ => Some(RATE_MBIT as f64 * 1e6 * tcp_payload_ratio(MTU)),
    };
    eprintln!(
        "{:<9} {:>7.1} Mbit/s (expected {}), {retransmits} retransmits, {packets:.0} data packets, agents' CPU {cpu:.2} s: {us_per_packet:.2} µs/packet/agent",
        case.name,
        goodput / 1e6,
        expected.map_or("-".to_string(), |e| format!("{:.1}", e / 1e6)),
    );
    Ok(json!({
        "case": case.name,
        "link": case.link,
        "seconds": secs,
        "goodput_bps": goodput,
        "expected_goodput_bps": expected,
        "retransmits": retransmits,
        "data_packets": packets.round() as u64,
        "agents": pids.len(),
        "agents_cpu_seconds": cpu,
        "us_per_packet_per_agent": us_per_packet,
        "target_us": case.target_us,
    }))
}

fn main() -> anyhow::Result<()> {
    let secs = bench::bench_secs(10);
    let provenance = bench::provenance("bench_shaped");
    let rows = bench::with_env("bench-shaped", |env| {
        CASES
            .iter()
            .map(|case| measure(env, case, secs).with_context(|| format!("case {}", case.name)))
            .collect::<anyhow::Result<Vec<_>>>()
    })?;

    let us = |name: &str| {
        rows.iter()
            .find(|r| r["case"] == name)
            .and_then(|r| r["us_per_packet_per_agent"].as_f64())
            .unwrap_or(f64::NAN)
    };
    println!(
        "| case | goodput | expected | retransmits | data packets | agents' CPU | µs/packet/agent | target |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {:.1} Mbit/s | {} | {} | {} | {:.2} s | {:.2} | {} |",
            r["case"].as_str().unwrap_or("?"),
            r["goodput_bps"].as_f64().unwrap_or(f64::NAN) / 1e6,
            r["expected_goodput_bps"]
                .as_f64()
                .map_or("-".into(), |e| format!("{:.1} Mbit/s", e / 1e6)),
            r["retransmits"],
            r["data_packets"],
            r["agents_cpu_seconds"].as_f64().unwrap_or(f64::NAN),
            r["us_per_packet_per_agent"].as_f64().unwrap_or(f64::NAN),
            r["target_us"]
                .as_f64()
                .map_or("-".into(), |t| format!("≤ {t} µs")),
        );
    }
    for case in &CASES {
        if let Some(target) = case.target_us {
            let got = us(case.name);
            // NaN (no measurement) is a miss too.
            if got.is_nan() || got > target {
                println!(
                    "MISS: {} costs {got:.2} µs of CPU per packet per agent, target ≤ {target} µs ({:.1}× the unshaped baseline of {:.2} µs)",
                    case.name,
                    got / us("unshaped"),
                    us("unshaped")
                );
            }
        }
    }
    bench::write_results(
        "shaped",
        &json!({
            "benchmark": "shaped",
            "provenance": provenance,
            "topology": "line of 3 nodes, iperf3 TCP n0 -> n2",
            "mtu": MTU,
            "baseline": "unshaped",
            "targets_us": {"plain": TARGET_PLAIN_US, "impaired": TARGET_IMPAIRED_US},
            "rows": rows,
        }),
    )?;
    Ok(())
}
