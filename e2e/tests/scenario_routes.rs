//! Route events of a timed scenario (issue 18.2) on live traffic. In a graph
//! where a → e goes through b (two hops, no delay) unless a route says
//! otherwise, the scenario moves a's ICMP to e onto a-c-d-e (c-d has 15 ms of
//! delay) at 3 s and ends that rule at 6 s. A ping every 10 ms from a shows
//! which path each echo took by its round-trip time; every check is made
//! against the instants PostgreSQL recorded. The manifest is the example
//! `manifests/examples/scenario-routes.yaml`.

use nextmini_e2e::{Env, link_counter, repo_path, scenario_start_us};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const TOPOLOGY: &str = "rte";
/// The events' offsets in the example manifest.
const DETOUR_AT_US: i64 = 3_000_000;
const BACK_AT_US: i64 = 6_000_000;
/// An echo over the detour crosses c-d's 15 ms once (the reply comes back
/// through b): its round trip is at least this.
const DETOUR_RTT_MS: f64 = 15.0;
/// An echo through b has no emulated delay: well under this even on two
/// busy cores.
const DIRECT_RTT_MS: f64 = 8.0;
/// The ping interval (ping may space them a little wider).
const PING_INTERVAL_US: i64 = 10_000;
const SKEW_LIMIT_US: i64 = 10_000;

/// One echo reply: when its request left (reply time minus round trip, µs
/// since the Unix epoch) and its round trip.
#[derive(Debug, Clone, Copy)]
struct Echo {
    sent_us: i64,
    rtt_ms: f64,
}

