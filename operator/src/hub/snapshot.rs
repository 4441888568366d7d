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
    /// The topology's link certificate and key, handed to every agent.
    pub identity: Option<crate::store::LinkIdentity>,
}

impl TopologyView {
    pub fn new(plan: Plan, generation: i64) -> TopologyView {
        let hops = crate::plan::next_hops(&plan);
        TopologyView {
            generation,
            plan,
            hops,
            identity: None,
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
                    // Each end enforces the direction it sends: the dialer is
                    // endpoints[0], so it sends forward.
                    params: Some(super::params::to_proto(if dial {
                        &link.forward
                    } else {
                        &link.backward
                    })),
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
                link_cert_der: self
                    .identity
                    .as_ref()
                    .map(|i| i.cert_der.clone())
                    .unwrap_or_default(),
                link_key_der: self
                    .identity
                    .as_ref()
                    .map(|i| i.key_der.clone())
                    .unwrap_or_default(),
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

    /// In the shaped example the router dials `access` and the client accepts it: each
    /// gets the direction it sends, with every parameter of the shaped `core` link.
    #[test]
    fn each_end_gets_the_direction_it_sends() {
        let text = include_str!("../../../manifests/examples/shaped.yaml");
        let manifest = crate::plan::parse_manifest("shaped.yaml", text).expect("parses");
        let plan = crate::plan::plan_manifest(&manifest)
            .expect("plans")
            .remove(0);
        let view = TopologyView::new(plan, 1);
        let params = |node: &str, link: &str| {
            view.snapshot(node, 1000)
                .and_then(|s| s.links.into_iter().find(|l| l.name == link))
                .and_then(|l| l.params)
                .unwrap_or_else(|| panic!("{node} has no params for {link}"))
        };
        let router = params("router", "access");
        let client = params("client", "access");
        assert_eq!((router.rate_bps, router.burst_bytes), (20_000_000, 0));
        assert_eq!((client.rate_bps, client.burst_bytes), (2_000_000, 16_000));
        assert_eq!((router.loss_ppm, client.loss_ppm), (1_000, 5_000));
        assert_eq!(client.loss_correlation_ppm, 250_000);
        for p in [&router, &client] {
            assert_eq!((p.delay_us, p.jitter_us), (10_000, 2_000));
            assert_eq!(p.jitter_distribution, pb::JitterDistribution::Normal as i32);
            assert_eq!(p.queue.as_ref().map(|q| q.limit_packets), Some(1000));
        }

        let core = params("server", "core");
        assert_eq!(core, params("router", "core"), "no override on core");
        assert_eq!((core.rate_bps, core.delay_us), (100_000_000, 20_000));
        assert_eq!(
            core.queue.and_then(|q| q.aqm),
            Some(pb::queue_config::Aqm::Red(pb::Red {
                min_packets: 50,
                max_packets: 150,
                max_p_ppm: 100_000,
                weight_ppm: 2_000,
                ecn: true,
            }))
        );
        assert_eq!(
            core.scheduler.and_then(|s| s.kind),
            Some(pb::scheduler_config::Kind::Wrr(pb::Wrr {
                weights: vec![4, 1]
            }))
        );
        let rule = |dscp, protocol, src_port, dst_port| pb::ClassRule {
            queue: 0,
            dscp,
            src_port,
            dst_port,
            protocol,
            max_packet_bytes: None,
        };
        assert_eq!(
            core.classes,
            [
                rule(Some(46), None, None, None),
                rule(None, Some(6), None, Some(22)),
                rule(None, Some(6), Some(22), None),
            ]
        );
    }
}
