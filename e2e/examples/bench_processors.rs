//! Benchmark (issue 21, item 5; the Nextmini paper's Fig. 4): TCP throughput
//! through a 3-node line (one transit node) against the number of processor
//! tasks per agent and the number of parallel flows, with both mappings.
//! Unshaped links, TUN path, kernel TCP (iperf3 -P). Also records how the
//! transit node's processors shared the packets, so a figure that does not
//! grow with processors can be told from one whose processors sat idle.
//!
//! `sudo NEXTMINI_BIN_DIR=$PWD/target/release cargo run --release -p nextmini-e2e --example bench_processors -- 1 2 4`
//! Results: bench/results/processors.json.

use nextmini_e2e::bench::{self, interrupt};
use nextmini_e2e::{Env, all_acked, iperf3, tcp_goodput};
use serde_json::json;
use std::time::Duration;

const FLOWS: [u32; 4] = [1, 2, 4, 8];
const TOPOLOGY: &str = "bench-procs";

fn up(env: &Env, processors: u32, mapping: &str) {
    let path = env.state_dir.join("procs.yaml");
    std::fs::write(
        &path,
        format!(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: {TOPOLOGY}}}\nspec:\n  \
             dataplane: {{processors: {processors}, mapping: {mapping}}}\n  generator: {{line: {{nodes: 3}}}}\n"
        ),
    )
    .expect("manifest");
    env.ok(&["up", "-f", path.to_str().expect("UTF-8 path")]);
    env.wait_for("every agent acknowledged", Duration::from_secs(60), || {
        all_acked(env, TOPOLOGY)
    });
}

/// Packets each processor of `node` handled so far, from its metrics socket.
fn processed(env: &Env, node: &str) -> Vec<u64> {
    env.agent_metrics(TOPOLOGY, node)
        .lines()
        .filter(|l| l.starts_with("nextmini_agent_processor_packets_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .collect()
}

fn main() -> anyhow::Result<()> {
    let counts: Vec<u32> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("processor counts must be numbers: {e}"))?;
    let counts = if counts.is_empty() {
        vec![1, 2, 4]
    } else {
        counts
    };
    let provenance = bench::provenance("bench_processors");
    let mut env = Env::new("bench-procs");
    // `down` stops every process in the topology's namespaces, iperf3 included.
    let down = std::sync::Mutex::new(env.command(&["down"]));
    let guard = interrupt::on_interrupt(move || {
        let _ = down.lock().map(|mut c| c.output());
    });
    let mut rows = Vec::new();
    println!("| mapping | processors | flows | goodput | transit node's packets per processor |");
    println!("|---|---|---|---|---|");
    for mapping in ["sequential", "concurrent"] {
        for &p in &counts {
            up(&env, p, mapping);
            env.spawn_in("n2", &["iperf3", "-s", "-p", "5201"]);
            env.wait_for("iperf3 server", Duration::from_secs(10), || {
                env.exec("n2", &["sh", "-c", "ss -ltn | grep -q ':5201 '"])
                    .status
                    .success()
            });
            for flows in FLOWS {
                let before = processed(&env, "n1");
                let report = iperf3(
                    &env,
                    "n0",
                    &["-c", "n2", "-P", &flows.to_string(), "-t", "4", "-O", "1"],
                );
                let goodput = tcp_goodput(&report);
                let after = processed(&env, "n1");
                let share: Vec<u64> = after
                    .iter()
                    .zip(before.iter().chain(std::iter::repeat(&0)))
                    .map(|(a, b)| a.saturating_sub(*b))
                    .collect();
                println!(
                    "| {mapping} | {p} | {flows} | {:.2} Gbit/s | {share:?} |",
                    goodput / 1e9
                );
                rows.push(json!({
                    "mapping": mapping, "processors": p, "flows": flows,
                    "goodput_bps": goodput, "transit_packets_per_processor": share,
                }));
            }
            env.ok(&["down", TOPOLOGY]);
        }
    }
    drop(env);
    interrupt::forget(guard);
    bench::write_results(
        "processors",
        &json!({"benchmark": "processors", "provenance": provenance, "runs": rows}),
    )?;
    Ok(())
}
