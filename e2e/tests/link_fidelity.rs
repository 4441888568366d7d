//! Links behave as configured (the fidelity suite): rate, delay, loss, RED and
//! ECN measured with real kernel TCP/UDP through TUN (iperf3, ping); parameters
//! changed live without dropping connections; QUIC links; a link keeps its rate
//! while other nodes burn CPU; jitter, reorder, duplicate, corrupt and WRR/DRR
//! shares measured on UDP probes. Figures are printed for BENCHMARKS.md.

use nextmini_e2e::{
    Env, episodes_not_from_host_contention, fidelity_episodes, iperf3, link_counter,
    ping_median_ms, repo_path, sha256_file, tcp_goodput, tcp_payload_ratio,
};
use std::time::{Duration, Instant};

const MTU: u32 = 1400;
/// Runs of one rate before "reaches the rate" fails (see the rate loop).
const RATE_ATTEMPTS: usize = 3;

/// A Topology with `nodes` (name, extra node YAML) and Link documents (name, a, b, extra YAML).
fn manifest(topology: &str, nodes: &[(&str, &str)], links: &[(&str, &str, &str, &str)]) -> String {
    let mut out = format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata:\n  name: {topology}\nspec:\n  dataplane:\n    mtu: {MTU}\n  nodes:\n"
    );
    for (name, extra) in nodes {
        out.push_str(&format!("    - name: {name}\n"));
        for line in extra.lines() {
            out.push_str(&format!("      {line}\n"));
        }
    }
    for (name, a, b, extra) in links {
        out.push_str(&format!(
            "---\napiVersion: nextmini.io/v1alpha1\nkind: Link\nmetadata:\n  name: {name}\nspec:\n  topology: {topology}\n  endpoints: [{a}, {b}]\n"
        ));
        for line in extra.lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}

/// `nextmini up -f` of the manifest, then waits until every agent runs it.
fn apply(env: &Env, topology: &str, yaml: &str) {
    env.apply_yaml(topology, yaml);
}

fn start_iperf_server(env: &mut Env, node: &str) {
    env.spawn_in(node, &["iperf3", "-s", "-p", "5201"]);
    env.wait_for("iperf3 server", Duration::from_secs(10), || {
        env.exec(node, &["sh", "-c", "ss -ltn | grep -q ':5201 '"])
            .status
            .success()
    });
}

fn two_nodes(link: &str) -> String {
    manifest("fid", &[("a", ""), ("b", "")], &[("a-b", "a", "b", link)])
}

