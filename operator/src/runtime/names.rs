//! Names of what the netns runtime creates. Interface names are limited to 15
//! bytes, so a topology is known by a short hash of its name; the fixed-length
//! hash also makes prefixes unambiguous (topology "line" never matches "line3").

/// Five hex digits of FNV-1a over the topology name.
pub fn topology_tag(topology: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in topology.as_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{:05x}", h & 0xf_ffff)
}

/// Prefix of every namespace of the topology.
pub fn netns_prefix(topology: &str) -> String {
    format!("nm-{}-", topology_tag(topology))
}

pub fn netns(topology: &str, node: &str) -> String {
    format!("{}{node}", netns_prefix(topology))
}

/// The namespace of a topology's underlay: its bridges and the outer ends of
/// its nodes' veths. Inside the topology's prefix, so whatever removes the
/// topology's namespaces removes it; no node can have its name (a node name is
/// a DNS label, which cannot start with '-').
pub fn underlay_netns(topology: &str) -> String {
    format!("{}{UNDERLAY_SUFFIX}", netns_prefix(topology))
}

const UNDERLAY_SUFFIX: &str = "-underlay";

/// Whether a namespace is a topology's underlay rather than a node's.
pub fn is_underlay_netns(name: &str) -> bool {
    is_ours_netns(name) && name[9..] == *UNDERLAY_SUFFIX
}

/// Prefix of every host-side interface of the topology.
pub fn link_prefix(topology: &str) -> String {
    format!("nm{}", topology_tag(topology))
}

pub fn bridge(topology: &str) -> String {
    format!("{}-br", link_prefix(topology))
}

/// Nodes per bridge. A Linux bridge takes at most 1,024 ports (BR_MAX_PORTS),
/// so larger topologies spread their nodes over segment bridges chained to the
/// first one; 1,000 leaves the first bridge room for the chain's uplinks.
pub const NODES_PER_BRIDGE: u32 = 1000;
/// Segments the first bridge can chain: its 1,024 ports hold its own 1,000
/// nodes and one uplink per further segment.
pub const MAX_SEGMENTS: u32 = 1 + (1024 - NODES_PER_BRIDGE);

/// Which bridge segment a node's veth joins.
pub fn segment_of(node_index: u32) -> u32 {
    node_index / NODES_PER_BRIDGE
}

/// The bridge of a segment: segment 0 is the topology's bridge itself.
pub fn segment_bridge(topology: &str, segment: u32) -> String {
    match segment {
        0 => bridge(topology),
        s => format!("{}-br{s}", link_prefix(topology)),
    }
}

/// The two ends of the veth that chains a segment's bridge (`-u<s>`) to the
/// first bridge (`-d<s>`).
pub fn segment_uplink(topology: &str, segment: u32) -> (String, String) {
    let prefix = link_prefix(topology);
    (
        format!("{prefix}-u{segment}"),
        format!("{prefix}-d{segment}"),
    )
}

pub fn veth_host(topology: &str, index: u32) -> String {
    format!("{}-{index}", link_prefix(topology))
}

pub fn veth_peer(topology: &str, index: u32) -> String {
    format!("{}p{index}", link_prefix(topology))
}

/// Whether a namespace name is one this runtime makes (`nm-<tag>-<node>`).
pub fn is_ours_netns(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() > 9 && name.starts_with("nm-") && is_tag(&b[3..8]) && b[8] == b'-'
}

/// Whether an interface name is one this runtime makes (`nm<tag>-br`,
/// `nm<tag>-<index>`, `nm<tag>p<index>`, and for large topologies the segment
/// bridges `nm<tag>-br<s>` and their uplinks `nm<tag>-u<s>`, `nm<tag>-d<s>`).
pub fn is_ours_link(name: &str) -> bool {
    let b = name.as_bytes();
    if b.len() < 9 || !name.starts_with("nm") || !is_tag(&b[2..7]) {
        return false;
    }
    let rest = &name[7..];
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
    rest == "-br"
        || rest.strip_prefix("-br").is_some_and(digits)
        || rest.strip_prefix("-u").is_some_and(digits)
        || rest.strip_prefix("-d").is_some_and(digits)
        || rest.strip_prefix('-').is_some_and(digits)
        || rest.strip_prefix('p').is_some_and(digits)
}

fn is_tag(b: &[u8]) -> bool {
    b.iter()
        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}

/// The node's interface name inside its namespace.
pub const UNDERLAY_IFACE: &str = "eth0";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_fit_the_kernel_limit() {
        for t in [
            "a",
            "line3",
            "a-very-long-topology-name-with-many-characters",
        ] {
            let (up, down) = segment_uplink(t, MAX_SEGMENTS - 1);
            for name in [
                bridge(t),
                veth_host(t, 99_999),
                veth_peer(t, 99_999),
                segment_bridge(t, MAX_SEGMENTS - 1),
                up,
                down,
            ] {
                assert!(name.len() <= 15, "{name} is longer than 15 bytes");
            }
        }
    }

    #[test]
    fn segments_keep_every_bridge_under_its_port_limit() {
        let last_node = MAX_SEGMENTS * NODES_PER_BRIDGE - 1;
        assert_eq!(segment_of(last_node), MAX_SEGMENTS - 1);
        // The first bridge: its own nodes plus one uplink per other segment.
        const { assert!(NODES_PER_BRIDGE + (MAX_SEGMENTS - 1) <= 1024) };
        assert_eq!(segment_of(999), 0);
        assert_eq!(segment_of(1000), 1);
        assert_eq!(segment_bridge("t", 0), bridge("t"));
    }

    #[test]
    fn prefixes_do_not_capture_other_topologies() {
        assert!(!netns("line3", "a").starts_with(&netns_prefix("line")));
        assert_eq!(topology_tag("line3"), topology_tag("line3"));
        assert_ne!(topology_tag("line3"), topology_tag("line4"));
    }

    #[test]
    fn the_underlay_is_the_topologys_and_no_nodes() {
        let underlay = underlay_netns("line3");
        assert!(underlay.starts_with(&netns_prefix("line3")));
        assert!(is_ours_netns(&underlay));
        assert!(is_underlay_netns(&underlay));
        assert!(crate::plan::dns_label_problem(&underlay[netns_prefix("line3").len()..]).is_some());
        for node in ["a", "underlay", "n-underlay"] {
            assert!(!is_underlay_netns(&netns("line3", node)), "{node}");
        }
    }

    #[test]
    fn recognises_only_its_own_names() {
        let t = "line3";
        assert!(is_ours_netns(&netns(t, "a")));
        let (up, down) = segment_uplink(t, 4);
        for name in [
            bridge(t),
            veth_host(t, 12),
            veth_peer(t, 3),
            segment_bridge(t, 4),
            up,
            down,
        ] {
            assert!(is_ours_link(&name), "{name}");
        }
        for other in [
            "nm-foo",
            "nmcli0",
            "eth0",
            "nm12345-x",
            "nmzzzzz-br",
            "docker0",
        ] {
            assert!(!is_ours_link(other), "{other}");
            assert!(!is_ours_netns(other), "{other}");
        }
    }
}
