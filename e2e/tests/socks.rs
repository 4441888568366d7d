//! SOCKS5 entry and max mode, end to end: a diamond (a — b — c and a — d — c; the
//! shortest path a → c crosses b, the lower link name) with SOCKS servers on a,
//! listening on host addresses. Real `curl --socks5-hostname`
//! on the host fetches a 20 MiB file from `python3 -m http.server` in c:
//! - normal mode: through a's TUN device and the links, seen on b's link counters;
//! - max mode: spliced a → b → c over the agents' relays, seen on the max-mode
//!   metric and not on the link counters;
//! - username/password: a wrong password is refused, the right one works;
//! - a normal and a max transfer at the same time;
//! - a max-mode synthetic `Flow` through the same relays;
//! - an explicit route in SQL moves max-mode connections to d, as it would packets.
//!
//! Also: a manifest whose SOCKS addresses clash is refused naming the field, and a
//! topology asking for an address another topology holds is refused before
//! anything is made. Runs beside other suites (its own topology name, free ports,
//! and no `down --all`).

use nextmini_e2e::{Env, namespaces_of, sha256_file, write_random_file};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const SIZE: usize = 20 * 1024 * 1024;

/// Ports nobody listens on right now.
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind :0"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("addr").port())
        .collect()
}

fn manifest(topology: &str, ports: &[u16]) -> String {
    format!(
        r#"apiVersion: nextmini.io/v1alpha1
kind: Topology
metadata:
  name: {topology}
spec:
  nodes:
    - name: a
      socks:
        - listen: "127.0.0.1:{normal}"
        - listen: "127.0.0.1:{max}"
          mode: max
        - listen: "127.0.0.1:{auth}"
          users:
            - {{name: alice, password: "s3cret"}}
    - name: b
    - name: c
    - name: d
  links:
    - endpoints: [a, b]
    - endpoints: [b, c]
    - endpoints: [a, d]
    - endpoints: [d, c]
"#,
        normal = ports[0],
        max = ports[1],
        auth = ports[2],
    )
}