#[test]
fn links_match_their_configuration() {
    let mut env = Env::new("fidelity");
    apply(&env, "fid", &two_nodes(""));
    start_iperf_server(&mut env, "b");
    let mut table = vec![
        format!("| what | configured | measured | error |"),
        "|---|---|---|---|".into(),
    ];

    // The machine's own capacity through two agents, unshaped, measured in the
    // same run: a rate the machine cannot carry with headroom says nothing about
    // the shaper (Mininet-HiFi's lesson), so there only "never above" is checked.
    let capacity = tcp_goodput(&iperf3(&env, "a", &["-c", "b", "-t", "4", "-O", "1"]));
    table.push(format!(
        "| capacity, unshaped | - | {:.2} Mbit/s | - |",
        capacity / 1e6
    ));

    // Rate: TCP goodput against the configured IP rate, less TCP/IP headers.
    // "Never above the rate" holds for every run; "reaches the rate" for the
    // best of up to RATE_ATTEMPTS runs, as a benchmark takes its best run: one
    // 5 s run on a shared 2-core CI machine came 3.14% short at 500 Mbit/s
    // while the same build met it within 0.72% on a quiet one. A shaper that
    // is wrong (a rate constant off by 5%) is short in every run.
    for mbit in [10u64, 100, 500] {
        apply(
            &env,
            "fid",
            &two_nodes(&format!("rate: {mbit}Mbit\nqueue:\n  limit: 300pkt\n")),
        );
        let expected = mbit as f64 * 1e6 * tcp_payload_ratio(MTU);
        let with_headroom = capacity >= 1.25 * expected;
        let mut attempts = Vec::new();
        let (measured, new_episodes) = loop {
            let episodes_before = fidelity_episodes(&env, "fid").len();
            let report = iperf3(&env, "a", &["-c", "b", "-t", "5", "-O", "1"]);
            let measured = tcp_goodput(&report);
            // The last window's report, then the guard's verdict on the run.
            std::thread::sleep(Duration::from_millis(1500));
            let new_episodes = fidelity_episodes(&env, "fid")[episodes_before..].to_vec();
            let error = (measured - expected) / expected;
            let retransmits = report["end"]["sum_sent"]["retransmits"].as_u64();
            println!(
                "rate {mbit} Mbit/s, run {}: {:.2} Mbit/s ({:+.2}%), {retransmits:?} retransmits, guard {new_episodes:?}",
                attempts.len() + 1,
                measured / 1e6,
                error * 100.0
            );
            assert!(
                error <= 0.03,
                "rate {mbit} Mbit/s: goodput {measured:.0} above {expected:.0} ({:+.2}%)",
                error * 100.0
            );
            attempts.push(format!("{:+.2}%", error * 100.0));
            if !with_headroom || error.abs() <= 0.03 || attempts.len() == RATE_ATTEMPTS {
                break (measured, new_episodes);
            }
        };
        let error = (measured - expected) / expected;
        table.push(format!(
            "| rate {mbit} Mbit/s (TCP goodput) | {:.2} Mbit/s | {:.2} Mbit/s | {:+.2}% |",
            expected / 1e6,
            measured / 1e6,
            error * 100.0
        ));
        if with_headroom {
            assert!(
                error.abs() <= 0.03,
                "rate {mbit} Mbit/s: goodput short of {expected:.0} in every run ({})",
                attempts.join(", ")
            );
            // A link that delivered its rate with headroom: the guard stays
            // silent, unless it names a host too busy to keep the schedule.
            let false_alarms = episodes_not_from_host_contention(&new_episodes);
            assert!(
                false_alarms.is_empty(),
                "rate {mbit} Mbit/s: the fidelity guard fired on a faithful run: {false_alarms:?}"
            );
        } else {
            println!(
                "rate {mbit} Mbit/s: the machine carries only {:.0} Mbit/s unshaped; only checked that the shaper never exceeds the rate",
                capacity / 1e6
            );
        }
    }

    // Delay: median ping RTT against twice the one-way delay plus the unloaded
    // baseline. The median: one reply that waited 20 ms for a busy CPU moves
    // a mean of 40 by 0.5 ms, the median not at all. Round trips stay under
    // 100 ms: ping prints whole milliseconds from there, and a 0.5 ms baseline
    // then rounds the median a whole millisecond up or down.
    apply(&env, "fid", &two_nodes(""));
    let baseline = ping_median_ms(&env, "a", "b", 40);
    table.push(format!("| unloaded RTT | - | {baseline:.3} ms | - |"));
    for ms in [10.0f64, 45.0] {
        apply(&env, "fid", &two_nodes(&format!("delay: {ms}ms\n")));
        let rtt = ping_median_ms(&env, "a", "b", 40);
        let added = rtt - baseline;
        table.push(format!(
            "| delay {ms} ms each way (median ping RTT − baseline) | {:.1} ms | {added:.3} ms | {:+.3} ms |",
            2.0 * ms,
            added - 2.0 * ms
        ));
        assert!(
            (added - 2.0 * ms).abs() <= 0.5,
            "delay {ms} ms: RTT grew by {added:.3} ms"
        );
    }

    // Loss: UDP packets lost over at least 20,000.
    for pct in [1.0f64, 5.0] {
        apply(&env, "fid", &two_nodes(&format!("loss: {pct}%\n")));
        let report = iperf3(
            &env,
            "a",
            &["-c", "b", "-u", "-b", "40M", "-l", "1200", "-t", "6"],
        );
        let sum = &report["end"]["sum"];
        let packets = sum["packets"].as_f64().expect("packets");
        let lost = sum["lost_packets"].as_f64().expect("lost_packets");
        let measured = 100.0 * lost / packets;
        table.push(format!(
            "| loss {pct}% ({packets:.0} UDP packets) | {pct}% | {measured:.3}% | {:+.1}% rel |",
            100.0 * (measured - pct) / pct
        ));
        assert!(packets >= 20_000.0, "only {packets} packets sent");
        assert!(
            (measured - pct).abs() <= 0.2 * pct,
            "loss {pct}%: measured {measured:.3}%"
        );
    }

    // RED drops, then ECN marks once the endpoints negotiate ECN. A fast
    // average (weight 0.02) and a low band: with 0.002 and 20–80 packets a
    // 3 s flow gave only 11–26 events here and none on a slower CI machine.
    let red = |ecn: bool| {
        two_nodes(&format!(
            "rate: 20Mbit\nqueue:\n  limit: 300pkt\n  aqm:\n    red: {{min: 10, max: 40, maxP: 10%, weight: 0.02, ecn: {ecn}}}\n"
        ))
    };
    apply(&env, "fid", &red(false));
    iperf3(&env, "a", &["-c", "b", "-t", "3"]);
    env.wait_for("RED drops in PostgreSQL", Duration::from_secs(5), || {
        link_counter(&env, "fid", "a-b", "a", "drops_aqm") > 0
    });
    let drops = link_counter(&env, "fid", "a-b", "a", "drops_aqm");
    table.push(format!(
        "| RED 10–40 pkt, TCP at 20 Mbit/s | drops | {drops} AQM drops | - |"
    ));
    for node in ["a", "b"] {
        let out = env.exec(node, &["sysctl", "-qw", "net.ipv4.tcp_ecn=1"]);
        assert!(out.status.success(), "enabling ECN in {node}");
    }
    apply(&env, "fid", &red(true));
    iperf3(&env, "a", &["-c", "b", "-t", "3"]);
    env.wait_for("ECN marks in PostgreSQL", Duration::from_secs(5), || {
        link_counter(&env, "fid", "a-b", "a", "ecn_marks") > 0
    });
    let marks = link_counter(&env, "fid", "a-b", "a", "ecn_marks");
    table.push(format!(
        "| RED with ECN, TCP with ECN | marks | {marks} ECN marks | - |"
    ));

    println!(
        "\nlink fidelity (release agents, namespace mode):\n{}\n",
        table.join("\n")
    );
}

