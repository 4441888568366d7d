//! Local namespace mode, end to end: line3 (a — b — c) carries ping and a 50 MB
//! HTTP transfer made by unmodified applications; the bytes are seen on b's
//! counters in PostgreSQL; the hub can die and come back mid-transfer; `down`
//! and a re-`up` after kill -9 of everything leave nothing behind.

use nextmini_e2e::{
    Env, agent_pids_of, interfaces_of, is_running, kill9, namespaces_of, repo_path, sha256_file,
    write_random_file,
};
use std::process::Stdio;
use std::time::{Duration, Instant};

const BIG: usize = 50 * 1024 * 1024;

fn assert_nothing_left(env: &Env, when: &str) {
    assert_eq!(
        namespaces_of("line3"),
        Vec::<String>::new(),
        "namespaces left {when}"
    );
    assert_eq!(
        interfaces_of("line3"),
        Vec::<String>::new(),
        "interfaces left {when}"
    );
    assert_eq!(
        agent_pids_of("line3"),
        Vec::<i32>::new(),
        "agent processes left {when}"
    );
    let hub_alive = env.hub_pid().is_some_and(is_running);
    assert!(!hub_alive, "hub still running {when}");
}

fn counters_of(env: &Env, node: &str) -> Vec<(String, i64, i64)> {
    env.psql(&format!(
        "SELECT c.link, c.tx_bytes, c.rx_bytes FROM link_counters c JOIN topologies t ON t.id = c.topology_id \
         WHERE t.name = 'line3' AND c.node = '{node}' ORDER BY c.link"
    ))
    .lines()
    .filter_map(|l| {
        let mut f = l.split('|');
        Some((f.next()?.to_string(), f.next()?.parse().ok()?, f.next()?.parse().ok()?))
    })
    .collect()
}