/// `curl` on the host through a SOCKS proxy (`socks5h`: the proxy resolves names).
fn curl_via(proxy: &str, url: &str, out: &Path) -> Command {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--fail", "--max-time", "120", "-x", proxy, "-o"])
        .arg(out)
        .arg(url)
        .env_remove("http_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("all_proxy")
        .env_remove("ALL_PROXY")
        .env_remove("no_proxy")
        .env_remove("NO_PROXY");
    cmd
}

fn checked(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fetch through the proxy, verified; returns Mbit/s.
fn fetch(env: &Env, what: &str, proxy: &str, expected: &str) -> f64 {
    let out_file = env.state_dir.join(format!("fetched-{what}"));
    let t = Instant::now();
    let out = curl_via(proxy, "http://c:8000/big", &out_file)
        .output()
        .expect("running curl");
    let secs = t.elapsed().as_secs_f64();
    checked(&format!("curl {what}"), &out);
    assert_eq!(sha256_file(&out_file), expected, "{what}: corrupted");
    let mbps = SIZE as f64 * 8.0 / secs / 1e6;
    println!("{what}: 20 MiB in {secs:.2} s ({mbps:.0} Mbit/s)");
    let _ = std::fs::remove_file(out_file);
    mbps
}

/// tx + rx bytes of `node` on `link`, as its agent last reported them.
fn link_bytes(env: &Env, topology: &str, link: &str, node: &str) -> i64 {
    env.psql(&format!(
        "SELECT COALESCE(max(c.tx_bytes + c.rx_bytes), 0) FROM link_counters c JOIN topologies t ON t.id = c.topology_id \
         WHERE t.name = '{topology}' AND c.link = '{link}' AND c.node = '{node}'"
    ))
    .parse()
    .unwrap_or(0)
}

/// One series of an agent's metrics, read from its Unix socket.
fn agent_metric(env: &Env, topology: &str, node: &str, series: &str, label: &str) -> f64 {
    let socket = nextmini_operator::observe::sockets::agent_socket(&env.state_dir, topology, node);
    let out = Command::new("curl")
        .args(["-sS", "--unix-socket"])
        .arg(&socket)
        .arg("http://agent/metrics")
        .output()
        .expect("curl metrics");
    checked("scraping agent metrics", &out);
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.starts_with(&format!("{series}{{")) && l.contains(label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {series} with {label} in the metrics of {node}:\n{text}"))
}

/// Waits for one more report of every agent (1 s apart by default).
fn next_reports() {
    std::thread::sleep(Duration::from_millis(2500));
}

#[test]
fn socks_normal_max_and_auth() {
    let mut env = Env::new("socks");
    let topology = format!("socks{}", std::process::id());
    let ports = free_ports(4);
    let [normal, max, auth] = [ports[0], ports[1], ports[2]];

    // Two servers on one address: refused, naming the field.
    let clash = env.state_dir.join("clash.yaml");
    std::fs::write(&clash, manifest(&topology, &[normal, normal, auth])).expect("manifest");
    let out = env.run(&["up", "-f", clash.to_str().expect("path")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "clashing SOCKS addresses accepted");
    assert!(
        stderr.contains("spec.nodes[0].socks[1].listen") && stderr.contains("already used by"),
        "{stderr}"
    );

    let file = env.state_dir.join("topology.yaml");
    std::fs::write(&file, manifest(&topology, &ports)).expect("manifest");
    env.ok(&["up", "-f", file.to_str().expect("path")]);

    // Another topology asking for an address this one holds: refused before
    // anything of it is made.
    let other = format!("socksb{}", std::process::id());
    let taken = env.state_dir.join("taken.yaml");
    std::fs::write(
        &taken,
        format!(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: {other}}}\nspec:\n  nodes:\n    - name: x\n      socks: [{{listen: \"127.0.0.1:{normal}\"}}]\n"
        ),
    )
    .expect("manifest");
    let out = env.run(&["up", "-f", taken.to_str().expect("path")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a held SOCKS address was accepted");
    assert!(
        stderr.contains(&format!("127.0.0.1:{normal}")) && stderr.contains("socks"),
        "the error names the address: {stderr}"
    );
    assert!(
        namespaces_of(&other).is_empty(),
        "the refused topology made namespaces"
    );
    assert_eq!(
        env.psql(&format!(
            "SELECT count(*) FROM topologies WHERE name = '{other}'"
        )),
        "0",
        "the refused topology left rows"
    );
    println!("a held address is refused:\n{}", stderr.trim());

    let www = env.state_dir.join("www");
    std::fs::create_dir_all(&www).expect("www");
    write_random_file(&www.join("big"), SIZE, u64::from(std::process::id()));
    let expected = sha256_file(&www.join("big"));
    env.serve_http("c", &www);
    let probe = env.state_dir.join("probe");
    let proxy_normal = format!("socks5h://127.0.0.1:{normal}");
    let proxy_max = format!("socks5h://127.0.0.1:{max}");
    env.wait_for(
        "the HTTP server in c, through SOCKS",
        Duration::from_secs(20),
        || {
            curl_via(&proxy_normal, "http://c:8000/", &probe)
                .output()
                .is_ok_and(|o| o.status.success())
        },
    );

    // (a) Normal mode: through the dataplane, so b's links carry the file.
    next_reports();
    let before = link_bytes(&env, &topology, "a-b", "b");
    let normal_mbps = fetch(&env, "normal", &proxy_normal, &expected);
    env.wait_for(
        "b's counters to show the file",
        Duration::from_secs(10),
        || link_bytes(&env, &topology, "a-b", "b") - before >= SIZE as i64,
    );

    // (b) Max mode: spliced hop by hop; the max-mode metric counts the bytes at
    // every agent on the path, and the links do not carry them.
    next_reports();
    let links_before =
        link_bytes(&env, &topology, "a-b", "b") + link_bytes(&env, &topology, "b-c", "b");
    let max_before: Vec<f64> = ["a", "b", "c"]
        .iter()
        .map(|n| {
            agent_metric(
                &env,
                &topology,
                n,
                "nextmini_relay_bytes_total",
                "mode=\"max\"",
            )
        })
        .collect();
    let max_mbps = fetch(&env, "max", &proxy_max, &expected);
    next_reports();
    let links_after =
        link_bytes(&env, &topology, "a-b", "b") + link_bytes(&env, &topology, "b-c", "b");
    for (i, node) in ["a", "b", "c"].iter().enumerate() {
        let moved = agent_metric(
            &env,
            &topology,
            node,
            "nextmini_relay_bytes_total",
            "mode=\"max\"",
        ) - max_before[i];
        assert!(
            moved >= SIZE as f64,
            "max-mode bytes at {node}: {moved} (expected the whole file)"
        );
        let fallbacks = agent_metric(
            &env,
            &topology,
            node,
            "nextmini_relay_splice_fallbacks_total",
            "topology",
        );
        assert_eq!(fallbacks, 0.0, "{node} fell back to copying");
    }
    assert!(
        links_after - links_before < (SIZE / 10) as i64,
        "max mode went over the emulated links: {} bytes on b's links",
        links_after - links_before
    );

    // (c) Username/password.
    let proxy_auth = |user: &str| format!("socks5h://{user}@127.0.0.1:{auth}");
    for (what, proxy) in [
        ("a wrong password", proxy_auth("alice:wrong")),
        ("an unknown user", proxy_auth("mallory:s3cret")),
        ("no credentials", format!("socks5h://127.0.0.1:{auth}")),
    ] {
        let out = curl_via(&proxy, "http://c:8000/", &probe)
            .output()
            .expect("curl");
        assert!(!out.status.success(), "{what} was let in");
    }
    let refused = agent_metric(
        &env,
        &topology,
        "a",
        "nextmini_relay_refused_total",
        "socks_auth",
    );
    assert!(refused >= 3.0, "refusals counted: {refused}");
    let auth_mbps = fetch(
        &env,
        "username-password",
        &proxy_auth("alice:s3cret"),
        &expected,
    );

    // (d) Normal and max at the same time. The normal transfer is slowed down
    // (to about 0.7 s) so that the max one runs entirely while it does.
    let spawn = |what: &str, proxy: &str, extra: &[&str]| {
        let out = env.state_dir.join(format!("both-{what}"));
        let mut cmd = curl_via(proxy, "http://c:8000/big", &out);
        cmd.args(extra);
        (cmd.spawn().expect("curl"), out)
    };
    let t = Instant::now();
    let (mut normal_curl, normal_out) = spawn("normal", &proxy_normal, &["--limit-rate", "30M"]);
    std::thread::sleep(Duration::from_millis(100));
    let (mut max_curl, max_out) = spawn("max", &proxy_max, &[]);
    let max_done = max_curl.wait().expect("max curl");
    let max_secs = t.elapsed().as_secs_f64() - 0.1;
    let normal_running = normal_curl.try_wait().expect("normal curl").is_none();
    let normal_done = normal_curl.wait().expect("normal curl");
    let normal_secs = t.elapsed().as_secs_f64();
    assert!(
        normal_done.success() && max_done.success(),
        "concurrent transfers failed"
    );
    assert!(
        normal_running,
        "the max transfer did not overlap the normal one"
    );
    assert_eq!(
        sha256_file(&normal_out),
        expected,
        "concurrent normal: corrupted"
    );
    assert_eq!(sha256_file(&max_out), expected, "concurrent max: corrupted");
    let mbps = |secs: f64| SIZE as f64 * 8.0 / secs / 1e6;
    println!(
        "concurrently: normal 20 MiB in {normal_secs:.2} s ({:.0} Mbit/s, curl limited to 30 MB/s), max 20 MiB in {max_secs:.2} s ({:.0} Mbit/s)",
        mbps(normal_secs),
        mbps(max_secs)
    );
    println!(
        "summary: normal {normal_mbps:.0} Mbit/s, max {max_mbps:.0} Mbit/s, username/password (normal) {auth_mbps:.0} Mbit/s"
    );

    // (e) A max-mode Flow: synthetic instances through the same relays, sunk by
    // c's agent, with their completion times stored like any flow's.
    next_reports();
    let links_before =
        link_bytes(&env, &topology, "a-b", "b") + link_bytes(&env, &topology, "b-c", "b");
    let b_max_before = agent_metric(
        &env,
        &topology,
        "b",
        "nextmini_relay_bytes_total",
        "mode=\"max\"",
    );
    let with_flow = format!(
        "{}---\napiVersion: nextmini.io/v1alpha1\nkind: Flow\nmetadata: {{name: maxflow}}\nspec: {{topology: {topology}, src: a, dst: c, mode: max, size: 20MiB, count: 3, parallelism: 1}}\n",
        manifest(&topology, &ports)
    );
    std::fs::write(&file, with_flow).expect("manifest");
    env.ok(&["up", "-f", file.to_str().expect("path")]);
    let rows = |env: &Env| {
        env.psql(&format!(
            "SELECT r.instance, r.bytes, COALESCE(r.fct_us, -1), COALESCE(r.error, '') \
             FROM flow_results r JOIN topologies t ON t.id = r.topology_id \
             WHERE t.name = '{topology}' AND r.flow = 'maxflow' ORDER BY r.instance"
        ))
    };
    env.wait_for(
        "the max-mode flow's 3 results",
        Duration::from_secs(60),
        || rows(&env).lines().count() == 3,
    );
    let results = rows(&env);
    for line in results.lines() {
        let f: Vec<&str> = line.split('|').collect();
        assert_eq!(f.len(), 4, "{line}");
        assert_eq!(f[3], "", "instance failed: {line}");
        assert_eq!(
            f[1],
            SIZE.to_string(),
            "the sink confirmed every byte: {line}"
        );
        let fct_us: f64 = f[2].parse().expect("fct");
        assert!(fct_us > 0.0, "{line}");
        println!(
            "max-mode flow instance {}: 20 MiB in {:.3} s ({:.0} Mbit/s)",
            f[0],
            fct_us / 1e6,
            SIZE as f64 * 8.0 / fct_us
        );
    }
    next_reports();
    let links_after =
        link_bytes(&env, &topology, "a-b", "b") + link_bytes(&env, &topology, "b-c", "b");
    let b_max = agent_metric(
        &env,
        &topology,
        "b",
        "nextmini_relay_bytes_total",
        "mode=\"max\"",
    ) - b_max_before;
    assert!(
        b_max >= 3.0 * SIZE as f64,
        "b relayed {b_max} max-mode bytes of the flow"
    );
    assert!(
        links_after - links_before < (SIZE / 10) as i64,
        "the max-mode flow went over the emulated links: {} bytes",
        links_after - links_before
    );

    // (f) Max mode follows the routing table per connection: an explicit route
    // a → d → c for port 8000 takes the spliced connections off b.
    let sql = |q: &str| {
        env.psql(q);
        env.wait_for("agents to apply the route", Duration::from_secs(10), || {
            nextmini_e2e::all_acked(&env, &topology)
        });
    };
    sql(&format!(
        "INSERT INTO routes (topology_id, id, name, path) \
         SELECT id, 1, 'via-d', ARRAY['a','d','c'] FROM topologies WHERE name = '{topology}'"
    ));
    sql(&format!(
        "INSERT INTO route_rules (topology_id, src, dst, protocol, dst_port, route_id) \
         SELECT id, 'a', 'c', 6, 8000, 1 FROM topologies WHERE name = '{topology}'"
    ));
    let max_at = |node: &str| {
        agent_metric(
            &env,
            &topology,
            node,
            "nextmini_relay_bytes_total",
            "mode=\"max\"",
        )
    };
    let (b_before, d_before) = (max_at("b"), max_at("d"));
    let routed_mbps = fetch(&env, "max via d", &proxy_max, &expected);
    let (via_b, via_d) = (max_at("b") - b_before, max_at("d") - d_before);
    assert!(
        via_d >= SIZE as f64 && via_b < (SIZE / 10) as f64,
        "the explicit route should carry the max-mode connection: via b {via_b}, via d {via_d}"
    );
    println!(
        "explicit route: max-mode bytes via d {via_d}, via b {via_b} ({routed_mbps:.0} Mbit/s)"
    );

    env.ok(&["down", &topology]);
    assert!(
        namespaces_of(&topology).is_empty(),
        "namespaces left after down"
    );
    // The SOCKS addresses are free again.
    for port in [normal, max, auth] {
        std::net::TcpListener::bind(("127.0.0.1", port))
            .expect("the SOCKS address is free after down");
    }
}
