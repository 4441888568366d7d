//! A link direction driven by a packet-delivery trace (Mahimahi's format) on
//! live traffic: a UDP sender in one namespace overloads a link whose trace
//! alternates a fast second (two 1,500-byte opportunities every millisecond,
//! 24 Mbit/s) and a slow one (one every 2 ms, 6 Mbit/s); a UDP sink in the
//! other records when each datagram arrived. Each second of the trace must
//! deliver its opportunities' bytes within 2%: a token bucket at the mean rate,
//! or opportunities of the wrong size, fail it.

use nextmini_e2e::Env;
use nextmini_e2e::udp_sink::UdpSink;
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

/// The trace is a file in a ConfigMap document of the manifest, as
/// `kubectl create configmap traces --from-file=fast-slow=…` would store it.
fn manifest() -> String {
    let lines: String = trace_lines()
        .iter()
        .map(|ms| format!("    {ms}\n"))
        .collect();
    format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata:\n  name: {TOPOLOGY}\nspec:\n  \
         nodes: [{{name: a}}, {{name: b}}]\n  links:\n    - endpoints: [a, b]\n      \
         queue: {{limit: 300pkt}}\n      \
         forward: {{trace: {{configMap: {{name: traces, key: fast-slow}}}}}}\n\
         ---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: traces}}\ndata:\n  fast-slow: |\n{lines}"
    )
}

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
    let sink = UdpSink::start(&mut env, "b", 9000, Duration::from_secs(3));
    // 40 Mbit/s offered: above both phases, so the link is always backlogged.
    let payload = PAYLOAD.to_string();
    let sent = env.exec("a", &["python3", "-c", SENDER, "b", "40e6", "9", &payload]);
    assert!(
        sent.status.success(),
        "sender: {}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let times: Vec<u64> = sink
        .arrivals(&env, Duration::from_secs(30))
        .iter()
        .map(|a| a.at_ns)
        .collect();
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
