//! Namespace mode past the host-wide limits its own nodes used to exhaust: a
//! ring of 1,100 nodes needs more bridge ports than one Linux bridge has
//! (1,024) and more neighbour entries than the kernel's default table holds
//! (1,024 for every namespace together). `up` succeeds only when every link
//! forwards, and traffic crosses the ring to its farthest node, 550 links away.
//! When the ring is gone, the hub has given its memory back.

use nextmini_e2e::load::rss_bytes;
use nextmini_e2e::{Env, etc_netns_of, host_interfaces_of, interfaces_of, namespaces_of};
use nextmini_operator::runtime::names;
use std::time::{Duration, Instant};

const NODES: u32 = 1100;
const NEIGH: &str = "/proc/sys/net/ipv4/neigh/default";
/// The hub's resident memory after the ring's `down`, against before its `up`
/// (with a 2-node line running all along): issue 16.3's 1.1. What the hub
/// still holds after the `down` is small (heaptrack: 330 KB of connection
/// buffers, statement caches and channel blocks); what made the ratio vary
/// (1.04-1.12 with glibc's arena per thread, CI 1.12) is those blocks pinning
/// arena pages `malloc_trim` cannot give back. With one arena
/// (`runtime::tunables`) it measured 1.02-1.05. The bound fails every
/// regression seen: 1.25-1.31 with glibc's per-thread cache, 2.0-2.5 while
/// the hub prepared a statement per batch size and kept a TLS ticket per
/// handshake, 5.3 just before the first trim (94 MB).
const HUB_RSS_AFTER_DOWN_MAX: f64 = 1.1;

/// Puts the kernel's neighbour-table limits back to their defaults for the
/// test (an earlier run, or `up` itself, may have raised them, which would hide
/// a runtime that no longer sizes them), and restores what was there after.
struct NeighbourDefaults(Vec<(String, String)>);

impl NeighbourDefaults {
    fn set() -> NeighbourDefaults {
        let mut saved = Vec::new();
        // thresh2 first on the way down: it must never exceed thresh3.
        for (setting, default) in [("gc_thresh2", "512"), ("gc_thresh3", "1024")] {
            let path = format!("{NEIGH}/{setting}");
            let was = std::fs::read_to_string(&path).expect("neighbour sysctl");
            std::fs::write(&path, default).expect("setting neighbour sysctl");
            saved.push((path, was.trim().to_string()));
        }
        NeighbourDefaults(saved)
    }
}

impl Drop for NeighbourDefaults {
    fn drop(&mut self) {
        for (path, was) in self.0.iter().rev() {
            let _ = std::fs::write(path, was);
        }
    }
}

