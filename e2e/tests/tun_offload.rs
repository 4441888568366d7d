//! TUN offloads end to end, on a line a — b — c with kernel TCP (curl ←
//! python http.server, iperf3): super-packets cross unimpaired links whole and
//! arrive intact, spliced through b's transit hop without entering user space
//! (cut-through); a delay added and removed under a transfer switches b
//! between splicing and its pipeline with no byte lost and no reconnection; a
//! link that drops or shapes still acts on MTU-sized packets, so its loss rate
//! and its rate are those configured.

use nextmini_e2e::{
    Env, iperf3, link_counter, sha256_file, tcp_goodput, tcp_payload_ratio, write_random_file,
};
use std::io::{Read, Write};
use std::time::Duration;

const TOPOLOGY: &str = "offl";
const MTU: u32 = 1400;
const BIG: usize = 50 * 1024 * 1024;

/// a — b — c; `bc` is the YAML of link b-c's parameters.
fn manifest(bc: &str) -> String {
    let mut out = format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata:\n  name: {TOPOLOGY}\nspec:\n  dataplane:\n    mtu: {MTU}\n  nodes:\n    - name: a\n    - name: b\n    - name: c\n\
         ---\napiVersion: nextmini.io/v1alpha1\nkind: Link\nmetadata:\n  name: a-b\nspec:\n  topology: {TOPOLOGY}\n  endpoints: [a, b]\n\
         ---\napiVersion: nextmini.io/v1alpha1\nkind: Link\nmetadata:\n  name: b-c\nspec:\n  topology: {TOPOLOGY}\n  endpoints: [b, c]\n"
    );
    for line in bc.lines() {
        out.push_str(&format!("  {line}\n"));
    }
    out
}

fn apply(env: &Env, yaml: &str) {
    env.apply_yaml(TOPOLOGY, yaml);
}

/// The agent's counter `name{…label…}` (e.g. `direction="rx"`), read from its
/// metrics socket.
fn agent_counter(env: &Env, node: &str, name: &str, label: &str) -> u64 {
    let socket = env
        .state_dir
        .join(format!("metrics/{TOPOLOGY}/{node}.sock"));
    let mut stream = std::os::unix::net::UnixStream::connect(&socket)
        .unwrap_or_else(|e| panic!("{}: {e}", socket.display()));
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
        .expect("request");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("response");
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or_else(|| panic!("no {name} {label} in the metrics of {node}:\n{text}"))
}

fn super_packets(env: &Env, node: &str, direction: &str) -> u64 {
    agent_counter(
        env,
        node,
        "nextmini_agent_tun_super_packets_total",
        &format!("direction=\"{direction}\""),
    )
}

/// Bytes b spliced from a-b onto b-c.
fn spliced_at_b(env: &Env) -> u64 {
    agent_counter(
        env,
        "b",
        "nextmini_link_spliced_bytes_total",
        "link=\"b-c\"",
    )
}

fn connects_at_b(env: &Env) -> u64 {
    ["a-b", "b-c"]
        .iter()
        .map(|l| {
            agent_counter(
                env,
                "b",
                "nextmini_link_connects_total",
                &format!("link=\"{l}\""),
            )
        })
        .sum()
}

/// Fetches the big file from a's web server in c and returns its sha256.
fn fetch(env: &Env, out: &std::path::Path) -> String {
    fetch_at(env, out, None)
}

/// [`fetch`], at most `limit` (curl's `--limit-rate`, e.g. "10M").
fn fetch_at(env: &Env, out: &std::path::Path, limit: Option<&str>) -> String {
    let _ = std::fs::remove_file(out);
    let mut args = vec![
        "curl",
        "-s",
        "--fail",
        "--max-time",
        "120",
        "-o",
        out.to_str().expect("path"),
    ];
    if let Some(limit) = limit {
        args.extend(["--limit-rate", limit]);
    }
    args.push("http://a:8000/big");
    let fetched = env.exec("c", &args);
    assert!(
        fetched.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&fetched.stderr)
    );
    sha256_file(out)
}