/// Parses `ping -D` lines: `[1732680000.123456] 64 bytes from …: icmp_seq=1
/// ttl=64 time=15.3 ms`.
fn echoes(out: &str) -> Vec<Echo> {
    out.lines()
        .filter_map(|line| {
            let stamp = line.strip_prefix('[')?.split(']').next()?;
            let at_s: f64 = stamp.parse().ok()?;
            let rtt_ms: f64 = line
                .split("time=")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()?;
            Some(Echo {
                sent_us: (at_s * 1e6 - rtt_ms * 1e3) as i64,
                rtt_ms,
            })
        })
        .collect()
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// (planned instant, applied instant, skew) of event `idx` on node a.
fn applied(env: &Env, idx: u32) -> Option<(i64, i64, i64)> {
    let row = env.psql(&format!(
        "SELECT (extract(epoch FROM a.planned_at) * 1e6)::bigint, \
                (extract(epoch FROM a.applied_at) * 1e6)::bigint, a.skew_us \
         FROM scenario_applied a JOIN topologies t ON t.id = a.topology_id \
         WHERE t.name = '{TOPOLOGY}' AND a.idx = {idx} AND a.node = 'a' AND a.error = ''"
    ));
    let f: Vec<i64> = row.split('|').filter_map(|v| v.parse().ok()).collect();
    (f.len() == 3).then(|| (f[0], f[1], f[2]))
}

#[test]
fn a_route_event_moves_traffic_at_its_instant_and_its_end_moves_it_back() {
    let env = Env::new("scenario-routes");
    let manifest = std::fs::read_to_string(repo_path("manifests/examples/scenario-routes.yaml"))
        .expect("manifest");
    env.apply_yaml(TOPOLOGY, &manifest);
    let start_us = scenario_start_us(&env, TOPOLOGY);
    // The route's stored row and its labels along the path.
    let route = env.psql(&format!(
        "SELECT r.path FROM routes r JOIN topologies t ON t.id = r.topology_id \
         WHERE t.name = '{TOPOLOGY}' AND r.name = 'scenario/0'"
    ));
    assert_eq!(route, "{a,c,d,e}", "the detour is not stored as a route");

    // Ping from before the first event to 2 s after the second.
    let detour_at = start_us + DETOUR_AT_US;
    let back_at = start_us + BACK_AT_US;
    let until = back_at + 2_000_000;
    let count = ((until - now_us()) / PING_INTERVAL_US).max(1).to_string();
    assert!(
        detour_at - now_us() > 1_000_000,
        "the scenario started too early to see the traffic before the event"
    );
    let c_d_before = link_counter(&env, TOPOLOGY, "c-d", "c", "tx_bytes");
    let ping = env
        .command(&[
            "exec", "a", "--", "ping", "-D", "-n", "-i", "0.01", "-W", "1", "-c", &count, "e",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output()
        .expect("ping");
    let out = String::from_utf8_lossy(&ping.stdout);
    let echoes = echoes(&out);
    assert!(
        echoes.len() > 500,
        "too few echo replies ({}):\n{out}",
        echoes.len()
    );

    // Both events took effect on a within the limit of their instants.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (detour, back) = loop {
        if let (Some(d), Some(b)) = (applied(&env, 0), applied(&env, 1)) {
            break (d, b);
        }
        assert!(
            Instant::now() < deadline,
            "the route events were not recorded on a:\n{}",
            env.ok(&["status", TOPOLOGY])
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!((detour.0, back.0), (detour_at, back_at), "planned instants");
    println!(
        "route events applied {} µs and {} µs after their instants",
        detour.2, back.2
    );
    for skew in [detour.2, back.2] {
        assert!(
            (0..=SKEW_LIMIT_US).contains(&skew),
            "a route event took effect {skew} µs from its instant"
        );
    }

    // Before the detour and after its end: through b. Between: over c-d,
    // every echo, from within one ping interval of the recorded instant.
    let phase = |from: i64, to: i64| -> Vec<Echo> {
        echoes
            .iter()
            .filter(|e| e.sent_us >= from && e.sent_us < to)
            .copied()
            .collect()
    };
    let before = phase(0, detour.1 - 1_000);
    let during = phase(detour.1 + PING_INTERVAL_US, back.1 - 1_000);
    let after = phase(back.1 + PING_INTERVAL_US, i64::MAX);
    let share_direct = |echoes: &[Echo]| {
        echoes.iter().filter(|e| e.rtt_ms < DIRECT_RTT_MS).count() as f64
            / echoes.len().max(1) as f64
    };
    let min_during = during.iter().map(|e| e.rtt_ms).fold(f64::MAX, f64::min);
    println!(
        "echoes: {} before ({:.0}% direct), {} during (min rtt {min_during:.2} ms), {} after ({:.0}% direct)",
        before.len(),
        share_direct(&before) * 100.0,
        during.len(),
        after.len(),
        share_direct(&after) * 100.0
    );
    assert!(
        before.len() > 50 && during.len() > 100 && after.len() > 100,
        "too few echoes per phase: {} {} {}",
        before.len(),
        during.len(),
        after.len()
    );
    assert!(
        min_during >= DETOUR_RTT_MS,
        "an echo sent while the route was in force came back in {min_during:.2} ms: not over c-d"
    );
    for (what, phase) in [("before", &before), ("after", &after)] {
        assert!(
            share_direct(phase) >= 0.95,
            "{what} the route: only {:.0}% of echoes through b",
            share_direct(phase) * 100.0
        );
    }
    // The switch itself, whatever the pings' spacing: the first echo over
    // the detour left no earlier than the instant, and the last echo through b
    // before it no later than the instant plus the limit.
    let first_detour = echoes
        .iter()
        .find(|e| e.rtt_ms >= DETOUR_RTT_MS && e.sent_us > detour_at - 500_000)
        .expect("an echo over the detour");
    let last_direct = echoes
        .iter()
        .rfind(|e| e.sent_us < first_detour.sent_us && e.rtt_ms < DIRECT_RTT_MS)
        .expect("an echo through b before the detour");
    let ms = |us: i64| (us - detour_at) as f64 / 1000.0;
    println!(
        "last echo through b sent {:+.1} ms, first over c-d {:+.1} ms from the planned instant",
        ms(last_direct.sent_us),
        ms(first_detour.sent_us)
    );
    assert!(
        first_detour.sent_us >= detour_at - 1_000,
        "an echo took the detour {:.1} ms before its instant",
        -ms(first_detour.sent_us)
    );
    assert!(
        last_direct.sent_us <= detour_at + SKEW_LIMIT_US,
        "an echo went through b {:.1} ms after the detour's instant",
        ms(last_direct.sent_us)
    );
    // The detour's link counted the echoes (the label's hop at c): 84 IP
    // bytes each (ping's 56 bytes of data, ICMP and IPv4 headers).
    let c_d = link_counter(&env, TOPOLOGY, "c-d", "c", "tx_bytes") - c_d_before;
    assert!(
        c_d >= during.len() as i64 * 84,
        "c-d counted {c_d} bytes from c for {} echoes over it",
        during.len()
    );
    let status = env.ok(&["status", TOPOLOGY]);
    println!("{status}");
    for target in [
        "a -> e proto 1 via a,c,d,e",
        "a -> e proto 1: back to the stored routes",
    ] {
        assert!(
            status.contains(target),
            "status does not show the route event {target:?}:\n{status}"
        );
    }
}
