//! Registered schemes on live traffic (node-agent/src/sched/schemes): the example
//! `manifests/examples/pfabric.yaml` as a user brings it up, with kernel TCP,
//! iperf3, curl and python's http.server. A long transfer fills the bottleneck's
//! queue; then
//! - pFabric lets a short download overtake it, where FCFS makes it wait behind
//!   the queue;
//! - PIE keeps the queueing delay (ping's RTT through the queue) near its target,
//!   where tail drop lets it grow to the queue's limit.
//!
//! Each scheme is switched in by re-applying the manifest, as a user would.

use nextmini_e2e::{Env, ping_avg_ms, repo_path, write_random_file};
use std::time::{Duration, Instant};

const TOPOLOGY: &str = "pfabric";
/// What the example's bottleneck does from switch to receiver, as YAML.
const PFABRIC: &str = "scheduler:
      scheme:
        name: pfabric";
const MOUSE_BYTES: usize = 150_000;

/// The example with the bottleneck's backward scheduler (and what follows it in
/// the YAML) replaced by `backward`.
fn manifest(backward: &str) -> String {
    let example = std::fs::read_to_string(repo_path("manifests/examples/pfabric.yaml"))
        .expect("the example manifest");
    if backward == PFABRIC {
        return example;
    }
    let start = example.find(PFABRIC).expect("the example names pfabric");
    let end = example[start..]
        .find("---")
        .map_or(example.len(), |i| start + i);
    format!("{}{backward}\n{}", &example[..start], &example[end..])
}

/// curl in the receiver for `file` from the sender's `port`, printing the seconds
/// it took.
fn fetch(env: &Env, port: u16, file: &str, max_secs: u32) -> std::process::Output {
    let url = format!("http://sender:{port}/{file}");
    let max = max_secs.to_string();
    env.exec(
        "receiver",
        &[
            "curl",
            "-s",
            "--fail",
            "-o",
            "/dev/null",
            "--max-time",
            &max,
            "-w",
            "%{time_total}",
            &url,
        ],
    )
}

/// Seconds curl in the receiver takes for `file` from the sender's `port`.
fn download_secs(env: &Env, port: u16, file: &str) -> f64 {
    let out = fetch(env, port, file, 30);
    assert!(
        out.status.success(),
        "curl of {file} from port {port} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("curl's time_total")
}

/// While a long transfer from port 8001 fills the bottleneck's queue: how long
/// the short download from port 8003 takes, and ping's RTT through the queue
/// (`None` under pFabric, which serves unlisted traffic only when the link is
/// idle: pings starve behind the long transfer, as they should).
fn under_load(env: &mut Env, what: &str, ping: bool) -> (f64, Option<f64>) {
    let log = env
        .state_dir
        .join(format!("{}.iperf3.log", what.replace([' ', ','], "-")));
    let log = log.to_str().expect("UTF-8 path").to_owned();
    // iperf3 -R: the sender sends from port 8001, UDP at twice the bottleneck's
    // rate, so the queue stands full (a TCP flow here keeps it short: its
    // window grows slowly at this RTT).
    let elephant = env.spawn_in(
        "receiver",
        &[
            "iperf3",
            "-c",
            "sender",
            "-p",
            "8001",
            "-R",
            "-u",
            "-b",
            "40M",
            "-l",
            "1200",
            "-t",
            "8",
            "--logfile",
            &log,
        ],
    );
    let started = Instant::now();
    // Let the long flow fill the queue first.
    std::thread::sleep(Duration::from_millis(1500));
    let rtt_ms = ping.then(|| ping_avg_ms(env, "receiver", "sender", 10));
    let loaded_for = started.elapsed();
    assert!(
        nextmini_e2e::is_running(i32::try_from(elephant).unwrap_or(i32::MAX)),
        "{what}: the long transfer ended after {loaded_for:?}, before the short one started: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let mouse = download_secs(env, 8003, "mouse");
    println!(
        "{what}: short download {:.0} ms, ping RTT {} under load",
        mouse * 1e3,
        rtt_ms.map_or("not measured".into(), |r| format!("{r:.1} ms"))
    );
    // Wait for the long transfer to end, so the next phase starts with an empty queue.
    env.wait_for("the long transfer to end", Duration::from_secs(30), || {
        !nextmini_e2e::is_running(i32::try_from(elephant).unwrap_or(i32::MAX))
    });
    let report = std::fs::read_to_string(&log).unwrap_or_default();
    let received = report.lines().rev().find(|l| l.contains("receiver"));
    println!(
        "{what}: the long transfer: {}",
        received.unwrap_or("no report").trim()
    );
    (mouse, rtt_ms)
}

#[test]
fn pfabric_and_pie_change_what_traffic_sees() {
    let mut env = Env::new("schemes");
    env.apply_yaml(TOPOLOGY, &manifest(PFABRIC));
    let files = env.state_dir.join("files");
    std::fs::create_dir_all(&files).expect("files dir");
    write_random_file(&files.join("mouse"), MOUSE_BYTES, 2);
    let dir = files.to_str().expect("UTF-8 path").to_owned();
    env.spawn_in("sender", &["iperf3", "-s", "-p", "8001"]);
    env.spawn_in(
        "sender",
        &["python3", "-m", "http.server", "8003", "--directory", &dir],
    );
    env.wait_for("iperf3's server", Duration::from_secs(20), || {
        env.exec("sender", &["sh", "-c", "ss -ltn | grep -q ':8001 '"])
            .status
            .success()
    });
    env.wait_for("the HTTP server", Duration::from_secs(20), || {
        fetch(&env, 8003, "mouse", 2).status.success()
    });
    let idle = download_secs(&env, 8003, "mouse");
    println!("idle: short download {:.0} ms", idle * 1e3);

    let (pfabric_mouse, _) = under_load(&mut env, "pfabric", false);
    env.apply_yaml(TOPOLOGY, &manifest("scheduler: {fcfs: {}}"));
    let (fcfs_mouse, fcfs_rtt) = under_load(&mut env, "fcfs, taildrop", true);
    env.apply_yaml(
        TOPOLOGY,
        &manifest(
            "scheduler: {fcfs: {}}\n    queue:\n      aqm:\n        scheme: {name: pie, settings: {targetMs: 5}}",
        ),
    );
    let (_, pie_rtt) = under_load(&mut env, "fcfs, PIE 5 ms", true);
    let (fcfs_rtt, pie_rtt) = (fcfs_rtt.unwrap_or(0.0), pie_rtt.unwrap_or(f64::MAX));

    assert!(
        pfabric_mouse * 3.0 < fcfs_mouse,
        "pFabric should let the short download overtake: {pfabric_mouse:.3} s vs {fcfs_mouse:.3} s under FCFS"
    );
    assert!(
        pfabric_mouse < idle * 3.0 + 0.1,
        "under pFabric the short download should barely notice the long one: {pfabric_mouse:.3} s vs {idle:.3} s idle"
    );
    // The path's own RTT is 4 ms (1 ms per link and direction); PIE aims for 5 ms
    // of queueing on top.
    assert!(
        pie_rtt < 40.0 && pie_rtt * 4.0 < fcfs_rtt,
        "PIE should hold the queueing delay near 5 ms: RTT {pie_rtt:.1} ms vs {fcfs_rtt:.1} ms with tail drop"
    );
}