#[test]
fn super_packets_cross_clean_links_whole_and_impaired_links_act_per_packet() {
    let mut env = Env::new("offload");
    apply(&env, &manifest(""));
    let www = env.state_dir.join("www");
    std::fs::create_dir_all(&www).expect("www dir");
    write_random_file(&www.join("big"), BIG, 7);
    let expected = sha256_file(&www.join("big"));
    let got = env.state_dir.join("got");
    env.serve_http("a", &www);
    env.wait_for_http("c", "a");

    // Unimpaired links: a's kernel hands its TUN reader super-packets, b
    // forwards them whole, c's kernel takes them whole, and every byte arrives.
    let (a_rx, c_tx, spliced0) = (
        super_packets(&env, "a", "rx"),
        super_packets(&env, "c", "tx"),
        spliced_at_b(&env),
    );
    assert_eq!(fetch(&env, &got), expected, "50 MiB over clean links");
    let a_read = super_packets(&env, "a", "rx") - a_rx;
    let c_written = super_packets(&env, "c", "tx") - c_tx;
    let spliced = spliced_at_b(&env) - spliced0;
    println!(
        "clean links: a read {a_read} super-packets, c wrote {c_written} whole, b spliced {:.1} MiB of {:.1}",
        spliced as f64 / 1048576.0,
        BIG as f64 / 1048576.0
    );
    assert!(
        a_read > 100,
        "a's TUN gave {a_read} super-packets: is offload on?"
    );
    assert!(c_written > 100, "c wrote {c_written} super-packets whole");
    assert!(
        spliced >= BIG as u64 / 2,
        "b spliced {spliced} of {BIG} bytes: the transit hop copied them"
    );

    // Live switch: b-c gets a delay in the middle of a paced transfer and loses
    // it again; every byte arrives, no connection is replaced, and the hop
    // splices only while b-c is transparent.
    let connects0 = connects_at_b(&env);
    let (during, after) = std::thread::scope(|scope| {
        let transfer = scope.spawn(|| fetch_at(&env, &got, Some("10M")));
        std::thread::sleep(Duration::from_millis(1200));
        apply(&env, &manifest("delay: 5ms\n"));
        std::thread::sleep(Duration::from_millis(300));
        let during = spliced_at_b(&env);
        std::thread::sleep(Duration::from_millis(800));
        let after = spliced_at_b(&env);
        apply(&env, &manifest(""));
        assert_eq!(
            transfer.join().expect("transfer thread"),
            expected,
            "50 MiB across two live switches"
        );
        (during, after)
    });
    assert_eq!(during, after, "b spliced onto b-c while it had a delay");
    // The transfer may have ended with the switch back; the next one splices.
    assert_eq!(fetch(&env, &got), expected, "50 MiB after the switches");
    assert!(
        spliced_at_b(&env) > after,
        "b did not splice again once the delay was gone"
    );
    assert_eq!(connects_at_b(&env), connects0, "a link reconnected");

    // 1% loss on b-c: every MTU-sized packet has its own 1% chance. Had b
    // dropped whole super-packets, 1% of them would be ~1/40 of the segments.
    apply(&env, &manifest("loss: 1%\n"));
    // The clean transfer's last bytes reach the store with b's next report; a
    // baseline read before it would count them as sent through the lossy link.
    std::thread::sleep(Duration::from_secs(2));
    let (tx0, lost0) = (
        link_counter(&env, TOPOLOGY, "b-c", "b", "tx_bytes"),
        link_counter(&env, TOPOLOGY, "b-c", "b", "drops_loss"),
    );
    let c_tx = super_packets(&env, "c", "tx");
    assert_eq!(fetch(&env, &got), expected, "50 MiB over a lossy link");
    assert_eq!(
        super_packets(&env, "c", "tx"),
        c_tx,
        "a super-packet crossed a lossy link whole"
    );
    // Counters reach the store with the agents' next report.
    env.wait_for(
        "b's report of the transfer",
        Duration::from_secs(15),
        || link_counter(&env, TOPOLOGY, "b-c", "b", "tx_bytes") - tx0 >= BIG as i64,
    );
    std::thread::sleep(Duration::from_secs(2));
    let sent = (link_counter(&env, TOPOLOGY, "b-c", "b", "tx_bytes") - tx0) as f64;
    let lost = (link_counter(&env, TOPOLOGY, "b-c", "b", "drops_loss") - lost0) as f64;
    // Nearly every packet of the transfer is a full-sized one.
    let offered = sent / f64::from(MTU) + lost;
    let rate = lost / offered;
    println!(
        "loss 1% on b-c: {lost} of ~{offered:.0} packets dropped ({:.3}%)",
        rate * 100.0
    );
    assert!(
        (0.008..=0.012).contains(&rate),
        "loss rate {:.3}% is not 1% ± 20%: the link did not act per packet",
        rate * 100.0
    );

    // A shaped link: the token bucket meters MTU-sized packets, so TCP goodput
    // is the configured rate less headers, within 3%.
    apply(&env, &manifest("rate: 200Mbit\nqueue:\n  limit: 300pkt\n"));
    env.spawn_in("c", &["iperf3", "-s", "-p", "5201"]);
    env.wait_for("iperf3 server", Duration::from_secs(10), || {
        env.exec("c", &["sh", "-c", "ss -ltn | grep -q ':5201 '"])
            .status
            .success()
    });
    let report = iperf3(&env, "a", &["-c", "c", "-t", "5", "-O", "1"]);
    let expected_rate = 200e6 * tcp_payload_ratio(MTU);
    let measured = tcp_goodput(&report);
    let error = (measured - expected_rate) / expected_rate;
    println!(
        "rate 200 Mbit/s on b-c with offload: {:.2} Mbit/s goodput, expected {:.2} ({:+.2}%)",
        measured / 1e6,
        expected_rate / 1e6,
        error * 100.0
    );
    assert!(
        error.abs() <= 0.03,
        "goodput {measured:.0} vs {expected_rate:.0} ({:+.2}%)",
        error * 100.0
    );
}
