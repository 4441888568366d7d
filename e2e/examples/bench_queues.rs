//! Benchmark (issue 18.5): Flexplane's queue-occupancy experiment (seed 003,
//! table 2) on Nextmini's emulated queues. Five senders reach one receiver
//! through a switch; the switch's link to the receiver is the bottleneck
//! (`NEXTMINI_QUEUES_RATE`, default 100 Mbit/s, 1 ms). Five iperf3 TCP flows
//! (kernel CUBIC with ECN negotiated: this kernel has no DCTCP) run for
//! `NEXTMINI_BENCH_SECS` (default 15) seconds under each queue:
//! - DropTail, 1,024 packets;
//! - RED, min 150, max 300, maxP 0.1 (weight 0.002, dropping);
//! - ECN marking above 65 packets (DCTCP-style threshold marking).
//!
//! The switch agent's queue depth (`nextmini_link_queue_packets` of the
//! bottleneck) is sampled every 5 ms from its metrics socket after the first
//! 3 s; the median and p99 are printed with pass/miss lines for Flexplane's
//! ordering (DropTail ≫ RED > ECN) and ECN's median within 50% of its
//! threshold. Results go to bench/results/queues.json.
//!
//! `sudo NEXTMINI_BIN_DIR=$PWD/target/release cargo run --release -p nextmini-e2e --example bench_queues`

use anyhow::{Context, bail};
use nextmini_e2e::bench;
use nextmini_e2e::{Env, iperf3, tcp_goodput};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const TOPOLOGY: &str = "queues";
const SENDERS: usize = 5;
const ECN_THRESHOLD: f64 = 65.0;
const WARM_UP: Duration = Duration::from_secs(3);
const SAMPLE_EVERY: Duration = Duration::from_millis(5);
/// Socket buffers for both ends of each flow, so that only congestion control
/// limits the window (Flexplane's senders are window-unlimited too). CUBIC is
/// asked for by name: this machine's default is BBR, which bounds what it has
/// in flight to about twice the BDP and ignores ECN, so no queue ever filled
/// (0 drops under DropTail, 71,573 ECN marks ignored, about 110 packets queued
/// under every scheme).
const WINDOW: &str = "4M";

struct Case {
    name: &'static str,
    queue: &'static str,
}

const CASES: [Case; 3] = [
    Case {
        name: "droptail",
        queue: "{limit: 1024pkt}",
    },
    Case {
        name: "red",
        queue: "{limit: 1024pkt, aqm: {red: {min: 150, max: 300, maxP: 10%, weight: 0.002, ecn: false}}}",
    },
    Case {
        name: "ecn",
        queue: "{limit: 1024pkt, aqm: {ecn: {threshold: 65}}}",
    },
];

fn manifest(rate: &str, queue: &str) -> String {
    let mut nodes = String::from("    - name: sw\n    - name: r\n");
    let mut links = format!(
        "    - endpoints: [sw, r]\n      forward: {{rate: {rate}, delay: 1ms, queue: {queue}}}\n"
    );
    for i in 1..=SENDERS {
        nodes.push_str(&format!("    - name: s{i}\n"));
        links.push_str(&format!("    - endpoints: [s{i}, sw]\n"));
    }
    format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata:\n  name: {TOPOLOGY}\nspec:\n  nodes:\n{nodes}  links:\n{links}"
    )
}

/// The bottleneck's queue depth from the switch agent's metrics socket, without
/// starting a process per sample.
fn queue_depth(socket: &Path) -> anyhow::Result<f64> {
    let mut stream = UnixStream::connect(socket).context("metrics socket")?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: agent\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    text.lines()
        .find(|l| l.starts_with("nextmini_link_queue_packets{") && l.contains("link=\"sw-r\""))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .context("no queue depth of sw-r in the switch's metrics")
}

/// Drops and marks so far, summed over the topology's link directions: those
/// of the bottleneck (sw → r) and those anywhere else.
fn drops(env: &Env) -> Value {
    let rows = env.psql(&format!(
        "SELECT c.link = 'sw-r' AND c.node = 'sw', sum(c.drops_queue), sum(c.drops_aqm), \
         sum(c.ecn_marks), sum(c.drops) FROM link_counters c JOIN topologies t ON t.id = c.topology_id \
         WHERE t.name = '{TOPOLOGY}' GROUP BY 1"
    ));
    let mut out = json!({});
    for line in rows.lines() {
        let cols: Vec<i64> = line
            .split('|')
            .skip(1)
            .filter_map(|c| c.trim().parse().ok())
            .collect();
        let key = if line.starts_with('t') {
            "bottleneck"
        } else {
            "elsewhere"
        };
        if let [queue, aqm, marks, handoff] = cols[..] {
            out[key] =
                json!({"queue_full": queue, "aqm": aqm, "ecn_marks": marks, "handoff": handoff});
        }
    }
    out
}

