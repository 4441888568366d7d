//! `nextmini capture` on live traffic, read by Debian's tshark: a 20 Mbit/s
//! link with RED (ECN on) carries two ECN-capable CUBIC flows and a non-ECT UDP
//! stream, so the AQM both marks and drops. The capture must be pcapng that
//! tshark reads, and its annotations must be what the link did: every drop and
//! mark the link's own counters saw is in the capture and nothing else, a
//! marked packet carries CE in its captured bytes, and each sent packet's time
//! in the queue is what the bytes ahead of it take at the link's rate.

use nextmini_e2e::{Env, link_counter};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

const TOPOLOGY: &str = "capture";
const RATE_BPS: f64 = 20e6;
const DELAY_NS: u64 = 2_000_000;

fn manifest() -> String {
    format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata:\n  name: {TOPOLOGY}\nspec:\n  \
         nodes: [{{name: a}}, {{name: b}}]\n  links:\n    - endpoints: [a, b]\n      \
         rate: 20Mbit\n      delay: 2ms\n      queue:\n        limit: 100pkt\n        \
         aqm: {{red: {{min: 10, max: 40, maxP: 10%, weight: 0.02, ecn: true}}}}\n"
    )
}

/// Sends 1,000-byte datagrams (not ECN-capable) to argv[1]:9000 at argv[2] bit/s for argv[3] s.
const UDP_SENDER: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
dst, rate, secs = (sys.argv[1], 9000), float(sys.argv[2]), float(sys.argv[3])
per_s, start, sent = rate / 8 / 1028, time.monotonic(), 0
while time.monotonic() - start < secs:
    while sent < int((time.monotonic() - start) * per_s) + 1:
        s.sendto(b"u" * 1000, dst)
        sent += 1
    time.sleep(0.001)
"#;

/// One captured packet as tshark shows it.
#[derive(Debug)]
struct Row {
    time_ns: u64,
    proto: u32,
    ecn: u32,
    cap_len: u32,
    notes: BTreeMap<String, String>,
}

impl Row {
    fn verdict(&self) -> &str {
        self.notes.get("verdict").map_or("", String::as_str)
    }

    fn ns(&self, key: &str) -> Option<u64> {
        let v = self.notes.get(key)?;
        let (s, frac) = v.split_once('.')?;
        Some(s.parse::<u64>().ok()? * 1_000_000_000 + frac.parse::<u64>().ok()?)
    }

    fn number(&self, key: &str) -> u64 {
        self.notes
            .get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("packet without {key}: {self:?}"))
    }
}

/// The packets of `file` (`-` reads `stdin`) through tshark.
fn tshark_rows(file: &str, stdin: Option<Vec<u8>>) -> Vec<Row> {
    let mut child = Command::new("tshark")
        .args(["-r", file, "-T", "fields", "-E", "separator=/t"])
        .args([
            "-e",
            "frame.time_epoch",
            "-e",
            "ip.proto",
            "-e",
            "ip.dsfield.ecn",
        ])
        .args(["-e", "frame.cap_len", "-e", "frame.comment"])
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tshark (scripts/setup.sh --test installs it)");
    if let Some(bytes) = stdin {
        use std::io::Write;
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(&bytes).expect("feeding tshark");
    }
    let out = child.wait_with_output().expect("tshark");
    assert!(
        out.status.success(),
        "tshark could not read the capture: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            assert_eq!(f.len(), 5, "tshark line {line:?}");
            let (secs, frac) = f[0].split_once('.').expect("epoch time");
            let frac = format!("{frac:0<9}");
            Row {
                time_ns: secs.parse::<u64>().expect("seconds") * 1_000_000_000
                    + frac[..9].parse::<u64>().expect("nanoseconds"),
                proto: f[1].parse().unwrap_or(0),
                ecn: f[2].parse().unwrap_or(0),
                cap_len: f[3].parse().expect("cap_len"),
                notes: f[4]
                    .strip_prefix("nextmini ")
                    .unwrap_or_else(|| panic!("packet without annotations: {line:?}"))
                    .split(' ')
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            }
        })
        .collect()
}

/// The counter once the agents' reports stop changing it.
fn settled_counter(env: &Env, column: &str) -> i64 {
    let mut last = link_counter(env, TOPOLOGY, "a-b", "a", column);
    loop {
        std::thread::sleep(Duration::from_millis(1500));
        let now = link_counter(env, TOPOLOGY, "a-b", "a", column);
        if now == last {
            return now;
        }
        last = now;
    }
}

