//! Cut-through transit on real links: a — b — c over loopback TCP, b only
//! forwarding. Large frames crossing b must be spliced (counted in b's
//! `spliced_bytes` on b-c) and arrive at c byte for byte and in order; when
//! b-c gets a delay while packets flow, they take b's pipeline instead, and
//! when the delay goes, splicing resumes; nothing is lost either way, and the
//! connections stay up.

mod support;

use arc_swap::ArcSwap;
use bytes::Bytes;
use nextmini_agent::counters::NodeCounters;
use nextmini_agent::cut_through::SPLICE_MIN;
use nextmini_agent::link::{LinkHandle, LinkSpec, Role, Transport};
use nextmini_agent::listener::{self, LinkMap};
use nextmini_agent::packet::Packet;
use nextmini_agent::processor::{Processors, Routes};
use nextmini_agent::routing::RouteTable;
use nextmini_proto::v1 as pb;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::sync::mpsc;

const TOPOLOGY: &str = "cut";
const A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const C: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 3);
const MTU: u32 = 1400;

struct Node {
    counters: Arc<NodeCounters>,
    processors: Processors,
    routes: Routes,
    links: HashMap<String, Arc<LinkHandle>>,
    local: mpsc::Receiver<Packet>,
}

struct Plan {
    name: &'static str,
    /// (link, peer, dial address or None to accept)
    links: Vec<(&'static str, &'static str, Option<SocketAddr>)>,
    /// (destination, link or "" for here)
    routes: Vec<(Ipv4Addr, &'static str)>,
    listen: Option<tokio::net::TcpListener>,
    transport: Transport,
}

fn start(plan: Plan) -> Node {
    let support::Dataplane {
        routes,
        counters,
        processors,
        context,
        local,
    } = support::dataplane(MTU, 4096);
    let mut links = HashMap::new();
    for (name, peer, dial) in &plan.links {
        let spec = LinkSpec {
            topology: TOPOLOGY.into(),
            name: (*name).into(),
            local_node: plan.name.into(),
            peer_node: (*peer).into(),
            role: match dial {
                Some(addr) => Role::Dial {
                    peer: addr.to_string(),
                },
                None => Role::Accept,
            },
            transport: plan.transport,
        };
        let link =
            LinkHandle::spawn(spec, pb::LinkParams::default(), context.clone()).expect("link");
        links.insert((*name).to_string(), link);
    }
    if let Some(listener) = plan.listen {
        let map: LinkMap = Arc::new(ArcSwap::from_pointee(links.clone()));
        tokio::spawn(listener::run_tcp(listener, TOPOLOGY.into(), map, None));
    }
    install_routes(&routes, &links, &plan.routes);
    Node {
        counters,
        processors,
        routes,
        links,
        local,
    }
}

/// Replaces the node's route table: (destination, link or "" for here).
fn install_routes(
    routes: &Routes,
    links: &HashMap<String, Arc<LinkHandle>>,
    plan: &[(Ipv4Addr, &'static str)],
) {
    let table = pb::RouteTable {
        destinations: plan
            .iter()
            .map(|(addr, link)| pb::DestinationRoute {
                node: addr.to_string(),
                overlay_addr: addr.to_string(),
                next_hops: if link.is_empty() {
                    vec![]
                } else {
                    vec![pb::NextHop {
                        link: (*link).into(),
                        weight: 1,
                    }]
                },
            })
            .collect(),
        ..Default::default()
    };
    let table = RouteTable::from_proto(&table, |n| links.get(n).cloned()).expect("valid table");
    routes.store(Arc::new(table));
}

async fn bind() -> (tokio::net::TcpListener, SocketAddr) {
    let listener = listener::bind("127.0.0.1:0".parse().expect("address"))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    (listener, addr)
}

/// a — b — c, a dialling b and b dialling c.
async fn line(transport: Transport) -> (Node, Node, Node) {
    let (listen_b, at_b) = bind().await;
    let (listen_c, at_c) = bind().await;
    let c = start(Plan {
        name: "c",
        links: vec![("b-c", "b", None)],
        routes: vec![(C, ""), (A, "b-c")],
        listen: Some(listen_c),
        transport,
    });
    let b = start(Plan {
        name: "b",
        links: vec![("a-b", "a", None), ("b-c", "c", Some(at_c))],
        routes: vec![(C, "b-c"), (A, "a-b")],
        listen: Some(listen_b),
        transport,
    });
    let a = start(Plan {
        name: "a",
        links: vec![("a-b", "b", Some(at_b))],
        routes: vec![(A, ""), (C, "a-b")],
        listen: None,
        transport,
    });
    support::wait_for("the links to connect", || {
        [&a, &b, &c]
            .iter()
            .flat_map(|n| n.links.values())
            .all(|l| l.counters.connected.load(Relaxed))
    })
    .await;
    (a, b, c)
}

/// An IPv4/UDP packet a → c of `len` bytes whose payload starts with `seq`.
fn packet(seq: u32, len: usize) -> Bytes {
    let mut p = vec![0u8; len];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&A.octets());
    p[16..20].copy_from_slice(&C.octets());
    p[20..22].copy_from_slice(&40_000u16.to_be_bytes());
    p[22..24].copy_from_slice(&9u16.to_be_bytes());
    p[24..26].copy_from_slice(&((len - 20) as u16).to_be_bytes());
    p[28..32].copy_from_slice(&seq.to_be_bytes());
    for (i, byte) in p[32..].iter_mut().enumerate() {
        *byte = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seq) as u8;
    }
    Bytes::from(p)
}

/// Sends packets `seqs` from a, paced so no hand-off queue overflows. Large
/// ones go one per millisecond, as a sender's super-packets do on a link that
/// is not saturated; a backlog in b's socket would be read in bulk.
async fn send(a: &Node, seqs: std::ops::Range<u32>, len: usize) {
    let every = if len >= SPLICE_MIN { 1 } else { 16 };
    for seq in seqs {
        a.processors
            .dispatch(Packet::from_tun(packet(seq, len)))
            .await;
        if seq % every == every - 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// Receives packets `seqs` at c, each once and byte for byte; returns how
/// many arrived after a later one.
async fn receive(c: &mut Node, seqs: std::ops::Range<u32>, len: usize) -> usize {
    let mut seen = std::collections::BTreeSet::new();
    let mut late = 0;
    while seen.len() < seqs.len() {
        let got = tokio::time::timeout(Duration::from_secs(20), c.local.recv())
            .await
            .unwrap_or_else(|_| panic!("packets missing: {} of {} arrived", seen.len(), seqs.len()))
            .expect("local channel open");
        let seq = got
            .data
            .get(28..32)
            .and_then(|s| <[u8; 4]>::try_from(s).ok())
            .map(u32::from_be_bytes)
            .expect("a sequence number");
        assert!(seqs.contains(&seq), "unexpected packet {seq}");
        assert!(got.data == packet(seq, len), "packet {seq} arrived changed");
        assert!(seen.insert(seq), "packet {seq} arrived twice");
        if seen.last().is_some_and(|&last| last > seq) {
            late += 1;
        }
    }
    late
}

fn spliced(b: &Node) -> u64 {
    b.links["b-c"].counters.spliced_bytes.load(Relaxed)
}

fn delay(us: u64) -> pb::LinkParams {
    pb::LinkParams {
        delay_us: us,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_frames_are_spliced_through_a_transparent_hop_and_arrive_whole() {
    let (a, b, mut c) = line(Transport::Tcp).await;
    let len = 40_000;
    assert!(len >= SPLICE_MIN);
    let count = 200;
    let (_, late) = tokio::join!(send(&a, 0..count, len), receive(&mut c, 0..count, len));
    assert_eq!(late, 0, "one flow through one hop stays in order");
    let frame = (len + nextmini_agent::frame::HEADER_LEN) as u64;
    println!(
        "b spliced {} of {} frame bytes",
        spliced(&b),
        frame * u64::from(count)
    );
    // The first frame comes in whole with a bulk read, and a frame with every
    // pipe in flight is copied; the rest are spliced.
    assert!(
        spliced(&b) >= frame * u64::from(count) / 2,
        "b spliced {} bytes of {} frames of {frame}",
        spliced(&b),
        count
    );
    // Counted as if copied: every packet on both of b's links.
    assert_eq!(
        b.links["a-b"].counters.rx_packets.load(Relaxed),
        u64::from(count)
    );
    assert_eq!(
        b.links["b-c"].counters.tx_packets.load(Relaxed),
        u64::from(count)
    );
    assert_eq!(
        b.links["b-c"].counters.tx_bytes.load(Relaxed),
        len as u64 * u64::from(count)
    );
    // Small frames cut through too, past b's processors, but are not spliced.
    let before = spliced(&b);
    let (_, late) = tokio::join!(send(&a, 0..50, 1000), receive(&mut c, 0..50, 1000));
    assert_eq!(late, 0);
    assert_eq!(spliced(&b), before, "small frames are copied");
    let processed: u64 = b
        .counters
        .processed
        .get()
        .map_or(0, |p| p.iter().map(|c| c.0.load(Relaxed)).sum());
    assert_eq!(processed, 0, "transit frames skip b's processors");
    let _ = &b.routes;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_added_and_removed_live_switches_the_hop_without_loss() {
    let (a, b, mut c) = line(Transport::Tcp).await;
    let len = 30_000;
    let connects = |n: &Node| -> u64 {
        n.links
            .values()
            .map(|l| l.counters.connects.load(Relaxed))
            .sum()
    };
    let connects_before = connects(&a) + connects(&b) + connects(&c);
    let bc = b.links["b-c"].clone();
    // Packets flow throughout; the delay comes and goes under them.
    let switch = async {
        support::wait_for("b to splice", || spliced(&b) > 0).await;
        bc.set_params(delay(2_000), MTU).expect("delay");
        tokio::time::sleep(Duration::from_millis(60)).await;
        let during = spliced(&b);
        tokio::time::sleep(Duration::from_millis(60)).await;
        let after_delay = spliced(&b);
        bc.set_params(pb::LinkParams::default(), MTU)
            .expect("no delay");
        (during, after_delay)
    };
    let count = 1500;
    // Order may change at the switches, as it does when any link's delay
    // shrinks under traffic; what must hold is that every packet arrives.
    let (_, (during, after_delay), _) = tokio::join!(
        send(&a, 0..count, len),
        switch,
        receive(&mut c, 0..count, len)
    );
    assert_eq!(
        during, after_delay,
        "nothing is spliced past a delayed link's pipeline"
    );
    assert!(
        spliced(&b) > after_delay,
        "splicing resumes when the delay goes"
    );
    assert_eq!(
        connects(&a) + connects(&b) + connects(&c),
        connects_before,
        "no connection was replaced"
    );
    assert_eq!(b.links["b-c"].counters.drops.load(Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_hop_is_never_spliced_and_uses_the_processors() {
    let (a, b, mut c) = line(Transport::Tcp).await;
    b.links["b-c"].set_params(delay(100), MTU).expect("delay");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let len = 40_000;
    let (_, late) = tokio::join!(send(&a, 0..100, len), receive(&mut c, 0..100, len));
    assert_eq!(late, 0);
    assert_eq!(spliced(&b), 0, "a delayed link takes its pipeline");
    let processed: u64 = b
        .counters
        .processed
        .get()
        .map_or(0, |p| p.iter().map(|c| c.0.load(Relaxed)).sum());
    assert_eq!(processed, 100, "and its packets go through b's processors");
}

/// A route change at b applies to the very next frame that cut through b:
/// the route is looked up per frame, not cached with the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_change_applies_to_the_next_cut_through_frame() {
    let (a, mut b, mut c) = line(Transport::Tcp).await;
    let len = 40_000;
    let (_, late) = tokio::join!(send(&a, 0..20, len), receive(&mut c, 0..20, len));
    assert_eq!(late, 0);
    assert!(spliced(&b) > 0, "b splices before the change");
    // c's address is now b's own: frames for it end at b.
    install_routes(&b.routes, &b.links, &[(C, ""), (A, "a-b")]);
    let (_, late) = tokio::join!(send(&a, 20..40, len), receive(&mut b, 20..40, len));
    assert_eq!(late, 0);
    assert!(
        c.local.try_recv().is_err(),
        "a frame reached c after b's route changed"
    );
}
