//! Applying a changed topology is transactional: nodes are added and removed
//! while the rest keep forwarding; a bad manifest, or a change whose new nodes
//! cannot start, leaves the running topology exactly as it was.

use nextmini_e2e::{Env, namespaces_of, repo_path};
use std::process::Stdio;
use std::time::Duration;

fn with_extra(extra_node: &str, link_to: &str) -> String {
    let base = std::fs::read_to_string(repo_path("manifests/examples/line3.yaml")).expect("line3");
    let base = base.replace(
        "    - name: c\n",
        &format!("    - name: c\n    - name: {extra_node}\n"),
    );
    format!(
        "{base}---\napiVersion: nextmini.io/v1alpha1\nkind: Link\nmetadata:\n  name: c-{extra_node}\nspec:\n  topology: line3\n  endpoints: [c, {link_to}]\n"
    )
}

fn generation(env: &Env) -> String {
    env.psql("SELECT generation FROM topologies WHERE name = 'line3'")
}

fn pings(env: &Env, to: &str) -> bool {
    env.exec("a", &["ping", "-c", "1", "-W", "2", to])
        .status
        .success()
}

#[test]
fn changes_apply_node_by_node_and_failures_change_nothing() {
    let env = Env::new("changes");
    let line3 = repo_path("manifests/examples/line3.yaml");
    env.ok(&["up", "-f", line3.to_str().expect("path")]);
    let write = |name: &str, text: &str| {
        let p = env.state_dir.join(name);
        std::fs::write(&p, text).expect("manifest");
        p.to_str().expect("path").to_string()
    };

    // Grow by a node while a ping stream runs through the nodes that stay.
    let pinger = env
        .command(&[
            "exec", "a", "--", "ping", "-q", "-i", "0.05", "-c", "100", "c",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("ping");
    std::thread::sleep(Duration::from_millis(500));
    let grown = write("grown.yaml", &with_extra("d", "d"));
    let said = env.ok(&["up", "-f", &grown]);
    assert!(
        said.contains("1 node(s) started, 0 stopped, 0 restarted"),
        "{said}"
    );
    assert!(pings(&env, "d"), "the new node d is not reachable from a");
    let out = pinger.wait_with_output().expect("ping");
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(
        summary.contains(" 0% packet loss"),
        "a→c lost packets during the change: {summary}"
    );

    // A manifest with a link to an unknown node: refused, nothing changes.
    let before = generation(&env);
    let bad = write("bad.yaml", &with_extra("e", "z"));
    let out = env.run(&["up", "-f", &bad]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("bad.yaml") && stderr.contains("c-e") && stderr.contains("z"),
        "{stderr}"
    );
    assert_eq!(generation(&env), before);
    assert!(pings(&env, "d"));

    // A change whose new node cannot start (its namespace name is taken):
    // the new node is rolled back, the store and the running nodes are untouched.
    let squatter = format!(
        "{}e",
        nextmini_operator::runtime::names::netns_prefix("line3")
    );
    let made = std::process::Command::new("ip")
        .args(["netns", "add", &squatter])
        .status();
    assert!(
        made.is_ok_and(|s| s.success()),
        "could not create {squatter}"
    );
    let blocked = write("blocked.yaml", &with_extra("e", "e"));
    let out = env.run(&["up", "-f", &blocked]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The rollback undoes what the run made, not the namespace that was there.
    let squatter_kept = nextmini_operator::runtime::netlink::netns_exists(&squatter);
    let _ = std::process::Command::new("ip")
        .args(["netns", "del", &squatter])
        .status();
    assert!(!out.status.success(), "the change should have failed");
    assert!(stderr.contains("runs on unchanged"), "{stderr}");
    assert!(
        stderr.contains(&format!("its network namespace {squatter} already exists")),
        "{stderr}"
    );
    assert!(
        squatter_kept,
        "the failed change removed {squatter}, which it did not make"
    );
    assert_eq!(
        generation(&env),
        before,
        "the store changed although the change failed"
    );
    assert_eq!(
        env.psql("SELECT string_agg(n.name, ',' ORDER BY n.idx) FROM nodes n JOIN topologies t ON t.id = n.topology_id WHERE t.name = 'line3'"),
        "a,b,c,d"
    );
    assert!(pings(&env, "d"), "d stopped working after a failed change");

    // Shrink back: d is stopped and removed, the rest keep running.
    let said = env.ok(&["up", "-f", line3.to_str().expect("path")]);
    assert!(said.contains("0 node(s) started, 1 stopped"), "{said}");
    let left = namespaces_of("line3");
    assert!(
        !left.iter().any(|n| n.ends_with("-d")),
        "d's namespace is left: {left:?} after {said}"
    );
    assert!(pings(&env, "c"));
    env.ok(&["down"]);
    assert!(namespaces_of("line3").is_empty());
}
