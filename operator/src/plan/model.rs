//! The plan: what a validated topology becomes. Pure data, no Kubernetes types, no I/O.
//! Local mode and the Kubernetes controllers both build it with the same code.

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};
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
    /// How often agents report counters, in milliseconds (changes apply live).
    pub report_interval_ms: u32,
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
    /// The endpoint that opens the connection (`endpoints[0]`).
    pub dialer: String,
    /// The endpoint that accepts it (`endpoints[1]`).
    pub acceptor: String,
    pub transport: Transport,
    /// What the dialer enforces on the packets it sends to the acceptor.
    pub forward: LinkParams,
    /// What the acceptor enforces on the packets it sends to the dialer.
    pub backward: LinkParams,
}

/// Emulation parameters of one direction of a link, after inheritance; `None` means
/// unlimited / no impairment / the agent's default.
///
/// The store keeps this as JSON that control scripts may edit (`jsonb_set(params_forward,
/// '{rate_bps}', ...)`), so the keys are the proto's names and durations are whole
/// microseconds (`delay_us`), like everything else an agent sees. Missing keys read as
/// unset; unknown keys are refused so that a typo in a script is an error.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinkParams {
    pub rate_bps: Option<u64>,
    /// Token bucket depth.
    pub burst_bytes: Option<u64>,
    #[serde(rename = "delay_us", with = "micros")]
    pub delay: Option<Duration>,
    #[serde(rename = "jitter_us", with = "micros")]
    pub jitter: Option<Duration>,
    pub jitter_distribution: JitterDistribution,
    /// Probabilities in parts per million.
    pub loss_ppm: Option<u32>,
    pub loss_correlation_ppm: Option<u32>,
    pub reorder_ppm: Option<u32>,
    pub duplicate_ppm: Option<u32>,
    pub corrupt_ppm: Option<u32>,
    pub queue: QueueParams,
    pub scheduler: SchedulerKind,
    /// Matched in order; unmatched packets join the scheduler's last queue.
    pub classes: Vec<ClassRule>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JitterDistribution {
    #[default]
    Uniform,
    Normal,
    Pareto,
}

/// Limits of each of the scheduler's queues: at most one of the two is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueParams {
    pub limit_packets: Option<u32>,
    pub limit_bytes: Option<u64>,
    pub aqm: Aqm,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Aqm {
    #[default]
    TailDrop,
    Red {
        /// Average queue length thresholds in packets.
        min_packets: u32,
        max_packets: u32,
        /// Drop (or mark) probability at `max_packets`.
        max_p_ppm: u32,
        /// EWMA weight of the average queue length in millionths.
        weight_ppm: u32,
        /// Mark ECN-capable packets instead of dropping them.
        ecn: bool,
    },
    Ecn {
        threshold_packets: u32,
    },
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum SchedulerKind {
    #[default]
    Fcfs,
    /// One queue per weight; weights count packets.
    Wrr { weights: Vec<u32> },
    /// One queue per quantum.
    Drr { quantum_bytes: Vec<u32> },
    /// Queue 0 first.
    Priority { bands: u32 },
}

impl SchedulerKind {
    /// How many queues the scheduler serves, so classes know which indices exist.
    pub fn queues(&self) -> usize {
        match self {
            SchedulerKind::Fcfs => 1,
            SchedulerKind::Wrr { weights } => weights.len(),
            SchedulerKind::Drr { quantum_bytes } => quantum_bytes.len(),
            SchedulerKind::Priority { bands } => usize::try_from(*bands).unwrap_or(usize::MAX),
        }
    }
}

/// Sends matching packets to `queue`; unset matchers match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClassRule {
    pub queue: u32,
    pub dscp: Option<u8>,
    pub src_port: Option<u16>,
    pub dst_port: Option<u16>,
    /// IP protocol number.
    pub protocol: Option<u8>,
    /// Matches packets smaller than this.
    pub max_packet_bytes: Option<u32>,
}

/// `Option<Duration>` as a whole number of microseconds.
mod micros {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            // Validation keeps durations to whole microseconds that fit in a u64.
            Some(d) => s.serialize_some(&u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_micros))
    }
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

    /// Whether `other` runs on the same nodes with the same dataplane, so that
    /// going from one to the other only changes links and flows and needs no
    /// node to be restarted.
    pub fn same_nodes(&self, other: &Plan) -> bool {
        self.topology == other.topology
            && self.overlay == other.overlay
            && self.underlay == other.underlay
            && self.placement == other.placement
            && self.dataplane == other.dataplane
            && self.nodes == other.nodes
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

#[cfg(test)]
mod tests {
    use super::*;

    fn line3() -> Plan {
        let text = include_str!("../../../manifests/examples/line3.yaml");
        let manifest = crate::plan::parse_manifest("line3.yaml", text).expect("parses");
        crate::plan::plan_manifest(&manifest)
            .expect("plans")
            .remove(0)
    }

    #[test]
    fn link_changes_keep_the_nodes_but_node_changes_do_not() {
        let base = line3();
        let mut relinked = base.clone();
        relinked.links[0].forward.rate_bps = Some(20_000_000);
        relinked.links.pop();
        assert!(
            base.same_nodes(&relinked),
            "a link change needs no node restart"
        );

        let mut renumbered = base.clone();
        renumbered.nodes[1].overlay = std::net::Ipv4Addr::new(198, 18, 9, 9);
        assert!(!base.same_nodes(&renumbered));
        let mut limited = base.clone();
        limited.nodes[0].resources.cpu_millis = Some(100);
        assert!(!base.same_nodes(&limited));
        let mut wider = base.clone();
        wider.dataplane.processors = 4;
        assert!(!base.same_nodes(&wider));
    }
}