#[test]
fn a_1100_node_ring_forwards_end_to_end() {
    let _defaults = NeighbourDefaults::set();
    let mut env = Env::new("ring1100");
    env.apply_yaml(
        "beside",
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: beside}\nspec:\n  nodes: [{name: left}, {name: right}]\n  links: [{endpoints: [left, right]}]\n",
    );
    let hub = env.hub_pid().expect("the hub's pid");
    // The first reports and their writes come in the first seconds.
    std::thread::sleep(Duration::from_secs(3));
    let hub_before = rss_bytes(hub).expect("hub RSS");
    let manifest = env.state_dir.join("ring.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata:\n  name: ring{NODES}\nspec:\n  generator: {{ring: {{nodes: {NODES}}}}}\n"
        ),
    )
    .expect("manifest");
    let topology = format!("ring{NODES}");
    let started = Instant::now();
    env.ok(&[
        "up",
        "-f",
        manifest.to_str().expect("path"),
        "--timeout-secs",
        "300",
    ]);
    eprintln!("{NODES}-node ring up in {:.1?}", started.elapsed());

    // `up` returned: every link forwards, as status agrees.
    let status = env.ok(&["status", &topology]);
    assert!(
        status.contains(&format!("links up {NODES}/{NODES}")),
        "status after up: {}",
        status.lines().take(5).collect::<Vec<_>>().join("\n")
    );

    // The bridges and veth ends are in the topology's underlay namespace, not
    // the host's, and every one of them has IPv6 off (the namespace's default,
    // so no write per interface; left on, each would multicast to every node).
    assert_eq!(
        host_interfaces_of(&topology),
        Vec::<String>::new(),
        "the ring's interfaces are in the host's namespace"
    );
    let underlay = names::underlay_netns(&topology);
    for iface in [
        names::bridge(&topology),
        names::segment_bridge(&topology, 1),
        names::veth_host(&topology, 0),
        names::veth_host(&topology, NODES - 1),
    ] {
        let path = format!("/proc/sys/net/ipv6/conf/{iface}/disable_ipv6");
        let off = ip_output(&["netns", "exec", &underlay, "cat", &path]);
        assert_eq!(off.trim(), "1", "{iface} in {underlay}: IPv6 not off");
    }

    // Each node knows its link peers' MAC addresses from the start: n0's
    // neighbour table holds exactly its two peers, as permanent entries with
    // the MAC that names their address, and nothing that ARP resolved (each
    // request would have been copied to all 1,100 nodes).
    let n0 = names::netns(&topology, "n0");
    let neighbours = ip_output(&[
        "-n",
        &n0,
        "-4",
        "neigh",
        "show",
        "dev",
        names::UNDERLAY_IFACE,
    ]);
    let entries: Vec<&str> = neighbours.lines().collect();
    assert_eq!(entries.len(), 2, "n0's neighbours:\n{neighbours}");
    for entry in entries {
        let fields: Vec<&str> = entry.split_whitespace().collect();
        let addr: std::net::Ipv4Addr = fields[0].parse().expect("neighbour address");
        let [a, b, c, d] = addr.octets();
        assert!(
            entry.trim_end().ends_with("PERMANENT")
                && entry.contains(&format!("lladdr 02:6e:{a:02x}:{b:02x}:{c:02x}:{d:02x} ")),
            "n0's neighbour entry {entry:?} is not the permanent one for its address"
        );
    }

    // No node interface has an IPv6 address (set per interface over netlink,
    // not by a sysctl per namespace): loopback's ::1 is the only one, so
    // nothing multicasts router solicitations or MLD reports to every node.
    let v6 = ip_output(&["-n", &n0, "-6", "-o", "addr", "show"]);
    let v6_interfaces: Vec<&str> = v6
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    assert_eq!(v6_interfaces, vec!["lo"], "n0's IPv6 addresses:\n{v6}");

    // Unknown unicast reaches the chain between bridges, not every node: each
    // node's port knows its node's address (a static entry) and floods
    // nothing; the ports between bridges flood. A SYN to a node not made yet
    // would otherwise be copied to all 1,100.
    let fdb = ip_output(&[
        "netns",
        "exec",
        &underlay,
        "bridge",
        "fdb",
        "show",
        "dev",
        &names::veth_host(&topology, 0),
    ]);
    assert!(
        fdb.lines()
            .any(|l| l.starts_with("02:6e:") && l.trim_end().ends_with(" static")),
        "n0's port has no static entry for n0's address:\n{fdb}"
    );
    let (uplink, _) = names::segment_uplink(&topology, 1);
    for port in [
        names::veth_host(&topology, 0),
        names::veth_host(&topology, NODES - 1),
        uplink.clone(),
    ] {
        let line = ip_output(&[
            "netns", "exec", &underlay, "bridge", "-d", "link", "show", "dev", &port,
        ]);
        let floods = line.contains(" flood on");
        assert_eq!(
            floods,
            port == uplink,
            "{port}: unknown unicast flooding is {} ({line:?})",
            if floods { "on" } else { "off" }
        );
    }

    // Every node's /etc/hosts is one file (a hard link each), not N copies of
    // N lines; names below resolve through it.
    let hosts = std::path::Path::new("/etc/netns")
        .join(names::netns(&topology, "n0"))
        .join("hosts");
    let links =
        std::os::unix::fs::MetadataExt::nlink(&std::fs::metadata(&hosts).expect("n0's hosts"));
    assert_eq!(
        links,
        u64::from(NODES) + 1,
        "{} is not shared by every node",
        hosts.display()
    );

    // n550 is the farthest node, 550 links away (the former fixed 64-hop loop
    // guard cut everything past n64); n1099 is on the last bridge segment.
    let far = format!("n{}", NODES / 2);
    let last = format!("n{}", NODES - 1);
    env.assert_pings("n0", &["n1", "n60", &far, &last]);
    // An application's connection to the farthest node.
    let www = env.state_dir.join("www");
    std::fs::create_dir_all(&www).expect("www");
    std::fs::write(www.join("index.html"), "far side\n").expect("index");
    env.serve_http(&far, &www);
    env.wait_for_http("n0", &far);
    let page = env.http_get("n0", &far, "index.html", 10);
    assert!(
        page.contains("far side"),
        "curl n0 → {far} did not get the page"
    );

    let started = Instant::now();
    env.ok(&["down", &topology]);
    eprintln!("{NODES}-node ring down in {:.1?}", started.elapsed());
    assert!(namespaces_of(&topology).is_empty(), "namespaces left");
    assert!(interfaces_of(&topology).is_empty(), "interfaces left");
    assert_eq!(
        etc_netns_of(&topology),
        Vec::<String>::new(),
        "/etc/netns entries left"
    );

    // The hub gives memory back a few seconds after sessions end.
    let bound = (hub_before as f64 * HUB_RSS_AFTER_DOWN_MAX) as u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    let hub_after = loop {
        let now = rss_bytes(hub).expect("hub RSS");
        if now <= bound || Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let mib = |b: u64| b as f64 / 1048576.0;
    eprintln!(
        "hub RSS: {:.1} MiB before the ring, {:.1} MiB after its down ({:.2}x)",
        mib(hub_before),
        mib(hub_after),
        hub_after as f64 / hub_before as f64
    );
    let trims = std::fs::read_to_string(env.state_dir.join("logs/hub.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("returned free memory"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        hub_after <= bound,
        "the hub kept {:.1} MiB after the ring's down, {:.1} MiB before its up (at most {HUB_RSS_AFTER_DOWN_MAX}x); its trims:\n{trims}",
        mib(hub_after),
        mib(hub_before)
    );
    env.ok(&["down", "beside"]);
}

/// Output of `ip <args>`, which must succeed.
fn ip_output(args: &[&str]) -> String {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .expect("ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
