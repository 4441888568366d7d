//! A link direction driven by a packet-delivery trace (Mahimahi's format) on
//! live traffic: a UDP sender in one namespace overloads a link whose trace
//! alternates a fast second (two 1,500-byte opportunities every millisecond,
//! 24 Mbit/s) and a slow one (one every 2 ms, 6 Mbit/s); a UDP sink in the
//! other records when each datagram arrived. Each second of the trace must
//! deliver its opportunities' bytes within 2%: a token bucket at the mean rate,
//! or opportunities of the wrong size, fail it.

use nextmini_e2e::Env;
use std::time::Duration;

const TOPOLOGY: &str = "trace";
/// UDP payload; with UDP and IPv4 headers each datagram is `IP_BYTES` on the link.
const PAYLOAD: usize = 1200;
const IP_BYTES: u64 = PAYLOAD as u64 + 28;
const PERIOD_MS: u64 = 2000;
const OPPORTUNITY_BYTES: u64 = 1500;

/// The trace: offsets 1..=1000 twice each, then every other ms to 2000.
fn trace_lines() -> Vec<u64> {
    let fast = (1..=1000u64).flat_map(|ms| [ms, ms]);
    let slow = (1002..=PERIOD_MS).step_by(2);
    fast.chain(slow).collect()
}

fn manifest() -> String {
    let inline: String = trace_lines().iter().map(|ms| format!("{ms}\\n")).collect();
    format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata:\n  name: {TOPOLOGY}\nspec:\n  \
         nodes: [{{name: a}}, {{name: b}}]\n  links:\n    - endpoints: [a, b]\n      \
         queue: {{limit: 300pkt}}\n      forward: {{trace: {{inline: \"{inline}\"}}}}\n"
    )
}

/// Records the arrival time (CLOCK_MONOTONIC, ns) of every datagram on port
/// 9000 until 3 s pass without one, then writes them to argv[1].
const SINK: &str = r#"
import os, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.bind(("0.0.0.0", 9000))
times = []
while True:
    try:
        s.recv(4096)
    except socket.timeout:
        break
    times.append(time.monotonic_ns())
    s.settimeout(3.0)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write("\n".join(map(str, times)))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
"#;

/// Sends `PAYLOAD`-byte datagrams to argv[1]:9000 at argv[2] bit/s for argv[3] s.
const SENDER: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
dst, rate, secs = (sys.argv[1], 9000), float(sys.argv[2]), float(sys.argv[3])
payload = b"x" * int(sys.argv[4])
per_s = rate / 8 / (len(payload) + 28)
start, sent = time.monotonic(), 0
while True:
    elapsed = time.monotonic() - start
    if elapsed >= secs:
        break
    while sent < int(elapsed * per_s) + 1:
        try:
            s.sendto(payload, dst)
        except OSError:
            pass
        sent += 1
    time.sleep(0.0005)
"#;

/// The phase (ms after the first arrival) at which the trace's fast second
/// starts, found as the alignment that best separates fast from slow seconds.
fn fit_phase(bins: &[u64]) -> u64 {
    let prefix: Vec<u64> = std::iter::once(0)
        .chain(bins.iter().scan(0, |acc, &b| {
            *acc += b;
            Some(*acc)
        }))
        .collect();
    let count = |from: u64, to: u64| prefix[to as usize] - prefix[from as usize];
    (0..PERIOD_MS)
        .max_by_key(|&phase| {
            let mut score: i64 = 0;
            let mut start = phase;
            let mut fast = true;
            while start + 1000 <= bins.len() as u64 {
                let n = count(start, start + 1000) as i64;
                score += if fast { n } else { -n };
                fast = !fast;
                start += 1000;
            }
            score
        })
        .unwrap_or(0)
}

#[test]
fn a_trace_link_delivers_each_seconds_opportunities() {
    let mut env = Env::new("trace-links");
    env.apply_yaml(TOPOLOGY, &manifest());
    let arrivals_file = std::env::temp_dir().join(format!("nextmini-trace-{}", std::process::id()));
    let _ = std::fs::remove_file(&arrivals_file);
    let out = arrivals_file.to_str().expect("path").to_owned();
    env.spawn_in("b", &["python3", "-c", SINK, &out]);
    env.wait_for("the UDP sink", Duration::from_secs(10), || {
        env.exec("b", &["sh", "-c", "ss -lun | grep -q ':9000 '"])
            .status
            .success()
    });
    // 40 Mbit/s offered: above both phases, so the link is always backlogged.
    let payload = PAYLOAD.to_string();
    let sent = env.exec("a", &["python3", "-c", SENDER, "b", "40e6", "9", &payload]);
    assert!(
        sent.status.success(),
        "sender: {}",
        String::from_utf8_lossy(&sent.stderr)
    );
    env.wait_for("the sink's record", Duration::from_secs(30), || {
        arrivals_file.exists()
    });
    let text = std::fs::read_to_string(&arrivals_file).expect("arrivals");
    let _ = std::fs::remove_file(&arrivals_file);
    let times: Vec<u64> = text.lines().filter_map(|l| l.parse().ok()).collect();
    assert!(
        times.len() > 5_000,
        "only {} datagrams arrived",
        times.len()
    );
    let first = times[0];
    let last_ms = (times[times.len() - 1] - first) / 1_000_000;
    let mut bins = vec![0u64; last_ms as usize + 1];
    for t in &times {
        bins[((t - first) / 1_000_000) as usize] += 1;
    }
    let phase = fit_phase(&bins);

    // Whole trace seconds after the first one (the queue fills) and before the
    // sink's last datagram (the queue drains).
    let mut rows = Vec::new();
    let mut start = phase;
    let mut fast = true;
    while start + 1000 + 10 <= last_ms {
        if start >= 1000 {
            let n: u64 = bins[start as usize..(start + 1000) as usize].iter().sum();
            let opportunities = if fast { 2000 } else { 500 };
            let expected = opportunities * OPPORTUNITY_BYTES;
            let delivered = n * IP_BYTES;
            rows.push((fast, delivered, expected));
        }
        fast = !fast;
        start += 1000;
    }
    println!("trace link a → b, phase {phase} ms after the first arrival:");
    for (fast, delivered, expected) in &rows {
        println!(
            "  {} second: {:.3} Mbit/s delivered, {:.3} Mbit/s in the trace ({:+.2}%)",
            if *fast { "fast" } else { "slow" },
            *delivered as f64 * 8.0 / 1e6,
            *expected as f64 * 8.0 / 1e6,
            100.0 * (*delivered as f64 - *expected as f64) / *expected as f64
        );
    }
    assert!(
        rows.iter().filter(|r| r.0).count() >= 2 && rows.iter().filter(|r| !r.0).count() >= 2,
        "too few whole seconds measured: {rows:?}"
    );
    for (fast, delivered, expected) in &rows {
        let error = delivered.abs_diff(*expected) as f64 / *expected as f64;
        assert!(
            error <= 0.02,
            "a {} second delivered {delivered} bytes, the trace {expected} ({:+.2}%)",
            if *fast { "fast" } else { "slow" },
            100.0 * (*delivered as f64 - *expected as f64) / *expected as f64
        );
    }
}