/// `Udp: InDatagrams` of a node's network namespace (/proc/net/snmp as seen
/// from inside it).
fn udp_in_datagrams(env: &Env, node: &str) -> i64 {
    let out = env.exec(node, &["cat", "/proc/net/snmp"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (
        udp.next().expect("Udp header"),
        udp.next().expect("Udp values"),
    );
    let column = names
        .split_whitespace()
        .position(|n| n == "InDatagrams")
        .expect("InDatagrams column");
    values
        .split_whitespace()
        .nth(column)
        .and_then(|v| v.parse().ok())
        .expect("InDatagrams value")
}

#[test]
fn links_change_live_and_quic_links_carry_traffic() {
    let mut env = Env::new("live");
    let yaml = |rate: &str| {
        manifest(
            "live",
            &[("a", ""), ("b", ""), ("c", "")],
            &[
                ("a-b", "a", "b", "transport: quic\n"),
                ("b-c", "b", "c", &format!("rate: {rate}\n")),
            ],
        )
    };
    apply(&env, "live", &yaml("100Mbit"));

    // A real transfer across the QUIC link, checked end to end.
    let www = env.state_dir.join("www");
    std::fs::create_dir_all(&www).expect("www");
    let big = www.join("big");
    std::fs::write(
        &big,
        (0..20_000_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect::<Vec<u8>>(),
    )
    .expect("file");
    env.serve_http("a", &www);
    env.wait_for_http("c", "a");
    let udp_before = udp_in_datagrams(&env, "b");
    let fetched = env.state_dir.join("fetched");
    let curl = env.exec(
        "c",
        &[
            "curl",
            "-sS",
            "--fail",
            "--max-time",
            "60",
            "-o",
            fetched.to_str().expect("path"),
            "http://a:8000/big",
        ],
    );
    assert!(
        curl.status.success(),
        "curl over QUIC failed: {}",
        String::from_utf8_lossy(&curl.stderr)
    );
    assert_eq!(sha256_file(&fetched), sha256_file(&big));
    env.wait_for(
        "the file on the QUIC link's counters",
        Duration::from_secs(5),
        || link_counter(&env, "live", "a-b", "b", "rx_bytes") >= 20_000_000,
    );
    // The transport itself: the 20 MB reached b as UDP datagrams (QUIC), and no
    // TCP connection joins a's and b's underlay addresses. Over a TCP link b's
    // UDP counter would not move. (Even fully GRO-coalesced, 20 MB is over 300
    // datagrams of at most 64 KiB.)
    let udp = udp_in_datagrams(&env, "b") - udp_before;
    assert!(
        udp > 300,
        "b received {udp} UDP datagrams during a 20 MB transfer over the QUIC link a-b"
    );
    let a_underlay = env.psql(
        "SELECT host(n.underlay_addr::inet) FROM nodes n JOIN topologies t ON t.id = n.topology_id WHERE t.name = 'live' AND n.name = 'a'",
    );
    let tcp = env.exec("b", &["ss", "-Htn", "state", "established"]);
    let tcp = String::from_utf8_lossy(&tcp.stdout);
    assert!(
        !tcp.contains(&format!("{a_underlay}:")),
        "a TCP connection joins a ({a_underlay}) and b on the underlay of a QUIC link:\n{tcp}"
    );
    println!(
        "QUIC link a-b: {udp} UDP datagrams into b for the 20 MB file, no TCP on its underlay"
    );

    // Rate 100 → 20 Mbit/s while iperf3 runs: the new rate holds within a second,
    // the connection is never re-dialled and the TCP flow survives.
    start_iperf_server(&mut env, "a");
    let connects_before = link_counter(&env, "live", "b-c", "c", "connects");
    let client = {
        let mut cmd = env.command(&[
            "exec", "c", "--", "iperf3", "-J", "-c", "a", "-R", "-t", "6", "-i", "0.5",
        ]);
        cmd.stdout(std::process::Stdio::piped())
            .spawn()
            .expect("iperf3")
    };
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let change_s = started.elapsed().as_secs_f64();
    apply(&env, "live", &yaml("20Mbit"));
    let applied_s = started.elapsed().as_secs_f64() - change_s;
    println!("rate change: `nextmini up` to every agent acknowledging took {applied_s:.3} s");
    let out = client.wait_with_output().expect("iperf3 output");
    assert!(
        out.status.success(),
        "the TCP flow did not survive the change"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("iperf3 JSON");
    let intervals: Vec<(f64, f64)> = report["intervals"]
        .as_array()
        .expect("intervals")
        .iter()
        .filter_map(|i| {
            Some((
                i["sum"]["end"].as_f64()?,
                i["sum"]["bits_per_second"].as_f64()?,
            ))
        })
        .collect();
    let before: Vec<f64> = intervals
        .iter()
        .filter(|(t, _)| *t > 0.5 && *t <= 2.0)
        .map(|x| x.1)
        .collect();
    // iperf3's clock starts a little after the process: intervals ending a second
    // after the change are judged (half a second of slack for that start).
    let after: Vec<f64> = intervals
        .iter()
        .filter(|(t, _)| *t > change_s + 1.5)
        .map(|x| x.1)
        .collect();
    assert!(!after.is_empty(), "no iperf3 interval after the change");
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    println!(
        "live rate change: {:.1} Mbit/s before, {:.1} Mbit/s from 1 s after the change",
        mean(&before) / 1e6,
        mean(&after) / 1e6
    );
    assert!(
        mean(&before) > 60e6,
        "before the change the flow ran at {:.1} Mbit/s",
        mean(&before) / 1e6
    );
    assert!(
        mean(&after) < 22e6,
        "after the change the flow ran at {:.1} Mbit/s",
        mean(&after) / 1e6
    );
    env.wait_for("counters", Duration::from_secs(3), || {
        link_counter(&env, "live", "b-c", "c", "connects") == connects_before
    });
}

/// Nodes that burn CPU, as in Mininet-HiFi's isolation experiment (seed 001):
/// eight nodes with three busy loops each beside a 200 Mbit/s link with 2 ms of
/// delay, on a 2-core machine. With per-node CPU limits the link must deliver
/// its rate (±3%); without them the busy loops take the agents' CPU and the link
/// must measurably fall short, or the experiment says nothing about the limits.
#[test]
fn cpu_limits_keep_busy_nodes_off_a_links_bandwidth() {
    const BUSY: [&str; 8] = ["c", "d", "e", "f", "g", "h", "i", "j"];
    const LOOPS: usize = 3;
    // Goodput, and what the fidelity guard said about the run.
    let run = |limits: bool| -> (f64, Vec<String>) {
        let mut env = Env::new(if limits { "iso-limits" } else { "iso-free" });
        let extra = if limits {
            "resources: {cpu: 50m, memory: 64Mi}"
        } else {
            ""
        };
        let mut nodes = vec![("a", ""), ("b", "")];
        nodes.extend(BUSY.iter().map(|n| (*n, extra)));
        let yaml = manifest(
            "iso",
            &nodes,
            &[(
                "a-b",
                "a",
                "b",
                "rate: 200Mbit\ndelay: 2ms\nqueue:\n  limit: 300pkt\n",
            )],
        );
        apply(&env, "iso", &yaml);
        start_iperf_server(&mut env, "b");
        let mut busy = Vec::new();
        for node in BUSY {
            for _ in 0..LOOPS {
                // At nice -10 a loop weighs about nine times an agent thread,
                // so without limits the loops take the agents' CPU even with
                // the wake-up credit a sleeping agent thread gets; with limits
                // the node's group is capped whatever its members' weights.
                busy.push((
                    node,
                    env.spawn_in(
                        node,
                        &["nice", "-n", "-10", "python3", "-c", "while True: pass"],
                    ),
                ));
            }
        }
        std::thread::sleep(Duration::from_secs(1));
        if limits {
            node_group_is_limited(&env, "c", &busy);
        }
        let goodput = tcp_goodput(&iperf3(&env, "a", &["-c", "b", "-t", "5", "-O", "1"]));
        std::thread::sleep(Duration::from_millis(1500));
        (goodput, fidelity_episodes(&env, "iso"))
    };
    let expected = 200e6 * tcp_payload_ratio(MTU);
    let (with_limits, guard_with_limits) = run(true);
    let (without, guard_without) = run(false);
    println!("fidelity guard with limits: {guard_with_limits:?}; without: {guard_without:?}");
    println!(
        "isolation: 200 Mbit/s, 2 ms link beside {} busy loops in {} nodes: {:.1} Mbit/s with limits (50m each), {:.1} Mbit/s without (expected {:.1})",
        BUSY.len() * LOOPS,
        BUSY.len(),
        with_limits / 1e6,
        without / 1e6,
        expected / 1e6
    );
    let error = (with_limits - expected) / expected;
    assert!(
        error.abs() <= 0.03,
        "with CPU limits the link ran at {:.1} Mbit/s ({:+.1}%)",
        with_limits / 1e6,
        error * 100.0
    );
    assert!(
        without < 0.9 * with_limits,
        "without limits the busy nodes should take the link's CPU, yet it ran at {:.1} Mbit/s: the experiment does not discriminate",
        without / 1e6
    );
    // The guard notices busy nodes taking the agents' CPU by itself. With
    // limits the link keeps its rate, but the busy loops still run in CFS
    // slices of a few ms, so some packets leave 1-4 ms late: the delay is not
    // faithful there, and the guard may say so (printed above, not asserted).
    assert!(
        guard_without.iter().any(|e| e.starts_with("a-b a→b")),
        "the link lost {:.0}% to busy nodes and the guard said nothing: {guard_without:?}",
        (1.0 - without / expected) * 100.0
    );
}

/// The node's group holds its processes and carries its limits (cgroup v1
/// `cpu.cfs_quota_us`/`memory.limit_in_bytes` or v2 `cpu.max`/`memory.max`,
/// whichever this host mounts), and the memory limit is enforced: a process
/// in the node that allocates 256 MiB is killed, and the group records it.
fn node_group_is_limited(env: &Env, node: &str, busy: &[(&str, u32)]) {
    use std::path::Path;
    let group = nextmini_operator::runtime::names::netns("iso", node);
    let read = |path: &Path| {
        std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .trim()
            .to_string()
    };
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let (cpu_dir, memory_dir) = if v2 {
        let dir = Path::new("/sys/fs/cgroup/nextmini").join(&group);
        (dir.clone(), dir)
    } else {
        (
            Path::new("/sys/fs/cgroup/cpu/nextmini").join(&group),
            Path::new("/sys/fs/cgroup/memory/nextmini").join(&group),
        )
    };
    if v2 {
        assert_eq!(read(&cpu_dir.join("cpu.max")), "5000 100000");
        assert_eq!(read(&memory_dir.join("memory.max")), "67108864");
    } else {
        assert_eq!(read(&cpu_dir.join("cpu.cfs_quota_us")), "5000");
        assert_eq!(read(&cpu_dir.join("cpu.cfs_period_us")), "100000");
        assert_eq!(read(&memory_dir.join("memory.limit_in_bytes")), "67108864");
    }
    for dir in [&cpu_dir, &memory_dir] {
        let members = read(&dir.join("cgroup.procs"));
        for (_, pid) in busy.iter().filter(|(n, _)| *n == node) {
            // spawn_in's pid is `nextmini exec`'s; the loop is its child or itself.
            let mut family = vec![pid.to_string()];
            if let Ok(children) =
                std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            {
                family.extend(children.split_whitespace().map(str::to_string));
            }
            assert!(
                family.iter().any(|p| members.lines().any(|m| m == p)),
                "{node}'s busy loop (pid {pid}, children {family:?}) is not in {}",
                dir.display()
            );
        }
    }
    let ooms = |dir: &Path| -> u64 {
        if v2 {
            read(&dir.join("memory.events"))
                .lines()
                .find_map(|l| l.strip_prefix("oom_kill "))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        } else {
            read(&dir.join("memory.failcnt")).parse().unwrap_or(0)
        }
    };
    let before = ooms(&memory_dir);
    let out = env.exec(
        node,
        &[
            "python3",
            "-c",
            "b = bytearray(256 << 20); print('allocated', len(b))",
        ],
    );
    assert!(
        !out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("allocated"),
        "a 256 MiB allocation in a 64 MiB node succeeded: {out:?}"
    );
    assert!(
        ooms(&memory_dir) > before,
        "the node's memory group recorded no limit hit"
    );
}

/// What the UDP probe (support/udp_probe.py) saw on one port.
struct Probe {
    received: u64,
    distinct: u64,
    bytes: u64,
    seqs: Vec<u64>,
    delays_ms: Vec<f64>,
}

/// Sends `count` datagrams per port from a to b, one round every
/// `interval_ms`, and returns what b received on each port.
fn probe(env: &mut Env, count: u32, interval_ms: f64, ports: &[u16]) -> Vec<Probe> {
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let script = repo_path("e2e/tests/support/udp_probe.py");
    let script = script.to_str().expect("path");
    let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = env.state_dir.join(format!("probe-{run}.json"));
    let out_arg = out.to_str().expect("path").to_string();
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let mut receiver = vec!["python3", script, "receive", &out_arg, "2"];
    receiver.extend(ports.iter().map(String::as_str));
    env.spawn_in("b", &receiver);
    let first = format!(":{} ", ports[0]);
    env.wait_for("the probe receiver", Duration::from_secs(10), || {
        String::from_utf8_lossy(&env.exec("b", &["ss", "-lun"]).stdout).contains(&first)
    });
    let (count, interval) = (count.to_string(), interval_ms.to_string());
    let mut sender = vec!["python3", script, "send", "b", &count, &interval];
    sender.extend(ports.iter().map(String::as_str));
    let sent = env.exec("a", &sender);
    assert!(sent.status.success(), "probe sender: {sent:?}");
    env.wait_for("the probe's report", Duration::from_secs(20), || {
        out.exists()
    });
    std::thread::sleep(Duration::from_millis(100)); // written whole before it is read
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("report")).expect("json");
    ports
        .iter()
        .map(|p| {
            let r = &report[p.as_str()];
            Probe {
                received: r["received"].as_u64().unwrap_or(0),
                distinct: r["distinct"].as_u64().unwrap_or(0),
                bytes: r["bytes"].as_u64().unwrap_or(0),
                seqs: r["seqs"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|v| v.as_u64()).collect())
                    .unwrap_or_default(),
                delays_ms: r["delays_ms"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|v| v.as_f64()).collect())
                    .unwrap_or_default(),
            }
        })
        .collect()
}

fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// Checksum failures the kernel of `node` counted (IP headers and UDP).
fn checksum_errors(env: &Env, node: &str) -> u64 {
    let snmp =
        String::from_utf8_lossy(&env.exec(node, &["cat", "/proc/net/snmp"]).stdout).into_owned();
    let field = |proto: &str, name: &str| -> u64 {
        let mut lines = snmp.lines().filter(|l| l.starts_with(&format!("{proto}:")));
        let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
            return 0;
        };
        names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0)
    };
    field("Ip", "InHdrErrors") + field("Udp", "InCsumErrors")
}

