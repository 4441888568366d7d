//! Builds an agent's snapshot from the plan: pure, so it is tested without a hub.

use crate::plan::{LINK_PORT, Mapping, NextHop, Plan, Transport};
use nextmini_proto::v1 as pb;
use std::collections::BTreeMap;

/// A topology's desired state with its routes, computed once per generation and
/// shared by every agent's snapshot.
pub struct TopologyView {
    pub generation: i64,
    pub plan: Plan,
    pub hops: BTreeMap<String, Vec<NextHop>>,
}

impl TopologyView {
    pub fn new(plan: Plan, generation: i64) -> TopologyView {
        let hops = crate::plan::next_hops(&plan);
        TopologyView {
            generation,
            plan,
            hops,
        }
    }

    /// The full snapshot for `node`, or `None` when the topology has no such node.
    pub fn snapshot(&self, node: &str, report_interval_ms: u32) -> Option<pb::Snapshot> {
        let plan = &self.plan;
        let me = plan.node(node)?;
        let links = plan
            .links_of(node)
            .filter_map(|(link, peer)| {
                let peer = plan.node(peer)?;
                let dial = link.dialer == node;
                Some(pb::LinkConfig {
                    name: link.name.clone(),
                    peer_node: peer.name.clone(),
                    peer_addr: format!("{}:{LINK_PORT}", peer.underlay),
                    role: if dial {
                        pb::LinkRole::Dial as i32
                    } else {
                        pb::LinkRole::Accept as i32
                    },
                    transport: match link.transport {
                        Transport::Tcp => "tcp".into(),
                        Transport::Quic => "quic".into(),
                    },
                    params: Some(pb::LinkParams {
                        rate_bps: link.params.rate_bps.unwrap_or(0),
                        delay_us: link.params.delay.map_or(0, |d| d.as_micros() as u64),
                        jitter_us: link.params.jitter.map_or(0, |d| d.as_micros() as u64),
                        loss_ppm: link.params.loss_ppm.unwrap_or(0),
                        queue_packets: link.params.queue_packets.unwrap_or(0),
                        ..Default::default()
                    }),
                })
            })
            .collect();
        let destinations = self
            .hops
            .get(node)
            .map(|hops| {
                hops.iter()
                    .filter_map(|h| {
                        let dst = plan.node(&h.dst)?;
                        Some(pb::DestinationRoute {
                            node: dst.name.clone(),
                            overlay_addr: dst.overlay.to_string(),
                            next_hops: h
                                .link
                                .iter()
                                .map(|l| pb::NextHop {
                                    link: l.clone(),
                                    weight: 1,
                                })
                                .collect(),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(pb::Snapshot {
            generation: self.generation as u64,
            node: Some(pb::NodeConfig {
                name: me.name.clone(),
                topology: plan.topology.clone(),
                overlay_addr: me.overlay.to_string(),
                overlay_prefix_len: u32::from(plan.overlay.prefix_len()),
                listen_addr: format!("{}:{LINK_PORT}", me.underlay),
                dataplane: Some(pb::DataplaneConfig {
                    processors: plan.dataplane.processors,
                    mtu: plan.dataplane.mtu,
                    mapping: match plan.dataplane.mapping {
                        Mapping::Sequential => "sequential".into(),
                        Mapping::Concurrent => "concurrent".into(),
                    },
                }),
                peers: plan
                    .nodes
                    .iter()
                    .map(|n| pb::PeerAddress {
                        node: n.name.clone(),
                        overlay_addr: n.overlay.to_string(),
                    })
                    .collect(),
            }),
            links,
            routes: Some(pb::RouteTable {
                destinations,
                labels: vec![],
                flow_rules: vec![],
            }),
            report_interval_ms,
        })
    }
}
