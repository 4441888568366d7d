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
/// starts: the alignment of the fast/slow pattern that best matches the
/// arrivals. Every phase is scored over the same whole periods after the
/// first second (the queue fills) and before the sender stops (the queue
/// drains), the region the test judges. Scoring each phase over its own
/// windows chose a phase about 120 ms off in 2 of 5 runs on 2026-11-27 (the
/// slow seconds then measured +35%); why the ends outweighed the middle there
/// was not found.
fn fit_phase(bins: &[u64]) -> u64 {
    let periods = (bins.len() as u64).saturating_sub(1010) / PERIOD_MS;
    let region = 1000..1000 + periods * PERIOD_MS;
    (0..PERIOD_MS)
        .max_by_key(|&phase| {
            region
                .clone()
                .map(|t| {
                    let n = bins[t as usize] as i64;
                    let fast = (t + PERIOD_MS - phase) % PERIOD_MS < PERIOD_MS / 2;
                    if fast { n } else { -n }
                })
                .sum::<i64>()
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

/// The fit on arrivals made from the trace itself, with a slow start and a
/// drain at the ends: the phase is found for any alignment.
#[test]
fn the_phase_fit_finds_the_trace_behind_a_slow_start_and_a_drain() {
    for true_phase in [6u64, 121, 990, 1500] {
        let mut bins = vec![0u64; 9_300];
        for (t, bin) in bins.iter_mut().enumerate() {
            let t = t as u64;
            let fast = (t + PERIOD_MS - true_phase) % PERIOD_MS < PERIOD_MS / 2;
            *bin = match t {
                0..120 => 1,
                9_000.. => 2,
                _ if fast => 2,
                _ => 1,
            };
        }
        let found = fit_phase(&bins);
        assert!(
            found.abs_diff(true_phase) <= 2,
            "phase {true_phase} found as {found}"
        );
    }
}
