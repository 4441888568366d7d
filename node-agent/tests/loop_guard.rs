//! The loop guard on real links: two nodes joined by one link over loopback TCP,
//! each routing the same destination over that link, bounce a packet between
//! them. It must die after exactly the topology's hop limit of link crossings,
//! and the drop must be counted on the link the loop runs through.

mod support;

use arc_swap::ArcSwap;
use bytes::Bytes;
use nextmini_agent::counters::NodeCounters;
use nextmini_agent::link::{LinkHandle, LinkSpec, Role, Transport};
use nextmini_agent::listener::{self, LinkMap};
use nextmini_agent::packet::Packet;
use nextmini_agent::processor::{Processors, Routes};
use nextmini_agent::routing::RouteTable;
use nextmini_proto::v1 as pb;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::sync::mpsc;

const TOPOLOGY: &str = "loop";
const LINK: &str = "a-b";
/// Neither node: both send it on over the link, which is the loop.
const NOWHERE: &str = "198.18.9.9";

struct Node {
    link: Arc<LinkHandle>,
    counters: Arc<NodeCounters>,
    processors: Processors,
    routes: Routes,
    /// Keeps the local-delivery channel open; the loop never delivers.
    _local: mpsc::Receiver<Packet>,
}

fn node(name: &str, peer: &str, role: Role) -> Node {
    let support::Dataplane {
        routes,
        counters,
        processors,
        context,
        local,
    } = support::dataplane(1400, 16);
    let spec = LinkSpec {
        topology: TOPOLOGY.into(),
        name: LINK.into(),
        local_node: name.into(),
        peer_node: peer.into(),
        role,
        transport: Transport::Tcp,
    };
    let link = LinkHandle::spawn(spec, pb::LinkParams::default(), context).expect("link");
    Node {
        link,
        counters,
        processors,
        routes,
        _local: local,
    }
}

/// Routes [`NOWHERE`] over the node's one link, with `hop_limit`.
fn route_into_the_loop(node: &Node, hop_limit: u32) {
    let table = pb::RouteTable {
        destinations: vec![pb::DestinationRoute {
            node: "nowhere".into(),
            overlay_addr: NOWHERE.into(),
            next_hops: vec![pb::NextHop {
                link: LINK.into(),
                weight: 1,
            }],
        }],
        hop_limit,
        ..Default::default()
    };
    let link = node.link.clone();
    let table =
        RouteTable::from_proto(&table, |n| (n == LINK).then(|| link.clone())).expect("valid table");
    node.routes.store(Arc::new(table));
}

/// An IPv4/UDP packet from 198.18.0.1 to [`NOWHERE`].
fn udp_packet() -> Bytes {
    let mut p = vec![0u8; 32];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&32u16.to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&[198, 18, 0, 1]);
    let dst: std::net::Ipv4Addr = NOWHERE.parse().expect("address");
    p[16..20].copy_from_slice(&dst.octets());
    p[20..22].copy_from_slice(&40_000u16.to_be_bytes());
    p[22..24].copy_from_slice(&9u16.to_be_bytes());
    p[24..26].copy_from_slice(&12u16.to_be_bytes());
    Bytes::from(p)
}

/// Two nodes joined by a real TCP link, `a` dialling `b`'s listener.
async fn joined_pair() -> (Node, Node) {
    let listener = listener::bind("127.0.0.1:0".parse().expect("address"))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let b = node("b", "a", Role::Accept);
    let links: LinkMap = Arc::new(ArcSwap::from_pointee(HashMap::from([(
        LINK.to_string(),
        b.link.clone(),
    )])));
    tokio::spawn(listener::run_tcp(listener, TOPOLOGY.into(), links, None));
    let a = node(
        "a",
        "b",
        Role::Dial {
            peer: addr.to_string(),
        },
    );
    support::wait_for("the link to connect", || {
        a.link.counters.connected.load(Relaxed) && b.link.counters.connected.load(Relaxed)
    })
    .await;
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_dies_at_the_hop_limit_and_is_counted_on_its_link() {
    for hop_limit in [7u32, 300] {
        let (a, b) = joined_pair().await;
        route_into_the_loop(&a, hop_limit);
        route_into_the_loop(&b, hop_limit);
        a.processors.dispatch(Packet::from_tun(udp_packet())).await;

        let loop_drops =
            || a.link.counters.drops_loop.load(Relaxed) + b.link.counters.drops_loop.load(Relaxed);
        support::wait_for("the looping packet's drop", || loop_drops() >= 1).await;
        // Nothing else may be in flight: give a second drop time to show up.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(loop_drops(), 1, "one packet, one drop");
        let crossings =
            a.link.counters.tx_packets.load(Relaxed) + b.link.counters.tx_packets.load(Relaxed);
        assert_eq!(
            crossings,
            u64::from(hop_limit),
            "the packet crosses the link exactly hop_limit times"
        );
        // The node that dropped it counts it too; the other does not.
        let node_drops = a.counters.hop_limit.load(Relaxed) + b.counters.hop_limit.load(Relaxed);
        assert_eq!(node_drops, 1);
        // An odd limit ends the loop at the node that did not start it.
        let dropped_at_b = b.link.counters.drops_loop.load(Relaxed) == 1;
        assert_eq!(dropped_at_b, hop_limit % 2 == 1, "limit {hop_limit}");
    }
}