/// The impairments and schedulers beside rate, delay and loss, measured on live
/// UDP traffic through two agents: the one-way delay distribution under jitter,
/// the share of reordered, duplicated and corrupted datagrams, and the split
/// of a congested link between two classes under WRR and DRR.
#[test]
fn impairments_and_schedulers_match_their_configuration() {
    let mut env = Env::new("impair");
    let mut table = vec![
        "| what | configured | measured |".to_string(),
        "|---|---|---|".to_string(),
    ];
    apply(
        &env,
        "imp",
        &manifest("imp", &[("a", ""), ("b", "")], &[("a-b", "a", "b", "")]),
    );
    let base = mean_std(&probe(&mut env, 200, 5.0, &[9000])[0].delays_ms).0;
    table.push(format!("| one-way delay, unimpaired | - | {base:.3} ms |"));

    let link = |extra: &str| manifest("imp", &[("a", ""), ("b", "")], &[("a-b", "a", "b", extra)]);
    // Jitter: 20 ms ± 5 ms, sparse enough that FIFO release never reorders.
    for (dist, sigma) in [("uniform", 5.0 / 3f64.sqrt()), ("normal", 5.0 * 0.986)] {
        apply(
            &env,
            "imp",
            &link(&format!(
                "delay: 20ms\njitter: 5ms\njitterDistribution: {dist}\n"
            )),
        );
        let p = &probe(&mut env, 400, 10.0, &[9000])[0];
        let (mean, std) = mean_std(&p.delays_ms);
        // Nothing can arrive early; lateness beyond the jitter's reach is the
        // receiving host's scheduling, so the top is read at the 98th percentile:
        // inside a full `make test`, 4 of 400 datagrams once read 2 ms late
        // (p99 27.0 ms for uniform 15–25 ms).
        let lo = p.delays_ms.iter().copied().fold(f64::INFINITY, f64::min);
        let mut sorted = p.delays_ms.clone();
        sorted.sort_by(f64::total_cmp);
        let hi = sorted[sorted.len() * 98 / 100];
        table.push(format!(
            "| jitter 5 ms {dist} on 20 ms (one-way mean, σ, min–p98) | 20 ms, σ {sigma:.2} ms | {:.2} ms, σ {std:.2} ms, {lo:.1}–{hi:.1} ms |",
            mean - base
        ));
        assert_eq!(p.distinct, 400, "{dist}: datagrams lost");
        // The receiver is a Python process: on a busy host it reads late by a
        // fraction of a millisecond, so the mean gets 1 ms of room.
        assert!(
            (mean - base - 20.0).abs() <= 1.0,
            "{dist}: mean {mean:.2} ms"
        );
        assert!(
            (std - sigma).abs() <= 0.15 * sigma,
            "{dist}: σ {std:.2} ms, configured {sigma:.2}"
        );
        let reach = if dist == "uniform" { 5.0 } else { 15.0 };
        assert!(
            lo >= 20.0 - reach - 0.2 && hi <= 20.0 + reach + base + 1.0,
            "{dist}: {lo:.2}–{hi:.2} ms"
        );
    }
    // Reorder: 10% of datagrams skip the 10 ms delay (netem's rule).
    apply(&env, "imp", &link("delay: 10ms\nreorder: 10%\n"));
    let p = &probe(&mut env, 2000, 2.0, &[9000])[0];
    let early = p.delays_ms.iter().filter(|d| **d < 5.0).count() as f64 / 2000.0;
    table.push(format!(
        "| reorder 10% (datagrams that skipped the delay) | 10% | {:.2}% |",
        early * 100.0
    ));
    assert_eq!(p.distinct, 2000, "reorder: datagrams lost");
    assert!(
        (early - 0.10).abs() <= 0.02,
        "reorder: {:.2}%",
        early * 100.0
    );
    // Duplicate and corrupt: shares of 2,000 datagrams.
    apply(&env, "imp", &link("duplicate: 5%\n"));
    let p = &probe(&mut env, 2000, 1.0, &[9000])[0];
    let dup = (p.received - p.distinct) as f64 / 2000.0;
    table.push(format!("| duplicate 5% | 5% | {:.2}% |", dup * 100.0));
    assert_eq!(p.distinct, 2000, "duplicate: datagrams lost");
    assert!(
        (dup - 0.05).abs() <= 0.015,
        "duplicate: {:.2}%",
        dup * 100.0
    );
    apply(&env, "imp", &link("corrupt: 5%\n"));
    let errors_before = checksum_errors(&env, "b");
    let p = &probe(&mut env, 2000, 1.0, &[9000])[0];
    let missing = 2000 - p.distinct;
    let errors = checksum_errors(&env, "b") - errors_before;
    table.push(format!(
        "| corrupt 5% (datagrams the receiver's kernel dropped; its checksum errors) | 5% | {:.2}% ({errors} checksum errors) |",
        missing as f64 / 20.0
    ));
    assert!(
        (missing as f64 / 2000.0 - 0.05).abs() <= 0.015,
        "corrupt: {missing} of 2000 missing"
    );
    assert!(
        errors * 10 >= missing * 8,
        "corrupt: {missing} missing, {errors} checksum errors"
    );
    // WRR and DRR: two classes, each offering about the link's rate; 3:1.
    for (name, scheduler) in [
        ("wrr weights [3, 1]", "wrr: {weights: [3, 1]}"),
        ("drr quantum [3000, 1000]", "drr: {quantum: [3000, 1000]}"),
    ] {
        apply(
            &env,
            "imp",
            &link(&format!(
                "rate: 8Mbit\nqueue:\n  limit: 100pkt\nscheduler: {{{scheduler}}}\nclasses:\n  - {{queue: 0, dstPort: 9001}}\n"
            )),
        );
        let p = probe(&mut env, 3000, 1.0, &[9001, 9002]);
        // Datagrams sent in the middle second: both queues are full at its start
        // and its end, so what each class got in is what it was served (the
        // first second adds each queue's fill, the last the drained tail).
        let steady = |q: &Probe| q.seqs.iter().filter(|s| (1000..2000).contains(*s)).count() as f64;
        let share = steady(&p[0]) / steady(&p[1]).max(1.0);
        let mbit = (p[0].bytes + p[1].bytes) as f64 * 8.0 / 3.0 / 1e6;
        table.push(format!(
            "| {name}, 8 Mbit/s, both classes backlogged (datagrams class 0 : class 1) | 3 : 1 | {share:.2} : 1 ({mbit:.2} Mbit/s of UDP payload) |"
        ));
        assert!((share - 3.0).abs() <= 0.25, "{name}: {share:.2} : 1");
    }
    println!("{}", table.join("\n"));
}
