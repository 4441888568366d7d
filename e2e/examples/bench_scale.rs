//! Benchmark (issue 7, 3c and 3d): start-up of large topologies in namespace
//! mode, and a control change fanning out to every agent.
//!
//! Start-up: for each size N (default 100, 500 and 1,000), `nextmini up` of
//! `bench-scale-<N>` (`generator: {line: {nodes: N}}`), timed from the start of
//! `up` until it returns, which is when every agent has acknowledged its
//! snapshot. While it runs, the harness samples every 100 ms how many of the
//! topology's namespaces exist, how many agents have a recorded pid (the
//! runtime finished starting them), are connected to the hub, and have
//! acknowledged, which splits the time into phases. `up` runs on a
//! pseudo-terminal (`script`), as in a user's shell, so its progress bars draw;
//! the harness reads them and records how often each bar moved and its longest
//! standstill. One single-node topology stays up throughout, so PostgreSQL and
//! the hub are already running, as they are for a user's second topology.
//! Memory of all N agents (RSS and PSS) is recorded too.
//!
//! Fan-out, on the largest topology: `NEXTMINI_BENCH_FANOUT` (default 10)
//! UPDATEs of one link's `params_forward` (a rate change of a link in the
//! middle), each in its own transaction. The generation the change makes is
//! read inside the transaction; the time runs from `COMMIT` returning until
//! the `nodes` table shows every agent's acknowledgement of that generation
//! (polled every 2 ms on a second connection). Agents acknowledge to the hub,
//! which writes each acknowledgement, so this is what a control script
//! waiting on the table would see.
//!
//! Results: bench/results/startup.json and bench/results/fanout.json.
//!
//! `sudo NEXTMINI_BIN_DIR=$PWD/target/release cargo run --release -p nextmini-e2e --example bench_scale -- 100 500 1000`

use nextmini_e2e::bench::{self, Memory, interrupt, median};
use nextmini_e2e::{Env, namespaces_of};
use serde_json::json;
use sqlx::Row;
use std::io::Read;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KEEP: &str = "bench-scale-keep";

#[derive(Clone, Copy, Default, serde::Serialize)]
struct Sample {
    t: f64,
    namespaces: i64,
    pids: i64,
    connected: i64,
    acked: i64,
}

/// What `up` wrote to its terminal, each chunk with the time it was read.
type Chunks = Vec<(f64, Vec<u8>)>;

/// One redraw of a progress bar: when, which bar, its position.
struct BarUpdate {
    t: f64,
    bar: String,
    pos: u64,
}

/// Splits what `up` wrote to its terminal into redraws (`\r`, `\n`, escape
/// sequences) and keeps those of the bars `<topology>: <what> [====> ] pos/len`.
fn bar_updates(chunks: &Chunks, topology: &str) -> Vec<BarUpdate> {
    let mut out = Vec::new();
    for (t, bytes) in chunks {
        let text = String::from_utf8_lossy(bytes);
        let mut clean = String::with_capacity(text.len());
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\x1b' {
                // CSI: ESC [ params final-byte
                if chars.peek() == Some(&'[') {
                    chars.next();
                    for d in chars.by_ref() {
                        if ('@'..='~').contains(&d) {
                            break;
                        }
                    }
                }
                clean.push('\n');
            } else if c == '\r' {
                clean.push('\n');
            } else {
                clean.push(c);
            }
        }
        for line in clean.lines() {
            let Some(rest) = line.trim().strip_prefix(&format!("{topology}: ")) else {
                continue;
            };
            let Some((bar, after)) = rest.split_once(" [") else {
                continue;
            };
            let Some(pos) = after
                .split_once("] ")
                .and_then(|(_, tail)| tail.split('/').next())
                .and_then(|p| p.trim().parse().ok())
            else {
                continue;
            };
            out.push(BarUpdate {
                t: *t,
                bar: bar.to_string(),
                pos,
            });
        }
    }
    out
}