fn measure(env: &mut Env, case: &Case, rate: &str, secs: u64) -> anyhow::Result<Value> {
    env.apply_yaml(TOPOLOGY, &manifest(rate, case.queue));
    let drops_before = drops(env);
    let socket = env.state_dir.join(format!("metrics/{TOPOLOGY}/sw.sock"));
    let done = AtomicBool::new(false);
    let (samples, reports) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let start = Instant::now();
            let mut samples = Vec::new();
            while !done.load(Ordering::Relaxed) {
                if start.elapsed() >= WARM_UP
                    && let Ok(depth) = queue_depth(&socket)
                {
                    samples.push(depth);
                }
                std::thread::sleep(SAMPLE_EVERY);
            }
            samples
        });
        let env = &*env;
        let clients: Vec<_> = (1..=SENDERS)
            .map(|i| {
                s.spawn(move || {
                    let port = (5200 + i).to_string();
                    let t = secs.to_string();
                    iperf3(
                        env,
                        &format!("s{i}"),
                        &[
                            "-c", "r", "-p", &port, "-t", &t, "-w", WINDOW, "-C", "cubic",
                        ],
                    )
                })
            })
            .collect();
        let reports: Vec<Value> = clients.into_iter().filter_map(|c| c.join().ok()).collect();
        done.store(true, Ordering::Relaxed);
        (sampler.join().unwrap_or_default(), reports)
    });
    if reports.len() != SENDERS {
        bail!("{} of {SENDERS} iperf3 clients finished", reports.len());
    }
    if samples.len() < 100 {
        bail!("only {} queue samples", samples.len());
    }
    let mut sorted = samples.clone();
    sorted.sort_by(f64::total_cmp);
    let goodput: f64 = reports.iter().map(tcp_goodput).sum();
    // The last report window's counters.
    std::thread::sleep(Duration::from_millis(1500));
    let drops_after = drops(env);
    Ok(json!({
        "case": case.name,
        "queue": case.queue,
        "samples": samples.len(),
        "median_packets": bench::percentile(&sorted, 0.5),
        "p99_packets": bench::percentile(&sorted, 0.99),
        "goodput_bps": goodput,
        "retransmits": reports.iter().map(|r| r["end"]["sum_sent"]["retransmits"].as_i64().unwrap_or(0)).sum::<i64>(),
        "counters_before": drops_before,
        "counters_after": drops_after,
    }))
}

fn main() -> anyhow::Result<()> {
    let secs = bench::bench_secs(15);
    let rate = std::env::var("NEXTMINI_QUEUES_RATE").unwrap_or_else(|_| "100Mbit".into());
    let provenance = bench::provenance("bench_queues");
    let rows = bench::with_env("bench-queues", |env| {
        env.apply_yaml(TOPOLOGY, &manifest(&rate, CASES[0].queue));
        for i in 1..=SENDERS {
            let port = (5200 + i).to_string();
            env.spawn_in("r", &["iperf3", "-s", "-p", &port]);
        }
        for node in (1..=SENDERS).map(|i| format!("s{i}")).chain(["r".into()]) {
            let out = env.exec(&node, &["sysctl", "-qw", "net.ipv4.tcp_ecn=1"]);
            if !out.status.success() {
                bail!("enabling ECN in {node}");
            }
        }
        std::thread::sleep(Duration::from_secs(1));
        let mut rows = Vec::new();
        for case in &CASES {
            eprintln!("== {}: {}", case.name, case.queue);
            rows.push(measure(env, case, &rate, secs).with_context(|| case.name)?);
        }
        Ok(rows)
    })?;

    println!("| queue | median occupancy | p99 occupancy | goodput (5 flows) |");
    println!("|---|---|---|---|");
    for row in &rows {
        println!(
            "| {} `{}` | {} pkt | {} pkt | {:.1} Mbit/s |",
            row["case"].as_str().unwrap_or("?"),
            row["queue"].as_str().unwrap_or("?"),
            row["median_packets"],
            row["p99_packets"],
            row["goodput_bps"].as_f64().unwrap_or(f64::NAN) / 1e6
        );
    }
    let median = |i: usize| rows[i]["median_packets"].as_f64().unwrap_or(f64::NAN);
    let (droptail, red, ecn) = (median(0), median(1), median(2));
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    println!(
        "{}: DropTail ≫ RED > ECN by median: {droptail} ≥ 2 × {red} and {red} > {ecn}",
        verdict(droptail >= 2.0 * red && red > ecn)
    );
    println!(
        "{}: ECN's median {ecn} within 50% of its threshold {ECN_THRESHOLD}",
        verdict((ecn - ECN_THRESHOLD).abs() <= 0.5 * ECN_THRESHOLD)
    );
    let path = bench::write_results(
        "queues",
        &json!({ "provenance": provenance, "rate": rate, "seconds": secs, "cases": rows }),
    )?;
    println!("results: {}", path.display());
    Ok(())
}
