//! Any planned path delivers, however long: a 300-node line carries ping and an
//! HTTP transfer from one end to the other, 299 links. The dataplane's former
//! fixed loop guard of 64 hops dropped everything past n64 without a word.

use nextmini_e2e::{Env, interfaces_of, namespaces_of};
use std::time::Instant;

const NODES: u32 = 300;

#[test]
fn a_300_node_line_delivers_end_to_end() {
    let mut env = Env::new("line300");
    let topology = format!("line{NODES}");
    let manifest = env.state_dir.join("line.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata:\n  name: {topology}\nspec:\n  generator: {{line: {{nodes: {NODES}}}}}\n"
        ),
    )
    .expect("manifest");
    let started = Instant::now();
    env.ok(&[
        "up",
        "-f",
        manifest.to_str().expect("path"),
        "--timeout-secs",
        "240",
    ]);
    eprintln!("{NODES}-node line up in {:.1?}", started.elapsed());

    let last = format!("n{}", NODES - 1);
    // n65 was the first node the 64-hop guard cut off.
    env.assert_pings("n0", &["n65", &last]);

    // An application's TCP connection over all 299 links, both ways' packets
    // crossing every transit node.
    let www = env.state_dir.join("www");
    std::fs::create_dir_all(&www).expect("www");
    let body: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(www.join("index.html"), &body).expect("index");
    env.serve_http(&last, &www);
    env.wait_for_http("n0", &last);
    let page = env.http_get("n0", &last, "index.html", 20);
    assert_eq!(page, body, "curl n0 → {last} got a different page");

    env.ok(&["down", &topology]);
    assert!(namespaces_of(&topology).is_empty(), "namespaces left");
    assert!(interfaces_of(&topology).is_empty(), "interfaces left");
}