/// Per bar: how many redraws moved it, and the longest time it stood still
/// between its first and last redraw.
fn bar_summary(updates: &[BarUpdate]) -> serde_json::Value {
    let mut bars: Vec<String> = Vec::new();
    for u in updates {
        if !bars.contains(&u.bar) {
            bars.push(u.bar.clone());
        }
    }
    bars.iter()
        .map(|bar| {
            let mine: Vec<&BarUpdate> = updates.iter().filter(|u| &u.bar == bar).collect();
            let mut moves = 0;
            let mut longest_still = 0.0f64;
            let mut last_move_t = mine.first().map_or(0.0, |u| u.t);
            let mut last_pos = mine.first().map_or(0, |u| u.pos);
            for u in &mine {
                if u.pos != last_pos {
                    moves += 1;
                    longest_still = longest_still.max(u.t - last_move_t);
                    last_move_t = u.t;
                    last_pos = u.pos;
                }
            }
            json!({
                "bar": bar,
                "redraws": mine.len(),
                "moves": moves,
                "first_seen_s": mine.first().map(|u| u.t),
                "last_seen_s": mine.last().map(|u| u.t),
                "last_position": last_pos,
                "longest_standstill_s": longest_still,
            })
        })
        .collect()
}

fn manifest_line(topology: &str, nodes: usize) -> String {
    format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: {topology}}}\nspec:\n  generator: {{line: {{nodes: {nodes}}}}}\n"
    )
}

async fn sample(pool: &sqlx::PgPool, topology: &str, t: f64) -> Sample {
    let row = sqlx::query(
        "SELECT count(*) AS total, count(n.pid) AS pids, \
                count(*) FILTER (WHERE n.agent_state = 'connected') AS connected, \
                count(*) FILTER (WHERE n.agent_state = 'connected' AND n.acked_generation >= t.generation) AS acked \
         FROM nodes n JOIN topologies t ON t.id = n.topology_id WHERE t.name = $1",
    )
    .bind(topology)
    .fetch_one(pool)
    .await;
    let (pids, connected, acked) = match row {
        Ok(r) => (r.get("pids"), r.get("connected"), r.get("acked")),
        Err(_) => (0, 0, 0),
    };
    Sample {
        t,
        namespaces: namespaces_of(topology).len() as i64,
        pids,
        connected,
        acked,
    }
}

/// The first time `field` reached `n`.
fn reached(samples: &[Sample], n: i64, field: fn(&Sample) -> i64) -> Option<f64> {
    samples.iter().find(|s| field(s) >= n).map(|s| s.t)
}

async fn agent_memory(pool: &sqlx::PgPool, topology: &str) -> anyhow::Result<serde_json::Value> {
    let pids: Vec<i32> = sqlx::query_scalar(
        "SELECT n.pid FROM nodes n JOIN topologies t ON t.id = n.topology_id \
         WHERE t.name = $1 AND n.pid IS NOT NULL",
    )
    .bind(topology)
    .fetch_all(pool)
    .await?;
    let all: Vec<Memory> = pids
        .iter()
        .filter_map(|p| bench::memory_of(*p).ok())
        .collect();
    let total = |f: fn(&Memory) -> u64| all.iter().map(f).sum::<u64>();
    Ok(json!({
        "agents": all.len(),
        "median": Memory::median(&all),
        "total_rss_bytes": total(|m| m.rss),
        "total_pss_bytes": total(|m| m.pss),
    }))
}