#[test]
fn a_red_link_under_load_has_its_drops_and_marks_annotated() {
    let mut env = Env::new("capture");
    env.apply_yaml(TOPOLOGY, &manifest());
    // ECN-capable TCP from a (Linux only accepts it by default).
    let ecn = env.exec("a", &["sysctl", "-qw", "net.ipv4.tcp_ecn=1"]);
    assert!(ecn.status.success(), "enabling ECN in a");
    env.spawn_in("b", &["iperf3", "-s"]);
    env.spawn_in(
        "b",
        &[
            "python3",
            "-c",
            "import socket,time;s=socket.socket(2,2);s.bind(('',9000));time.sleep(60)",
        ],
    );
    env.wait_for("iperf3 to listen in b", Duration::from_secs(10), || {
        env.exec("b", &["sh", "-c", "ss -ltn | grep -q ':5201 '"])
            .status
            .success()
    });
    let drops_before = settled_counter(&env, "drops_aqm");
    let marks_before = settled_counter(&env, "ecn_marks");

    let file = env.state_dir.join("red.pcapng");
    let file_arg = file.to_str().expect("path").to_string();
    let capture = env
        .command(&["capture", "a-b", "--duration", "7", "-w", &file_arg])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nextmini capture");
    std::thread::sleep(Duration::from_secs(1));
    // A second capture of the same direction is refused while this one runs.
    let second = env.run(&["capture", "a-b", "-c", "1", "-w", "/dev/null"]);
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success() && said.contains("already being captured"),
        "a second capture: {said}"
    );
    let udp = env.spawn_in("a", &["python3", "-c", UDP_SENDER, "b", "3e6", "3"]);
    let tcp = nextmini_e2e::iperf3(&env, "a", &["-c", "b", "-t", "3", "-C", "cubic", "-P", "2"]);
    println!(
        "TCP goodput {:.1} Mbit/s (udp sender pid {udp})",
        nextmini_e2e::tcp_goodput(&tcp) / 1e6
    );
    let ended = capture.wait_with_output().expect("capture ends");
    let said = String::from_utf8_lossy(&ended.stderr);
    assert!(ended.status.success(), "nextmini capture: {said}");
    println!("nextmini capture said: {}", said.trim());

    let rows = tshark_rows(&file_arg, None);
    let count = |v: &str| rows.iter().filter(|r| r.verdict() == v).count() as i64;
    let (sent, marked, dropped) = (
        count("sent"),
        count("sent-ecn-marked"),
        count("dropped-aqm"),
    );
    println!(
        "captured {} packets: {sent} sent, {marked} sent ECN-marked, {dropped} dropped by RED, {} other",
        rows.len(),
        rows.len() as i64 - sent - marked - dropped
    );
    assert!(
        said.contains(&format!("{} packets captured", rows.len())),
        "{said}"
    );
    assert!(
        !said.contains("missed"),
        "the capture missed packets: {said}"
    );

    // Exactly what the link's own counters saw, over the same traffic.
    let drops = settled_counter(&env, "drops_aqm") - drops_before;
    let marks = settled_counter(&env, "ecn_marks") - marks_before;
    println!("link counters over the capture: {drops} RED drops, {marks} ECN marks");
    assert!(
        marked > 0 && dropped > 0,
        "RED must both mark and drop here: {marked} marks, {dropped} drops"
    );
    assert_eq!(
        dropped, drops,
        "RED drops in the capture vs the link's counter"
    );
    assert_eq!(
        marked, marks,
        "ECN marks in the capture vs the link's counter"
    );

    // Marked packets carry CE on the wire; RED drops hit the non-ECT UDP stream.
    for r in rows.iter().filter(|r| r.verdict() == "sent-ecn-marked") {
        assert_eq!(r.ecn, 3, "a packet annotated ECN-marked without CE: {r:?}");
        assert_eq!(r.notes.get("ecn").map(String::as_str), Some("ce"));
    }
    assert!(
        rows.iter()
            .any(|r| r.verdict() == "dropped-aqm" && r.proto == 17),
        "no UDP packet dropped by RED"
    );

    // Times: a sent packet is stamped with its departure, leaves after it
    // arrived and reaches b the link's delay later; the time it queued is what
    // the bytes ahead of it take at 20 Mbit/s.
    let mut errors_us = Vec::new();
    for r in rows.iter().filter(|r| r.verdict().starts_with("sent")) {
        let (enq, dep, del) = (
            r.ns("enqueued").expect("enqueued"),
            r.ns("departed").expect("departed"),
            r.ns("delivered").expect("delivered"),
        );
        assert_eq!(r.time_ns, dep, "timestamp is not the departure: {r:?}");
        assert!(dep >= enq, "left before it arrived: {r:?}");
        assert_eq!(
            del - dep,
            DELAY_NS,
            "delivery is not 2 ms after departure: {r:?}"
        );
        let ahead = r.number("depth_bytes");
        if ahead >= 14_000 {
            let expected_us = ahead as f64 * 8.0 / RATE_BPS * 1e6;
            errors_us.push((dep - enq) as f64 / 1e3 - expected_us);
        }
    }
    assert!(
        errors_us.len() > 100,
        "too few queued packets: {}",
        errors_us.len()
    );
    errors_us.sort_by(f64::total_cmp);
    let median = errors_us[errors_us.len() / 2];
    println!(
        "queueing time minus (bytes ahead / rate), {} packets: median {median:.0} µs",
        errors_us.len()
    );
    // Within one 1,400-byte packet's transmission (560 µs) either way.
    assert!(median.abs() < 600.0, "queueing time off by {median:.0} µs");

    // Bounds and streaming: 40 packets of at most 64 bytes, on standard output.
    let flow = env.spawn_in("a", &["python3", "-c", UDP_SENDER, "b", "2e6", "3"]);
    let piped = env
        .command(&[
            "capture",
            "a-b",
            "-c",
            "40",
            "-s",
            "64",
            "--duration",
            "30",
            "-w",
            "-",
        ])
        .stderr(Stdio::piped())
        .output()
        .expect("nextmini capture -w -");
    assert!(
        piped.status.success(),
        "capture -w -: {}",
        String::from_utf8_lossy(&piped.stderr)
    );
    let streamed = tshark_rows("-", Some(piped.stdout));
    println!(
        "streamed capture (sender pid {flow}): {} packets",
        streamed.len()
    );
    assert_eq!(streamed.len(), 40);
    assert!(streamed.iter().all(|r| r.cap_len <= 64));
    assert!(streamed.iter().any(|r| r.cap_len == 64));

    // A link the topology does not have is named in the refusal.
    let unknown = env.run(&["capture", "x-y", "-w", "/dev/null"]);
    let said = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        !unknown.status.success() && said.contains("no link named x-y"),
        "{said}"
    );
}
