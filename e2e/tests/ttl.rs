//! `spec.dataplane.ttl: decrement`: the emulated nodes are routers that an
//! unmodified traceroute sees, hop by hop, with each hop's delay; by default
//! (`transparent`) the whole emulated path is one IP hop.

use nextmini_e2e::{Env, interfaces_of, namespaces_of};
use std::collections::HashMap;

const TOPOLOGY: &str = "tree";
const SRC: &str = "host-0-0-0";
const DST: &str = "host-3-1-1";
/// One-way delay of every link.
const DELAY_MS: f64 = 2.0;

fn manifest(ttl: &str) -> String {
    format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata:\n  name: {TOPOLOGY}\nspec:\n  \
         dataplane: {{ttl: {ttl}}}\n  linkDefaults: {{delay: {DELAY_MS}ms}}\n  generator: {{fatTree: {{k: 4}}}}\n"
    )
}

/// Overlay address → node name, from `nextmini plan`.
fn names_by_address(env: &Env, file: &str) -> HashMap<String, String> {
    env.ok(&["plan", "-f", file])
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["node", name, "overlay", addr, ..] => Some((addr.to_string(), name.to_string())),
                _ => None,
            }
        })
        .collect()
}

/// traceroute's hops as (address, RTT in ms); `*` lines (no answer) as ("*", NaN).
fn traceroute(env: &Env, to: &str) -> Vec<(String, f64)> {
    // traceroute sends one probe per hop (-q 1): after nodes (re)start, the
    // first packets may still meet unresolved neighbours, which would show as `*`.
    env.wait_for(
        &format!("{SRC} to reach {to}"),
        std::time::Duration::from_secs(20),
        || {
            env.exec(SRC, &["ping", "-c", "1", "-W", "2", to])
                .status
                .success()
        },
    );
    let out = env.exec(
        SRC,
        // -N 1: one probe in flight. traceroute's default sends 16 at once; with
        // a transparent path all reach the destination, whose kernel rate-limits
        // the port-unreachable answers, so an early hop could show as `*`.
        &[
            "traceroute",
            "-n",
            "-N",
            "1",
            "-q",
            "1",
            "-w",
            "3",
            "-m",
            "12",
            to,
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "traceroute failed: {text}");
    eprintln!("{text}");
    text.lines()
        .skip(1)
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [_, addr, rtt, "ms", ..] => (addr.to_string(), rtt.parse().unwrap_or(f64::NAN)),
                _ => ("*".to_string(), f64::NAN),
            }
        })
        .collect()
}

fn up(env: &Env, ttl: &str) -> String {
    let file = env.state_dir.join(format!("tree-{ttl}.yaml"));
    std::fs::write(&file, manifest(ttl)).expect("manifest");
    let file = file.to_str().expect("path").to_string();
    env.ok(&["up", "-f", &file]);
    file
}

#[test]
fn traceroute_sees_every_emulated_router_with_its_delay() {
    let mut env = Env::new("ttl");
    let file = up(&env, "decrement");
    let names = names_by_address(&env, &file);
    let dst_addr = names
        .iter()
        .find(|(_, n)| n.as_str() == DST)
        .map(|(a, _)| a.clone())
        .expect("destination address");

    // host → edge → aggregation → core → aggregation → edge → host.
    let hops = traceroute(&env, &dst_addr);
    let expected = ["edge-0-0", "agg-0-", "core-", "agg-3-", "edge-3-1", DST];
    assert_eq!(hops.len(), expected.len(), "hops: {hops:?}");
    for (i, ((addr, rtt), prefix)) in hops.iter().zip(expected).enumerate() {
        let hop = i + 1;
        let name = names.get(addr).map(String::as_str).unwrap_or("?");
        assert!(
            name.starts_with(prefix),
            "hop {hop} is {addr} ({name}), expected a node named {prefix}…: {hops:?}"
        );
        // Out and back over `hop` links of DELAY_MS each.
        let floor = 2.0 * hop as f64 * DELAY_MS;
        assert!(
            *rtt >= floor * 0.95 && *rtt < floor + 40.0,
            "hop {hop} ({name}) answered in {rtt} ms, expected about {floor} ms"
        );
    }

    // Packets that keep their TTL cross five decrementing routers intact: the
    // header checksum each one updated still verifies at the destination.
    let www = env.state_dir.join("www");
    std::fs::create_dir_all(&www).expect("www");
    std::fs::write(www.join("index.html"), "routed\n").expect("index");
    env.serve_http(DST, &www);
    env.wait_for_http(SRC, DST);

    // A packet sent with too small a TTL dies at the third router, which says so.
    let short = env.exec(SRC, &["ping", "-c", "1", "-W", "3", "-t", "3", DST]);
    let text = String::from_utf8_lossy(&short.stdout);
    assert!(
        !short.status.success() && text.contains("Time to live exceeded"),
        "ping -t 3 across six links: {text}"
    );

    // The default: the emulated network is one IP hop, as before the option.
    up(&env, "transparent");
    let hops = traceroute(&env, &dst_addr);
    assert_eq!(hops.len(), 1, "transparent path: {hops:?}");
    assert_eq!(hops[0].0, dst_addr);

    env.ok(&["down", TOPOLOGY]);
    assert!(namespaces_of(TOPOLOGY).is_empty(), "namespaces left");
    assert!(interfaces_of(TOPOLOGY).is_empty(), "interfaces left");
}