async fn startup(
    env: &Env,
    pool: &sqlx::PgPool,
    nodes: usize,
) -> anyhow::Result<serde_json::Value> {
    let topology = format!("bench-scale-{nodes}");
    let file = env.state_dir.join(format!("{topology}.yaml"));
    std::fs::write(&file, manifest_line(&topology, nodes))?;
    let up = env.command(&[
        "up",
        "-f",
        file.to_str().expect("UTF-8 path"),
        "--timeout-secs",
        "900",
    ]);
    // The same command on a pseudo-terminal, so indicatif draws its bars.
    let shell_command = std::iter::once(up.get_program())
        .chain(up.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let mut script = std::process::Command::new("script");
    script
        .args(["-qefc", &shell_command, "/dev/null"])
        .env("COLUMNS", "120")
        .env("LINES", "40")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in up.get_envs() {
        match v {
            Some(v) => script.env(k, v),
            None => script.env_remove(k),
        };
    }
    let started = Instant::now();
    let mut child = script.spawn()?;
    let child_pid = child.id() as i32;
    let stop_up = interrupt::on_interrupt(move || nextmini_e2e::kill9(child_pid));
    let chunks: Arc<Mutex<Chunks>> = Arc::default();
    let mut stdout = child.stdout.take().expect("piped stdout");
    let reader = {
        let chunks = chunks.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let t = started.elapsed().as_secs_f64();
                if let Ok(mut c) = chunks.lock() {
                    c.push((t, buf[..n].to_vec()));
                }
            }
        })
    };
    let mut samples = Vec::new();
    let status = loop {
        samples.push(sample(pool, &topology, started.elapsed().as_secs_f64()).await);
        if let Some(status) = child.try_wait()? {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let up_seconds = started.elapsed().as_secs_f64();
    interrupt::forget(stop_up);
    let _ = reader.join();
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    let chunks = chunks.lock().map(|c| c.clone()).unwrap_or_default();
    let output: Vec<u8> = chunks.iter().flat_map(|(_, b)| b.clone()).collect();
    if !status.success() {
        anyhow::bail!(
            "nextmini up of {nodes} nodes failed ({status}):\n{}\n{stderr}",
            String::from_utf8_lossy(&output)
        );
    }
    samples.push(sample(pool, &topology, up_seconds).await);
    let bars = bar_summary(&bar_updates(&chunks, &topology));
    let memory = agent_memory(pool, &topology).await?;
    let n = nodes as i64;
    let phases = json!({
        "all_namespaces_s": reached(&samples, n, |s| s.namespaces),
        "all_agents_started_s": reached(&samples, n, |s| s.pids),
        "all_connected_s": reached(&samples, n, |s| s.connected),
        "all_acknowledged_s": reached(&samples, n, |s| s.acked),
        "up_returned_s": up_seconds,
    });
    let output_lines = String::from_utf8_lossy(&output)
        .split(['\n', '\r'])
        .filter(|l| !l.trim().is_empty())
        .count();
    eprintln!("{nodes} nodes: up in {up_seconds:.1} s; phases {phases}; bars {bars}");
    let thinned: Vec<Sample> = samples.iter().step_by(5).copied().collect();
    Ok(json!({
        "nodes": nodes,
        "topology": topology,
        "up_seconds": up_seconds,
        "phases": phases,
        "progress_bars": bars,
        "terminal_lines_written": output_lines,
        "agent_memory": memory,
        "timeline": thinned,
    }))
}

async fn fanout(
    pool: &sqlx::PgPool,
    topology: &str,
    changes: usize,
) -> anyhow::Result<serde_json::Value> {
    let (topology_id, agents): (i64, i64) = {
        let row = sqlx::query(
            "SELECT t.id, (SELECT count(*) FROM nodes n WHERE n.topology_id = t.id) AS agents \
             FROM topologies t WHERE t.name = $1",
        )
        .bind(topology)
        .fetch_one(pool)
        .await?;
        (row.get("id"), row.get("agents"))
    };
    let link: String = sqlx::query_scalar(
        "SELECT name FROM links WHERE topology_id = $1 ORDER BY name OFFSET $2 LIMIT 1",
    )
    .bind(topology_id)
    .bind(agents / 2)
    .fetch_one(pool)
    .await?;
    let mut watcher = pool.acquire().await?;
    let mut results = Vec::new();
    for i in 0..changes {
        let rate: i64 = if i % 2 == 0 { 400_000_000 } else { 500_000_000 };
        let mut tx = pool.begin().await?;
        sqlx::query(
            "UPDATE links SET params_forward = params_forward || jsonb_build_object('rate_bps', $1::bigint) \
             WHERE topology_id = $2 AND name = $3",
        )
        .bind(rate)
        .bind(topology_id)
        .bind(&link)
        .execute(&mut *tx)
        .await?;
        let generation: i64 = sqlx::query_scalar("SELECT generation FROM topologies WHERE id = $1")
            .bind(topology_id)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        let committed = Instant::now();
        let (mut first, mut half, mut p99) = (None, None, None);
        let all = loop {
            let acked: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM nodes WHERE topology_id = $1 AND acked_generation >= $2",
            )
            .bind(topology_id)
            .bind(generation)
            .fetch_one(&mut *watcher)
            .await?;
            let ms = committed.elapsed().as_secs_f64() * 1e3;
            if acked >= 1 && first.is_none() {
                first = Some(ms);
            }
            if acked * 2 >= agents && half.is_none() {
                half = Some(ms);
            }
            if acked * 100 >= agents * 99 && p99.is_none() {
                p99 = Some(ms);
            }
            if acked >= agents {
                break ms;
            }
            if committed.elapsed() > Duration::from_secs(120) {
                anyhow::bail!(
                    "generation {generation}: only {acked} of {agents} agents acknowledged after 120 s"
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        eprintln!(
            "change {i}: generation {generation} acknowledged by the first agent after {:.1} ms, half {:.1} ms, 99% {:.1} ms, all {agents} {all:.1} ms",
            first.unwrap_or(f64::NAN),
            half.unwrap_or(f64::NAN),
            p99.unwrap_or(f64::NAN)
        );
        results.push(json!({
            "generation": generation,
            "first_ms": first,
            "half_ms": half,
            "p99_ms": p99,
            "all_ms": all,
        }));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let col = |k: &str| -> Vec<f64> { results.iter().filter_map(|r| r[k].as_f64()).collect() };
    let all = col("all_ms");
    Ok(json!({
        "agents": agents,
        "topology": topology,
        "link_changed": link,
        "changes": results,
        "median_first_ms": median(&col("first_ms")),
        "median_half_ms": median(&col("half_ms")),
        "median_all_ms": median(&all),
        "max_all_ms": all.iter().copied().fold(f64::NAN, f64::max),
    }))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .map_err(|_| anyhow::anyhow!("not a node count: {a}"))
        })
        .collect::<anyhow::Result<_>>()?;
    if sizes.is_empty() {
        sizes = vec![100, 500, 1000];
    }
    let changes: usize = std::env::var("NEXTMINI_BENCH_FANOUT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let command = format!(
        "bench_scale {}",
        sizes
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let provenance = bench::provenance(&command);

    let env = Env::new("bench-scale");
    let down = Mutex::new(env.command(&["down"]));
    let guard = interrupt::on_interrupt(move || {
        let _ = down.lock().map(|mut c| c.output());
    });
    let keep = env.state_dir.join("keep.yaml");
    std::fs::write(&keep, manifest_line(KEEP, 1))?;
    env.ok(&["up", "-f", keep.to_str().expect("UTF-8 path")]);
    let url = env.ok(&["db", "url"]).trim().to_string();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(3)
        .connect(&url)
        .await?;

    let mut rows = Vec::new();
    let mut fanout_result = None;
    let largest = sizes.iter().copied().max().unwrap_or(0);
    for &n in &sizes {
        let row = startup(&env, &pool, n).await?;
        let topology = row["topology"].as_str().unwrap_or_default().to_string();
        rows.push(row);
        if n == largest && changes > 0 {
            fanout_result = Some(fanout(&pool, &topology, changes).await?);
        }
        let t = Instant::now();
        env.ok(&["down", &topology]);
        let down_s = t.elapsed().as_secs_f64();
        eprintln!("{n} nodes: down in {down_s:.1} s");
        if let Some(last) = rows.last_mut() {
            last["down_seconds"] = json!(down_s);
        }
    }
    pool.close().await;
    drop(env);
    interrupt::forget(guard);

    println!(
        "| nodes | up | all namespaces | all agents started | all connected | all acknowledged | down |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        let p = |k: &str| {
            r["phases"][k]
                .as_f64()
                .map_or("-".into(), |v| format!("{v:.1} s"))
        };
        println!(
            "| {} | {:.1} s | {} | {} | {} | {} | {:.1} s |",
            r["nodes"],
            r["up_seconds"].as_f64().unwrap_or(f64::NAN),
            p("all_namespaces_s"),
            p("all_agents_started_s"),
            p("all_connected_s"),
            p("all_acknowledged_s"),
            r["down_seconds"].as_f64().unwrap_or(f64::NAN),
        );
    }
    bench::write_results(
        "startup",
        &json!({
            "benchmark": "startup",
            "provenance": provenance,
            "targets": {"up_seconds_1000_nodes": 20.0},
            "rows": rows,
        }),
    )?;
    if let Some(f) = fanout_result {
        println!(
            "fan-out to {} agents: median {:.1} ms, max {:.1} ms (first agent: median {:.1} ms)",
            f["agents"],
            f["median_all_ms"].as_f64().unwrap_or(f64::NAN),
            f["max_all_ms"].as_f64().unwrap_or(f64::NAN),
            f["median_first_ms"].as_f64().unwrap_or(f64::NAN),
        );
        let mut f = f;
        f["benchmark"] = json!("fanout");
        f["provenance"] = provenance;
        bench::write_results("fanout", &f)?;
    }
    Ok(())
}
