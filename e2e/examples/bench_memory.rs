//! Benchmark (issue 7, 3b): memory of an agent, idle and with 10 links.
//!
//! - `idle`: the only node of topology `bench-mem-idle`; no links, no traffic;
//! - `star_center`: n0 of `bench-mem-star` (`generator: {star: {nodes: 11}}`),
//!   the end of 10 links, after every link is connected and n0 has pinged each
//!   leaf once (so every link's path has carried packets);
//! - `star_leaf`: the leaves of the same star (one link each), as the median.
//!
//! Each figure is the median of 5 samples 1 s apart, taken 3 s after the agents
//! acknowledged their snapshot: RSS from /proc/PID/status, PSS from
//! /proc/PID/smaps_rollup (pages shared with the other agents, such as the
//! binary's code, counted in proportion). Also stored: resident memory per kind
//! of mapping, which says where the memory is. Results: bench/results/memory.json.
//!
//! `sudo NEXTMINI_BIN_DIR=$PWD/target/release cargo run --release -p nextmini-e2e --example bench_memory`

use nextmini_e2e::bench::{self, Memory, interrupt};
use nextmini_e2e::{Env, all_acked};
use serde_json::json;
use std::time::Duration;

const TARGET_IDLE_RSS: u64 = 2 * 1024 * 1024;

fn pid_of(env: &Env, topology: &str, node: &str) -> i32 {
    env.psql(&format!(
        "SELECT n.pid FROM nodes n JOIN topologies t ON t.id = n.topology_id \
         WHERE t.name = '{topology}' AND n.name = '{node}'"
    ))
    .parse()
    .unwrap_or_else(|_| panic!("no pid recorded for {topology}/{node}"))
}

/// Median of 5 samples, 1 s apart, of each of the processes' memory.
fn sample(pids: &[i32]) -> anyhow::Result<Vec<Memory>> {
    let mut samples: Vec<Vec<Memory>> = vec![Vec::new(); pids.len()];
    for round in 0..5 {
        if round > 0 {
            std::thread::sleep(Duration::from_secs(1));
        }
        for (i, pid) in pids.iter().enumerate() {
            samples[i].push(bench::memory_of(*pid)?);
        }
    }
    Ok(samples.iter().map(|s| Memory::median(s)).collect())
}

fn breakdown(pid: i32) -> anyhow::Result<serde_json::Value> {
    Ok(serde_json::to_value(bench::rss_by_mapping(pid)?)?)
}

fn up(env: &Env, topology: &str, body: &str) {
    let path = env.state_dir.join(format!("{topology}.yaml"));
    std::fs::write(
        &path,
        format!("apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: {topology}}}\nspec:\n{body}"),
    )
    .expect("manifest");
    env.ok(&["up", "-f", path.to_str().expect("UTF-8 path")]);
    env.wait_for("every agent acknowledged", Duration::from_secs(60), || {
        all_acked(env, topology)
    });
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / 1048576.0)
}

fn main() -> anyhow::Result<()> {
    let provenance = bench::provenance("bench_memory");
    let env = Env::new("bench-mem");
    let down = std::sync::Mutex::new(env.command(&["down"]));
    let guard = interrupt::on_interrupt(move || {
        let _ = down.lock().map(|mut c| c.output());
    });

    up(&env, "bench-mem-idle", "  nodes:\n    - name: n0\n");
    std::thread::sleep(Duration::from_secs(3));
    let idle_pid = pid_of(&env, "bench-mem-idle", "n0");
    let idle = sample(&[idle_pid])?[0];
    let idle_breakdown = breakdown(idle_pid)?;
    env.ok(&["down", "bench-mem-idle"]);

    up(&env, "bench-mem-star", "  generator: {star: {nodes: 11}}\n");
    env.wait_for("all 10 links connected", Duration::from_secs(60), || {
        env.psql(
            "SELECT count(*) FROM link_counters c JOIN topologies t ON t.id = c.topology_id \
             WHERE t.name = 'bench-mem-star' AND c.node = 'n0' AND c.connected",
        ) == "10"
    });
    for leaf in 1..=10 {
        let out = env.exec(
            "n0",
            &["ping", "-q", "-c", "1", "-W", "2", &format!("n{leaf}")],
        );
        anyhow::ensure!(out.status.success(), "n0 cannot ping n{leaf}");
    }
    std::thread::sleep(Duration::from_secs(3));
    let center_pid = pid_of(&env, "bench-mem-star", "n0");
    let leaf_pids: Vec<i32> = (1..=10)
        .map(|i| pid_of(&env, "bench-mem-star", &format!("n{i}")))
        .collect();
    let mut pids = vec![center_pid];
    pids.extend(&leaf_pids);
    let star = sample(&pids)?;
    let center = star[0];
    let leaves = &star[1..];
    let leaf = Memory::median(leaves);
    let center_breakdown = breakdown(center_pid)?;
    drop(env);
    interrupt::forget(guard);

    println!("| agent | RSS | PSS | anonymous RSS | threads |");
    println!("|---|---|---|---|---|");
    for (name, m) in [
        ("idle (no links)", idle),
        ("star centre (10 links)", center),
        ("star leaf (1 link, median)", leaf),
    ] {
        println!(
            "| {name} | {} | {} | {} | {} |",
            mib(m.rss),
            mib(m.pss),
            mib(m.rss_anon),
            m.threads
        );
    }
    println!(
        "idle RSS target ≤ 2 MiB: {}",
        if idle.rss <= TARGET_IDLE_RSS {
            "met"
        } else {
            "missed"
        }
    );
    bench::write_results(
        "memory",
        &json!({
            "benchmark": "memory",
            "provenance": provenance,
            "targets": {"idle_rss_bytes": TARGET_IDLE_RSS},
            "agents": {
                "idle": idle,
                "star_center": center,
                "star_leaf": leaf,
            },
            "rss_by_mapping": {
                "idle": idle_breakdown,
                "star_center": center_breakdown,
            },
        }),
    )?;
    Ok(())
}
