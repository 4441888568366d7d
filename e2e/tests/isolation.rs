//! Tenants stay apart: a node's credential gets nothing of another node or
//! another topology from the hub, and a link handshake without the topology's
//! key is refused, however well it names the link.

use nextmini_e2e::{Env, link_counter, namespaces_of, ping_summary_avg_ms, repo_path};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

/// Runs a real agent claiming `topology`/`node` with the credential in
/// `credential_file`, in a scratch namespace, for a few seconds; returns its log.
fn impostor(env: &Env, topology: &str, node: &str, credential_file: &std::path::Path) -> String {
    let ns = "nmtest-impostor";
    let _ = Command::new("ip").args(["netns", "del", ns]).status();
    assert!(
        Command::new("ip")
            .args(["netns", "add", ns])
            .status()
            .is_ok_and(|s| s.success())
    );
    let hub = format!("unix:{}", env.state_dir.join("hub.sock").display());
    let out = Command::new("timeout")
        .arg("3")
        .arg(env.agent_bin())
        .args([
            "--netns",
            ns,
            "--hub",
            &hub,
            "--topology",
            topology,
            "--node",
            node,
            "--credential-file",
        ])
        .arg(credential_file)
        .env("RUST_LOG", "info")
        .output()
        .expect("agent");
    let _ = Command::new("ip").args(["netns", "del", ns]).status();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn credentials_and_link_keys_keep_topologies_apart() {
    let env = Env::new("isolation");
    let line3 = repo_path("manifests/examples/line3.yaml");
    env.ok(&["up", "-f", line3.to_str().expect("path")]);
    let other = env.state_dir.join("other.yaml");
    std::fs::write(
        &other,
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: other}\nspec:\n  addressing: {overlay: 198.18.128.0/17, underlay: 198.19.64.0/18}\n  nodes: [{name: x}, {name: y}]\n  links: [{endpoints: [x, y]}]\n",
    )
    .expect("manifest");
    env.ok(&["up", "-f", other.to_str().expect("path")]);
    let a_credential = env.state_dir.join("credentials/line3/a");

    // Credentials are the owner's alone.
    for file in ["a", "a.crt", "a.key", "ca.crt"] {
        let mode = std::fs::metadata(env.state_dir.join("credentials/line3").join(file))
            .expect("credential file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "credentials/line3/{file} is {mode:o}");
    }

    // A's certificate for B's node, and for another node of A: the hub refuses
    // the Hello, since the certificate says who the agent is. No snapshot.
    for (topology, node) in [("other", "x"), ("line3", "b")] {
        let log = impostor(&env, topology, node, &a_credential);
        assert!(
            log.contains("certificate is for line3/a"),
            "{topology}/{node} with a's certificate: {log}"
        );
        assert!(
            !log.contains("snapshot applied"),
            "{topology}/{node} got a snapshot: {log}"
        );
    }

    // A certificate the control CA did not sign, naming b exactly as the real
    // one does: refused in the TLS handshake, before any message.
    let forged = env.state_dir.join("forged");
    std::fs::create_dir_all(&forged).expect("dir");
    std::fs::copy(&a_credential, forged.join("b")).expect("token");
    std::fs::copy(
        env.state_dir.join("credentials/line3/ca.crt"),
        forged.join("ca.crt"),
    )
    .expect("ca");
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=forged-b"])
        .args(["-addext", "subjectAltName=URI:spiffe://nextmini/line3/b"])
        .arg("-keyout")
        .arg(forged.join("b.key"))
        .arg("-out")
        .arg(forged.join("b.crt"))
        .output()
        .expect("openssl");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let log = impostor(&env, "line3", "b", &forged.join("b"));
    assert!(
        log.contains("control stream failed") && !log.contains("snapshot applied"),
        "a self-made certificate got through: {log}"
    );

    // The agent trusts only the control CA: a hub it cannot verify gets nothing.
    let distrust = env.state_dir.join("distrust");
    std::fs::create_dir_all(&distrust).expect("dir");
    for file in ["a", "a.crt", "a.key"] {
        std::fs::copy(
            env.state_dir.join("credentials/line3").join(file),
            distrust.join(file),
        )
        .expect("copy");
    }
    std::fs::copy(forged.join("b.crt"), distrust.join("ca.crt")).expect("foreign ca");
    let log = impostor(&env, "line3", "a", &distrust.join("a"));
    assert!(
        log.contains("invalid peer certificate") && !log.contains("snapshot applied"),
        "the agent accepted a hub outside its CA: {log}"
    );

    // The real agents were not displaced.
    assert_eq!(
        env.psql("SELECT count(*) FROM nodes WHERE agent_state = 'connected'"),
        "5"
    );

    // A forged link handshake (right names, no key) from inside the topology is refused.
    let connects = link_counter(&env, "line3", "a-b", "b", "connects");
    let forge = r#"
import socket, struct
def field(s): return struct.pack(">H", len(s)) + s.encode()
payload = field("line3") + field("a-b") + field("a")
# len | version 2 | kind 2 (hello) | flags | hops u16 | label u32
frame = struct.pack(">IBBBHI", 9 + len(payload), 2, 2, 0, 0, 0) + payload
s = socket.create_connection(("198.19.0.2", 7100), timeout=2)
s.sendall(frame)
try:
    s.settimeout(2); print("read", s.recv(16))
except Exception as e:
    print("closed", e)
"#;
    let out = env.exec("a", &["python3", "-c", forge]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let b_log = env.state_dir.join("logs/line3/b.log");
    env.wait_for(
        "b to refuse the forged handshake",
        Duration::from_secs(5),
        || std::fs::read_to_string(&b_log).is_ok_and(|l| l.contains("authentication tag")),
    );
    assert_eq!(
        link_counter(&env, "line3", "a-b", "b", "connects"),
        connects,
        "the forged handshake replaced the real link"
    );
    assert!(
        env.exec("a", &["ping", "-c", "1", "-W", "2", "c"])
            .status
            .success()
    );

    // A topology applied again under its name gets new tokens: a copy of the
    // old credential (certificate still valid) opens nothing.
    let old = env.state_dir.join("old");
    std::fs::create_dir_all(&old).expect("dir");
    for file in ["a", "a.crt", "a.key", "ca.crt"] {
        std::fs::copy(
            env.state_dir.join("credentials/line3").join(file),
            old.join(file),
        )
        .expect("copy");
    }
    env.ok(&["down", "line3"]);
    env.ok(&["up", "-f", line3.to_str().expect("path")]);
    let log = impostor(&env, "line3", "a", &old.join("a"));
    assert!(
        log.contains("bad credential") && !log.contains("snapshot applied"),
        "the old incarnation's credential was accepted: {log}"
    );
}

/// Issue 17.5 in local mode: two manifests each bring a topology called wan,
/// in namespaces team-a and team-b. Both run, each with its own link delay;
/// their agents' credentials, metrics and counters name the namespace; one
/// team's credential opens nothing of the other's; `down team-a/wan` leaves
/// team-b's running.
#[test]
fn the_same_name_in_two_namespaces_runs_as_two_topologies() {
    let env = Env::new("namespaces");
    let manifest = |namespace: &str, delay: &str, overlay: &str, underlay: &str| {
        let path = env.state_dir.join(format!("{namespace}.yaml"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: wan, namespace: {namespace}}}\nspec:\n  addressing: {{overlay: {overlay}, underlay: {underlay}}}\n  linkDefaults: {{delay: {delay}}}\n  nodes: [{{name: x}}, {{name: y}}]\n  links: [{{endpoints: [x, y]}}]\n"
            ),
        )
        .expect("manifest");
        path
    };
    let a = manifest("team-a", "2ms", "198.18.0.0/17", "198.19.0.0/18");
    let b = manifest("team-b", "6ms", "198.18.128.0/17", "198.19.64.0/18");
    env.ok(&["up", "-f", a.to_str().expect("path")]);
    env.ok(&["up", "-f", b.to_str().expect("path")]);
    assert_eq!(
        env.psql("SELECT string_agg(namespace || ' ' || name || ' ' || key, ', ' ORDER BY key) FROM topologies"),
        "team-a wan team-a/wan, team-b wan team-b/wan"
    );

    let rtt_ms = |key: &str| -> f64 {
        let out = env.run(&[
            "exec", "-t", key, "x", "--", "ping", "-q", "-c", "5", "-i", "0.05", "-W", "2", "y",
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "ping y in {key}: {text}");
        ping_summary_avg_ms(&text)
    };
    let (rtt_a, rtt_b) = (rtt_ms("team-a/wan"), rtt_ms("team-b/wan"));
    println!("wan in team-a: {rtt_a:.2} ms RTT (2 ms links); in team-b: {rtt_b:.2} ms (6 ms)");
    assert!(
        (4.0..7.0).contains(&rtt_a),
        "team-a/wan runs 2 ms each way: {rtt_a}"
    );
    assert!(
        (12.0..16.0).contains(&rtt_b),
        "team-b/wan runs 6 ms each way: {rtt_b}"
    );
    // Counters reach the store with the agent's next report, up to a
    // report interval after the pings.
    env.wait_for(
        "team-a's pings on team-a's counters",
        Duration::from_secs(10),
        || link_counter(&env, "team-a/wan", "x-y", "x", "tx_bytes") > 0,
    );

    let metrics = env.agent_metrics("team-a/wan", "x");
    assert!(
        metrics.contains(
            "nextmini_agent_stream_connected{namespace=\"team-a\",topology=\"wan\",node=\"x\"} 1"
        ),
        "agent series name the namespace: {metrics}"
    );

    // team-a's x credential claiming team-b's x: the certificate says who it is.
    let a_credential = env.state_dir.join("credentials/team-a/wan/x");
    let log = impostor(&env, "team-b/wan", "x", &a_credential);
    assert!(
        log.contains("certificate is for team-a/wan/x") && !log.contains("snapshot applied"),
        "team-a's credential for team-b's x: {log}"
    );

    // Without --topology, a node name both teams use is ambiguous, and says so.
    let both = env.exec("x", &["true"]);
    assert!(
        String::from_utf8_lossy(&both.stderr).contains("(team-a/wan, team-b/wan)"),
        "{}",
        String::from_utf8_lossy(&both.stderr)
    );

    env.ok(&["down", "team-a/wan"]);
    assert!(
        env.exec("x", &["true"]).status.success(),
        "with team-a's wan gone, x is team-b's"
    );
    assert!(
        namespaces_of("team-a/wan").is_empty(),
        "team-a's nodes are gone"
    );
    assert_eq!(namespaces_of("team-b/wan").len(), 2, "team-b's stay");
    let again = rtt_ms("team-b/wan");
    assert!(
        (12.0..16.0).contains(&again),
        "team-b/wan still runs: {again}"
    );
    assert_eq!(
        env.psql("SELECT string_agg(key, ', ') FROM topologies"),
        "team-b/wan"
    );
}
