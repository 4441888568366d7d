//! Benchmark (issue 4): how long from a committed route UPDATE to the first packet
//! on the new path, with N agents connected to the hub.
//!
//! A diamond s→{x,y}→d, where the path through y has 10 ms of extra delay, hangs
//! off a chain that brings the topology to N nodes. A UDP stream from s to d
//! (one packet every ~200 µs, each carrying its send time) tells by its one-way
//! delay which path each packet took. The harness flips the route rule between
//! the two paths over a persistent SQL connection and takes the time right after
//! COMMIT returns; the switch latency is the send time of the first packet on
//! the new path minus that. All clocks are the machine's CLOCK_MONOTONIC.
//!
//! `sudo cargo run --release -p nextmini-e2e --example route_latency -- 10 200`
//! (agent counts; default 10 and 200). Needs the release binaries built.

use nextmini_e2e::Env;
use nextmini_e2e::bench::percentile;
use std::time::Duration;

const SWITCHES: usize = 60;
const SLOW_PATH_NS: u64 = 5_000_000;

const SENDER: &str = r#"
import socket, struct, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
seq = 0
while True:
    s.sendto(struct.pack(">QQ", seq, time.monotonic_ns()), ("d", 9000))
    seq += 1
    time.sleep(0.0002)
"#;

const RECEIVER: &str = r#"
import socket, struct, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 9000))
out = open(sys.argv[1], "w", buffering=1)
while True:
    data = s.recv(64)
    now = time.monotonic_ns()
    seq, sent = struct.unpack(">QQ", data[:16])
    out.write(f"{seq} {sent} {now}\n")
"#;

fn monotonic_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("clock");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

fn manifest(agents: usize) -> String {
    let mut nodes = vec!["s".to_string(), "x".into(), "y".into(), "d".into()];
    let chain: Vec<String> = (0..agents.saturating_sub(4))
        .map(|i| format!("e{i}"))
        .collect();
    nodes.extend(chain.iter().cloned());
    let mut out = String::from(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: lat}\nspec:\n  nodes:\n",
    );
    for n in &nodes {
        out.push_str(&format!("    - name: {n}\n"));
    }
    out.push_str("  links:\n    - endpoints: [s, x]\n    - endpoints: [x, d]\n    - endpoints: [s, y]\n      forward: {delay: 10ms}\n    - endpoints: [y, d]\n");
    let mut prev = "d".to_string();
    for n in chain {
        out.push_str(&format!("    - endpoints: [{prev}, {n}]\n"));
        prev = n;
    }
    out
}

async fn run(agents: usize) -> Vec<f64> {
    let mut env = Env::new(&format!("lat{agents}"));
    let path = env.state_dir.join("lat.yaml");
    std::fs::write(&path, manifest(agents)).expect("manifest");
    let started = std::time::Instant::now();
    env.ok(&[
        "up",
        "-f",
        path.to_str().expect("path"),
        "--timeout-secs",
        "600",
    ]);
    eprintln!("{agents} agents up in {:?}", started.elapsed());

    let url = env.ok(&["db", "url"]).trim().to_string();
    let pool = sqlx::PgPool::connect(&url).await.expect("db");
    sqlx::query(
        "WITH t AS (SELECT id FROM topologies WHERE name = 'lat') \
         INSERT INTO routes (topology_id, id, name, path) \
         SELECT id, 1, 'fast', ARRAY['s','x','d'] FROM t UNION ALL SELECT id, 2, 'slow', ARRAY['s','y','d'] FROM t",
    )
    .execute(&pool)
    .await
    .expect("routes");
    sqlx::query(
        "INSERT INTO route_rules (topology_id, src, dst, protocol, dst_port, route_id) \
         SELECT id, 's', 'd', 17, 9000, 1 FROM topologies WHERE name = 'lat'",
    )
    .execute(&pool)
    .await
    .expect("rule");

    let log = env.state_dir.join("arrivals.txt");
    let receiver = env.state_dir.join("receiver.py");
    let sender = env.state_dir.join("sender.py");
    std::fs::write(&receiver, RECEIVER).expect("receiver");
    std::fs::write(&sender, SENDER).expect("sender");
    env.spawn_in(
        "d",
        &[
            "python3",
            receiver.to_str().expect("path"),
            log.to_str().expect("path"),
        ],
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.spawn_in("s", &["python3", sender.to_str().expect("path")]);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mut commits = Vec::with_capacity(SWITCHES);
    for i in 0..SWITCHES {
        let target: i32 = if i % 2 == 0 { 2 } else { 1 };
        let mut tx = pool.begin().await.expect("begin");
        sqlx::query("UPDATE route_rules SET route_id = $1 WHERE dst_port = 9000")
            .bind(target)
            .execute(&mut *tx)
            .await
            .expect("update");
        tx.commit().await.expect("commit");
        commits.push((monotonic_ns(), target));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let hub_log = std::fs::read_to_string(env.state_dir.join("logs/hub.log")).unwrap_or_default();
    let resyncs = hub_log.matches("queue full or closed").count();
    if resyncs > 0 {
        eprintln!("{agents} agents: {resyncs} session(s) overflowed and resynced");
    }

    let arrivals: Vec<(u64, bool)> = std::fs::read_to_string(&log)
        .expect("arrival log")
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace().skip(1).map(|v| v.parse::<u64>().ok());
            let sent = f.next()??;
            let recv = f.next()??;
            Some((sent, recv.saturating_sub(sent) > SLOW_PATH_NS))
        })
        .collect();
    drop(env);
    commits
        .iter()
        .filter_map(|&(at, target)| {
            let slow = target == 2;
            arrivals
                .iter()
                .filter(|(sent, on_slow)| *sent >= at && *on_slow == slow)
                .map(|(sent, _)| sent - at)
                .min()
                .map(|ns| ns as f64 / 1e6)
        })
        .collect()
}

#[tokio::main]
async fn main() {
    let counts: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let counts = if counts.is_empty() {
        vec![10, 200]
    } else {
        counts
    };
    println!("| agents | switches | p50 | p99 | max |");
    println!("|---|---|---|---|---|");
    for n in counts {
        let mut ms = run(n).await;
        ms.sort_by(|a, b| a.total_cmp(b));
        if ms.is_empty() {
            println!("| {n} | 0 | - | - | - |");
            continue;
        }
        println!(
            "| {n} | {} | {:.2} ms | {:.2} ms | {:.2} ms |",
            ms.len(),
            percentile(&ms, 0.5),
            percentile(&ms, 0.99),
            ms[ms.len() - 1]
        );
    }
}
