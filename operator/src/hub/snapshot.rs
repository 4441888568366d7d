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
    fn middle_node_dials_one_peer_accepts_the_other_and_routes_both_ways() {
        let view = TopologyView::new(line3(), 7);
        let s = view.snapshot("b", 1000).expect("b is a node");
        assert_eq!(s.generation, 7);
        let node = s.node.expect("node config");
        assert_eq!(node.overlay_addr, "198.18.0.2");
        assert_eq!(node.overlay_prefix_len, 16);
        assert_eq!(node.listen_addr, format!("198.19.0.2:{LINK_PORT}"));
        assert_eq!(node.peers.len(), 3);

        let links: Vec<(String, String, i32, String)> = s
            .links
            .iter()
            .map(|l| {
                (
                    l.name.clone(),
                    l.peer_node.clone(),
                    l.role,
                    l.peer_addr.clone(),
                )
            })
            .collect();
        assert_eq!(
            links,
            [
                (
                    "a-b".into(),
                    "a".into(),
                    pb::LinkRole::Accept as i32,
                    format!("198.19.0.1:{LINK_PORT}")
                ),
                (
                    "b-c".into(),
                    "c".into(),
                    pb::LinkRole::Dial as i32,
                    format!("198.19.0.3:{LINK_PORT}")
                ),
            ]
        );

        let routes = s.routes.expect("routes").destinations;
        let via = |dst: &str| {
            routes.iter().find(|r| r.node == dst).map(|r| {
                r.next_hops
                    .iter()
                    .map(|h| h.link.clone())
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(via("a"), Some(vec!["a-b".to_string()]));
        assert_eq!(via("c"), Some(vec!["b-c".to_string()]));
        assert_eq!(via("b"), Some(vec![]), "own address is delivered locally");
    }

    #[test]
    fn unknown_node_gets_no_snapshot() {
        let view = TopologyView::new(line3(), 1);
        assert!(view.snapshot("z", 1000).is_none());
    }
}
