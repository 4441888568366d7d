//! What the SOCKS servers and the max-mode relay share: the node's view of the
//! topology (names, neighbours' relays, the link key, SOCKS settings), swapped whole
//! on every config change, the route table, and their counters.

use crate::counters::RelayCounters;
use crate::link_auth::LinkKey;
use crate::node_side::NodeSide;
use crate::processor::Routes;
use crate::routing::Decision;
use arc_swap::ArcSwap;
use nextmini_proto::v1 as pb;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;

/// How a relayed connection travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Normal,
    Max,
}

impl Mode {
    pub fn is_max(self) -> bool {
        self == Mode::Max
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Normal => "normal",
            Mode::Max => "max",
        }
    }
}

/// One SOCKS server's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocksSettings {
    pub mode: Mode,
    /// User name → salted SHA-256 of the password; empty: no authentication.
    pub users: HashMap<Vec<u8>, [u8; 32]>,
}

/// The node's view of the topology, rebuilt on every config change.
#[derive(Debug, Clone, Default)]
pub struct View {
    pub overlay: Option<Ipv4Addr>,
    /// Node names (this node's too) → overlay addresses.
    pub names: HashMap<String, Ipv4Addr>,
    /// Link name → the peer's max-mode relay, `host:port` (the host may be a
    /// name, as pods' underlay addresses are, resolved at each connect).
    pub neighbours: HashMap<String, String>,
    pub key: Option<LinkKey>,
    /// SOCKS servers by listen address.
    pub socks: HashMap<SocketAddr, SocksSettings>,
}

impl View {
    /// From the node's config, links and routes (names come from the destination
    /// routes, which deltas keep up to date, and the node's peer list).
    pub fn build(
        node: &pb::NodeConfig,
        overlay: Ipv4Addr,
        links: &[pb::LinkConfig],
        routes: &pb::RouteTable,
    ) -> Result<View, (String, String)> {
        let mut names: HashMap<String, Ipv4Addr> = node
            .peers
            .iter()
            .filter_map(|p| Some((p.node.clone(), p.overlay_addr.parse().ok()?)))
            .collect();
        for d in &routes.destinations {
            if let Ok(addr) = d.overlay_addr.parse() {
                names.insert(d.node.clone(), addr);
            }
        }
        names.insert(node.name.clone(), overlay);
        let port = u16::try_from(node.max_port).unwrap_or(0);
        // Every node's relay listens at the same distance from its link port as
        // this node's: the same port everywhere when all nodes share the link
        // port, and each node's own pair of ports in packed worker pods.
        let offset = node
            .listen_addr
            .parse::<SocketAddr>()
            .ok()
            .map(|listen| i32::from(port) - i32::from(listen.port()));
        let neighbours = if port == 0 {
            HashMap::new()
        } else {
            links
                .iter()
                .filter_map(|l| {
                    let (host, peer_port) = l.peer_addr.rsplit_once(':')?;
                    let relay = match (offset, peer_port.parse::<u16>()) {
                        (Some(offset), Ok(peer_port)) => {
                            u16::try_from(i32::from(peer_port) + offset).ok()?
                        }
                        _ => port,
                    };
                    (!host.is_empty()).then(|| (l.name.clone(), format!("{host}:{relay}")))
                })
                .collect()
        };
        let mut socks = HashMap::new();
        for (i, s) in node.socks.iter().enumerate() {
            let field = |f: &str| format!("node.socks[{i}].{f}");
            let listen: SocketAddr = s
                .listen
                .parse()
                .map_err(|e| (field("listen"), format!("{:?}: {e}", s.listen)))?;
            let mode = match pb::RelayMode::try_from(s.mode) {
                Ok(pb::RelayMode::Normal) => Mode::Normal,
                Ok(pb::RelayMode::Max) => Mode::Max,
                Err(_) => return Err((field("mode"), format!("unknown mode {}", s.mode))),
            };
            let mut users = HashMap::new();
            for (k, u) in s.users.iter().enumerate() {
                let hash: [u8; 32] = u.password_sha256.as_slice().try_into().map_err(|_| {
                    (
                        field(&format!("users[{k}].passwordSha256")),
                        "must be 32 bytes".to_string(),
                    )
                })?;
                users.insert(u.name.as_bytes().to_vec(), hash);
            }
            socks.insert(listen, SocksSettings { mode, users });
        }
        Ok(View {
            overlay: Some(overlay),
            names,
            neighbours,
            key: crate::link_auth::LinkKey::from_identity(&node.link_key_der),
            socks,
        })
    }