#[test]
fn line3_end_to_end() {
    let mut env = Env::new("line3");
    let line3 = repo_path("manifests/examples/line3.yaml");
    let line3 = line3.to_str().expect("utf-8 path");
    let www = env.state_dir.join("www");
    std::fs::create_dir_all(&www).expect("www dir");
    write_random_file(&www.join("big"), BIG, 0);
    let expected = sha256_file(&www.join("big"));

    // A manifest with a link to an unknown node is refused before anything exists.
    let bad = env.state_dir.join("bad.yaml");
    std::fs::write(
        &bad,
        std::fs::read_to_string(line3)
            .expect("line3")
            .replace("endpoints: [b, c]", "endpoints: [b, z]"),
    )
    .expect("bad manifest");
    let out = env.run(&["up", "-f", bad.to_str().expect("path")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "bad manifest accepted");
    for needle in ["bad.yaml", "b-c", "spec.endpoints", "z"] {
        assert!(
            stderr.contains(needle),
            "error should name {needle:?}: {stderr}"
        );
    }
    assert!(
        namespaces_of("line3").is_empty(),
        "a rejected manifest created namespaces"
    );
    assert!(
        env.hub_pid().is_none(),
        "a rejected manifest started the hub"
    );

    let started = Instant::now();
    env.ok(&["up", "-f", line3]);
    println!("line3 up in {:?}", started.elapsed());
    let status: serde_json::Value =
        serde_json::from_str(&env.ok(&["status", "-o", "json"])).expect("status json");
    let nodes = status["topologies"][0]["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 3);
    assert!(
        nodes.iter().all(|n| n["agent_state"] == "connected"),
        "{status}"
    );

    env.serve_http("c", &www);
    env.wait_for_http("a", "c");

    let ping = env.exec("a", &["ping", "-c", "3", "-W", "2", "c"]);
    assert!(
        ping.status.success(),
        "ping a -> c failed: {}",
        String::from_utf8_lossy(&ping.stdout)
    );

    let fetched = env.state_dir.join("fetched");
    let t = Instant::now();
    let curl = env.exec(
        "a",
        &[
            "curl",
            "-sS",
            "--fail",
            "--max-time",
            "120",
            "-o",
            fetched.to_str().expect("path"),
            "http://c:8000/big",
        ],
    );
    assert!(
        curl.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&curl.stderr)
    );
    let secs = t.elapsed().as_secs_f64();
    println!(
        "50 MiB a <- c in {secs:.2} s ({:.0} Mbit/s)",
        BIG as f64 * 8.0 / secs / 1e6
    );
    assert_eq!(
        sha256_file(&fetched),
        expected,
        "the file arrived corrupted"
    );

    // The bytes crossed b: b sent them to a on a-b, and received them from c on b-c.
    env.wait_for(
        "b's counters in PostgreSQL",
        Duration::from_secs(10),
        || {
            let c = counters_of(&env, "b");
            let tx_ab = c.iter().find(|r| r.0 == "a-b").map_or(0, |r| r.1);
            let rx_bc = c.iter().find(|r| r.0 == "b-c").map_or(0, |r| r.2);
            tx_ab >= BIG as i64 && rx_bc >= BIG as i64
        },
    );

    // Kill the hub mid-transfer: forwarding goes on, agents reconnect to the new hub.
    let fetched2 = env.state_dir.join("fetched2");
    let mut slow = env
        .command(&[
            "exec",
            "a",
            "--",
            "curl",
            "-sS",
            "--fail",
            "--max-time",
            "120",
            "--limit-rate",
            "10M",
            "-o",
            fetched2.to_str().expect("path"),
            "http://c:8000/big",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("slow curl");
    std::thread::sleep(Duration::from_secs(1));
    let hub = env.hub_pid().expect("hub pid");
    kill9(hub);
    let before_restart = env.psql("SELECT now()");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        agent_pids_of("line3").len(),
        3,
        "agents must survive the hub"
    );
    let restarted = Instant::now();
    env.ok(&["hub", "--background"]);
    env.wait_for("agents to resync with the new hub", Duration::from_secs(10), || {
        env.psql(&format!(
            "SELECT count(*) FROM nodes WHERE agent_state = 'connected' AND last_seen > '{before_restart}'"
        )) == "3"
    });
    println!(
        "agents resynced {:?} after the hub came back",
        restarted.elapsed()
    );
    let done = slow.wait().expect("slow curl");
    assert!(done.success(), "transfer across the hub restart failed");
    assert_eq!(sha256_file(&fetched2), expected);

    env.ok(&["down"]);
    assert_nothing_left(&env, "after down");
    env.ok(&["db", "start"]);
    assert_eq!(
        env.psql("SELECT count(*) FROM topologies"),
        "0",
        "rows left after down"
    );
    assert_eq!(
        env.psql("SELECT count(*) FROM nodes"),
        "0",
        "rows left after down"
    );

    // kill -9 of everything, then `down`, then `up` again after another kill -9.
    for round in 0..2 {
        env.ok(&["up", "-f", line3]);
        for pid in agent_pids_of("line3") {
            kill9(pid);
        }
        kill9(env.hub_pid().expect("hub pid"));
        kill9(env.postgres_pid().expect("postgres pid"));
        std::thread::sleep(Duration::from_millis(500));
        if round == 0 {
            let out = env.ok(&["down"]);
            println!("down after kill -9:\n{out}");
            assert_nothing_left(&env, "after down following kill -9");
        }
    }
    env.ok(&["up", "-f", line3]);
    let ping = env.exec("a", &["ping", "-c", "1", "-W", "2", "c"]);
    assert!(ping.status.success(), "ping after re-up failed");
    assert_eq!(
        env.psql("SELECT count(*) FROM nodes"),
        "3",
        "stale node rows after re-up"
    );
    // `--all` also sweeps what no database remembers: a namespace and interface
    // named like ours that some crashed run left behind.
    env.ok(&["down"]);
    assert_nothing_left(&env, "after the final down");
    let stray = format!(
        "{}z",
        nextmini_operator::runtime::names::netns_prefix("line3")
    );
    let made = std::process::Command::new("ip")
        .args(["netns", "add", &stray])
        .status();
    assert!(made.is_ok_and(|s| s.success()));
    env.ok(&["down", "--all"]);
    assert!(
        namespaces_of("line3").is_empty(),
        "`down --all` left {stray}"
    );
}
