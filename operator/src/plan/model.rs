//! The plan: what a validated topology becomes. Pure data, no Kubernetes types, no I/O.
//! Local mode and the Kubernetes controllers both build it with the same code.

use ipnet::Ipv4Net;
use std::net::Ipv4Addr;
use std::time::Duration;

/// TCP/UDP port on which every agent accepts link connections on its underlay address.
pub const LINK_PORT: u16 = 7100;

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub topology: String,
    /// Pool of TUN (overlay) addresses; each node gets one host address from it.
    pub overlay: Ipv4Net,
    /// Pool of underlay addresses (namespace bridge or pod network in packed mode).
    pub underlay: Ipv4Net,
    pub placement: Placement,
    pub dataplane: Dataplane,
    /// Sorted by `index`; `index` is the node's position in the topology.
    pub nodes: Vec<PlannedNode>,
    /// Sorted by name.
    pub links: Vec<PlannedLink>,
    pub flows: Vec<PlannedFlow>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Netns,
    PodPerNode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    Sequential,
    Concurrent,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Dataplane {
    pub processors: u32,
    pub mapping: Mapping,
    pub mtu: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PlannedNode {
    pub name: String,
    pub index: u32,
    pub overlay: Ipv4Addr,
    pub underlay: Ipv4Addr,
    pub resources: Resources,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resources {
    pub cpu_millis: Option<u32>,
    pub memory_bytes: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Quic,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PlannedLink {
    pub name: String,
    /// The endpoint that opens the connection.
    pub dialer: String,
    /// The endpoint that accepts it.
    pub acceptor: String,
    pub transport: Transport,
    pub params: LinkParams,
}

/// Emulation parameters of a link; `None` = unlimited / no impairment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LinkParams {
    pub rate_bps: Option<u64>,
    pub delay: Option<Duration>,
    pub jitter: Option<Duration>,
    /// Loss probability in parts per million.
    pub loss_ppm: Option<u32>,
    pub queue_packets: Option<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PlannedFlow {
    pub name: String,
    pub src: String,
    pub dst: String,
    pub size_bytes: Option<u64>,
    pub count: u32,
    /// Explicit node path (src .. dst) when the user gave one.
    pub path: Option<Vec<String>>,
}

/// One entry of a node's destination routing table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextHop {
    /// Destination node.
    pub dst: String,
    /// Link to send on; `None` when `dst` is the node itself.
    pub link: Option<String>,
}

impl Plan {
    pub fn node(&self, name: &str) -> Option<&PlannedNode> {
        self.nodes.iter().find(|n| n.name == name)
    }

    pub fn link(&self, name: &str) -> Option<&PlannedLink> {
        self.links.iter().find(|l| l.name == name)
    }

    /// Links that touch `node`, with the peer on the other end.
    pub fn links_of<'a>(
        &'a self,
        node: &'a str,
    ) -> impl Iterator<Item = (&'a PlannedLink, &'a str)> {
        self.links.iter().filter_map(move |l| {
            if l.dialer == node {
                Some((l, l.acceptor.as_str()))
            } else if l.acceptor == node {
                Some((l, l.dialer.as_str()))
            } else {
                None
            }
        })
    }
}