    /// A SOCKS destination host: a node name, or a node's overlay IPv4 address
    /// (also when written as a name). Anything else is not in the emulated network.
    pub fn resolve(&self, host: &str) -> Option<Ipv4Addr> {
        if let Some(addr) = self.names.get(host) {
            return Some(*addr);
        }
        let addr: Ipv4Addr = host.parse().ok()?;
        self.is_overlay(addr).then_some(addr)
    }

    pub fn is_overlay(&self, addr: Ipv4Addr) -> bool {
        self.names.values().any(|a| *a == addr)
    }
}

/// SHA-256 of `"nextmini socks v1\0" + name + "\0" + password`, as the planner
/// stores it.
pub fn password_sha256(name: &[u8], password: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"nextmini socks v1\0");
    h.update(name);
    h.update(b"\0");
    h.update(password);
    h.finalize().into()
}

/// Compares without leaking where the first difference is.
pub fn same_secret(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Where a connection goes next, from this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextHop {
    /// The destination is this node: connect to it here.
    Here,
    /// The next relay, and the label to send it.
    Relay { addr: String, label: u32 },
}

/// Shared by the SOCKS servers and the max-mode relay.
pub struct Relay {
    pub view: ArcSwap<View>,
    pub routes: Routes,
    pub counters: Arc<RelayCounters>,
    /// Where connections to this node's own applications start.
    pub node: NodeSide,
}

impl Relay {
    pub fn new(routes: Routes, counters: Arc<RelayCounters>) -> Relay {
        Relay {
            view: ArcSwap::from_pointee(View::default()),
            routes,
            counters,
            node: NodeSide::here(),
        }
    }

    pub fn with_node_side(mut self, node: NodeSide) -> Relay {
        self.node = node;
        self
    }

    /// The routing table's choice for a TCP connection from `src` to `dst` (after
    /// `label`, when it follows an explicit path), as packets of the same
    /// connection would be routed: rules, labels and multipath hashing apply.
    /// The topology's loop guard, as the packet dataplane applies it.
    pub fn hop_limit(&self) -> crate::hop_limit::HopLimit {
        self.routes.load().hop_limit()
    }

    pub fn next_hop(
        &self,
        src: SocketAddrV4,
        dst: SocketAddrV4,
        label: u32,
    ) -> Result<NextHop, &'static str> {
        let key = crate::flow::FlowKey {
            src: IpAddr::V4(*src.ip()),
            dst: IpAddr::V4(*dst.ip()),
            protocol: crate::flow::PROTO_TCP,
            src_port: src.port(),
            dst_port: dst.port(),
        };
        match self.routes.load().lookup(&key, label) {
            Decision::Local => Ok(NextHop::Here),
            Decision::Forward { link, label } => self
                .view
                .load()
                .neighbours
                .get(&link.spec.name)
                .map(|addr| NextHop::Relay {
                    addr: addr.clone(),
                    label,
                })
                .ok_or("the next hop's link has no max-mode relay"),
            Decision::Drop(crate::routing::DropReason::NoRoute) => Err("no route"),
            Decision::Drop(crate::routing::DropReason::UnknownLabel) => Err("unknown route label"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> pb::NodeConfig {
        pb::NodeConfig {
            name: "a".into(),
            max_port: 7101,
            peers: vec![pb::PeerAddress {
                node: "b".into(),
                overlay_addr: "198.18.0.2".into(),
            }],
            link_key_der: b"key".to_vec(),
            socks: vec![pb::SocksListener {
                listen: "127.0.0.1:1080".into(),
                mode: pb::RelayMode::Max as i32,
                users: vec![pb::SocksUser {
                    name: "alice".into(),
                    password_sha256: password_sha256(b"alice", b"secret").to_vec(),
                }],
            }],
            ..Default::default()
        }
    }

    #[test]
    fn view_resolves_names_and_overlay_addresses_only() {
        let routes = pb::RouteTable {
            destinations: vec![pb::DestinationRoute {
                node: "c".into(),
                overlay_addr: "198.18.0.3".into(),
                next_hops: vec![],
            }],
            ..Default::default()
        };
        let links = [
            pb::LinkConfig {
                name: "a-b".into(),
                peer_addr: "198.19.0.2:7100".into(),
                ..Default::default()
            },
            pb::LinkConfig {
                name: "a-d".into(),
                // Pods: a name resolved when the relay connects.
                peer_addr: "d.lab.default.svc:7100".into(),
                ..Default::default()
            },
        ];
        let view =
            View::build(&node(), "198.18.0.1".parse().expect("ip"), &links, &routes).expect("view");
        assert_eq!(view.resolve("c"), Some("198.18.0.3".parse().expect("ip")));
        assert_eq!(view.resolve("a"), Some("198.18.0.1".parse().expect("ip")));
        assert_eq!(
            view.resolve("198.18.0.2"),
            Some("198.18.0.2".parse().expect("ip"))
        );
        assert_eq!(
            view.resolve("198.19.0.2"),
            None,
            "underlay is not reachable"
        );
        assert_eq!(view.resolve("example.com"), None);
        assert_eq!(
            view.neighbours.get("a-b").map(String::as_str),
            Some("198.19.0.2:7101")
        );
        assert_eq!(
            view.neighbours.get("a-d").map(String::as_str),
            Some("d.lab.default.svc:7101")
        );

        let socks = &view.socks[&"127.0.0.1:1080".parse().expect("addr")];
        assert_eq!(socks.mode, Mode::Max);
        assert!(same_secret(
            &socks.users[b"alice".as_slice()],
            &password_sha256(b"alice", b"secret")
        ));
        assert!(!same_secret(
            &socks.users[b"alice".as_slice()],
            &password_sha256(b"alice", b"Secret")
        ));
    }

    /// Packed worker pods give every node a pair of ports (links, relay); a
    /// neighbour's relay is at the same distance from its link port as ours.
    #[test]
    fn neighbours_relays_keep_the_link_to_relay_port_distance() {
        let link = |name: &str, peer_addr: &str| pb::LinkConfig {
            name: name.into(),
            peer_addr: peer_addr.into(),
            ..Default::default()
        };
        let mut packed = node();
        packed.listen_addr = "0.0.0.0:7102".into();
        packed.max_port = 7103;
        let links = [
            link("a-b", "worker-1.nm-lab.default.svc:7100"),
            link("a-c", "worker-0.nm-lab.default.svc:7104"),
        ];
        let ip = "198.18.0.1".parse().expect("ip");
        let view = View::build(&packed, ip, &links, &Default::default()).expect("view");
        assert_eq!(
            view.neighbours.get("a-b").map(String::as_str),
            Some("worker-1.nm-lab.default.svc:7101")
        );
        assert_eq!(
            view.neighbours.get("a-c").map(String::as_str),
            Some("worker-0.nm-lab.default.svc:7105")
        );
        let mut bridged = node();
        bridged.listen_addr = "198.19.0.1:7100".into();
        let links = [link("a-b", "198.19.0.2:7100")];
        let view = View::build(&bridged, ip, &links, &Default::default()).expect("view");
        assert_eq!(
            view.neighbours.get("a-b").map(String::as_str),
            Some("198.19.0.2:7101")
        );
    }

    #[test]
    fn bad_socks_settings_name_the_field() {
        let mut n = node();
        n.socks[0].users[0].password_sha256 = vec![1, 2, 3];
        let err = View::build(
            &n,
            "198.18.0.1".parse().expect("ip"),
            &[],
            &Default::default(),
        )
        .expect_err("refused");
        assert_eq!(err.0, "node.socks[0].users[0].passwordSha256");
    }
}
