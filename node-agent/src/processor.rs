//! Processor tasks: flow 4-tuple -> route -> next hop.
//!
//! `sequential`: every packet of a flow goes to the same processor (jump
//! consistent hash of the flow key), so the dataplane never reorders a flow.
//! `concurrent`: all processors take from one shared queue, which balances load
//! across processors at the price of some reordering within flows.

use crate::counters::{NodeCounters, ProcessorCount};
use crate::flow::FlowKey;
use crate::jump_hash::jump_consistent_hash;
use crate::link::LinkHandle;
use crate::offload;
use crate::packet::Packet;
use crate::routing::{Decision, RouteTable};
use arc_swap::ArcSwap;
use bytes::{Bytes, BytesMut};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use tokio::sync::mpsc;

pub type Routes = Arc<ArcSwap<RouteTable<Arc<LinkHandle>>>>;

const PROCESSOR_QUEUE: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    Sequential,
    Concurrent,
}

impl Mapping {
    pub fn parse(s: &str) -> Option<Mapping> {
        match s {
            "" | "sequential" => Some(Mapping::Sequential),
            "concurrent" => Some(Mapping::Concurrent),
            _ => None,
        }
    }
}

/// Where processed packets go: the TUN writer for local delivery; links are
/// found through the route table.
#[derive(Clone)]
pub struct Outputs {
    pub routes: Routes,
    pub local: mpsc::Sender<Packet>,
    pub counters: Arc<NodeCounters>,
    /// The synthetic flows' stack, once the node has flows: local packets to
    /// its ports go there instead of to the TUN device.
    pub synth: crate::synth::SynthSlot,
}

/// Senders to the processors; cheap to clone into each packet source.
#[derive(Clone)]
pub enum Processors {
    Sequential(Arc<[mpsc::Sender<Packet>]>),
    Concurrent(async_channel::Sender<Packet>),
}

impl Processors {
    /// Starts `count` processors. An agent starts its processors once; the
    /// per-processor counts in `outputs.counters` belong to the first set.
    pub fn spawn(count: u32, mapping: Mapping, outputs: Outputs) -> Processors {
        let count = count.max(1);
        let _ = outputs
            .counters
            .processed
            .set((0..count).map(|_| ProcessorCount::default()).collect());
        match mapping {
            Mapping::Sequential => {
                let inputs: Vec<_> = (0..count as usize)
                    .map(|index| {
                        let (tx, mut rx) = mpsc::channel(PROCESSOR_QUEUE);
                        let outputs = outputs.clone();
                        tokio::spawn(async move {
                            while let Some(p) = rx.recv().await {
                                if !process_counted(index, p, &outputs).await {
                                    return;
                                }
                            }
                        });
                        tx
                    })
                    .collect();
                Processors::Sequential(inputs.into())
            }
            Mapping::Concurrent => {
                let (tx, rx) = async_channel::bounded::<Packet>(PROCESSOR_QUEUE * count as usize);
                for index in 0..count as usize {
                    let rx = rx.clone();
                    let outputs = outputs.clone();
                    tokio::spawn(async move {
                        while let Ok(p) = rx.recv().await {
                            if !process_counted(index, p, &outputs).await {
                                return;
                            }
                        }
                    });
                }
                Processors::Concurrent(tx)
            }
        }
    }

    /// Hands a packet to a processor; waits when processors are behind, which
    /// pushes back on the TUN device or the link.
    pub async fn dispatch(&self, packet: Packet) {
        // A closed processor means the agent is shutting down.
        match self {
            Processors::Sequential(inputs) => {
                let index = match FlowKey::parse(&packet.data) {
                    Ok(key) => {
                        jump_consistent_hash(key.stable_hash(), inputs.len() as u32) as usize
                    }
                    Err(_) => 0,
                };
                let _ = inputs[index].send(packet).await;
            }
            Processors::Concurrent(tx) => {
                let _ = tx.send(packet).await;
            }
        }
    }
}

/// [`process`], counted for processor `index`.
async fn process_counted(index: usize, packet: Packet, outputs: &Outputs) -> bool {
    if let Some(count) = outputs.counters.processed.get().and_then(|c| c.get(index)) {
        count.0.fetch_add(1, Relaxed);
    }
    process(packet, outputs).await
}

/// Routes one packet. False when the agent is shutting down.
async fn process(packet: Packet, out: &Outputs) -> bool {
    let key = match FlowKey::parse(&packet.data) {
        Ok(k) => k,
        Err(_) => {
            out.counters.malformed.fetch_add(1, Relaxed);
            return true;
        }
    };
    let table = out.routes.load();
    match table.lookup(&key, packet.label) {
        Decision::Local => {
            if let Some(synth) = out.synth.get()
                && crate::synth::claims(&key)
            {
                // The synthetic stack takes only packets as they would be on a wire.
                let data = packet
                    .data
                    .try_into_mut()
                    .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
                if let Err(e) =
                    offload::finish(data, packet.offload, &mut |p| synth.deliver(p.freeze()))
                {
                    out.counters.malformed.fetch_add(1, Relaxed);
                    tracing::debug!(error = %e, "offloaded packet dropped");
                }
                return true;
            }
            return out.local.send(packet).await.is_ok();
        }
        Decision::Forward { link, label } => {
            let Some(hops) = table.hop_limit().next(packet.hops) else {
                // Counted on the link the loop runs through, and for the node.
                link.counters.count_loop_drop();
                out.counters.hop_limit.fetch_add(1, Relaxed);
                return true;
            };
            // A packet that crossed a link is in transit here; its first node
            // stands for the sending host, which does not decrement.
            let packet = match table.ttl_reply_from() {
                Some(from) if packet.hops > 0 => match forward_as_router(packet, from, out, &table)
                {
                    Some(p) => p,
                    None => return true,
                },
                _ => packet,
            };
            link.enqueue(Packet {
                label,
                hops,
                ..packet
            });
        }
        Decision::Drop(_) => {
            out.counters.no_route.fetch_add(1, Relaxed);
        }
    }
    true
}

/// `ttl: decrement` at a transit node: the packet with its TTL decremented, or
/// `None` when it expired here (answered with ICMP Time Exceeded) or is unreadable.
fn forward_as_router(
    packet: Packet,
    from: std::net::Ipv4Addr,
    out: &Outputs,
    table: &RouteTable<Arc<LinkHandle>>,
) -> Option<Packet> {
    let Packet {
        data,
        label,
        hops,
        offload,
    } = packet;
    let mut data = data
        .try_into_mut()
        .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
    match crate::ttl::decrement(&mut data) {
        crate::ttl::Verdict::Forward => Some(Packet {
            data: data.freeze(),
            label,
            hops,
            offload,
        }),
        crate::ttl::Verdict::Expired => {
            out.counters.ttl_expired.fetch_add(1, Relaxed);
            if let Some(reply) = crate::ttl::time_exceeded(from, &data) {
                originate(Bytes::from(reply), out, table);
            }
            None
        }
        crate::ttl::Verdict::Unreadable => {
            out.counters.malformed.fetch_add(1, Relaxed);
            None
        }
    }
}

/// Sends a packet this node made itself (an ICMP error) towards its destination.
fn originate(data: Bytes, out: &Outputs, table: &RouteTable<Arc<LinkHandle>>) {
    let Ok(key) = FlowKey::parse(&data) else {
        return;
    };
    match table.lookup(&key, 0) {
        Decision::Forward { link, label } => link.enqueue(Packet {
            label,
            hops: 1,
            ..Packet::from_tun(data)
        }),
        // Only if the expired packet came from this node's own address.
        Decision::Local => {
            let _ = out.local.try_send(Packet::from_tun(data));
        }
        Decision::Drop(_) => {
            out.counters.no_route.fetch_add(1, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nextmini_proto::v1 as pb;
    use std::collections::HashMap;

    /// An IPv4/UDP packet of flow `flow` carrying sequence number `seq`.
    fn packet(flow: u16, seq: u32) -> Bytes {
        let mut p = vec![0u8; 32];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&32u16.to_be_bytes());
        p[8] = 64;
        p[9] = 17;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        p[20..22].copy_from_slice(&(10_000 + flow).to_be_bytes());
        p[22..24].copy_from_slice(&9u16.to_be_bytes());
        p[24..26].copy_from_slice(&12u16.to_be_bytes());
        p[28..32].copy_from_slice(&seq.to_be_bytes());
        Bytes::from(p)
    }

    const PROCESSORS: usize = 4;

    /// Sends `flows` flows of `per_flow` packets each through four processors
    /// (two sources interleaving them, as a TUN reader and a link would).
    /// Returns the fraction delivered out of order within its flow and the
    /// packets each processor routed.
    async fn run(mapping: Mapping, flows: u16, per_flow: u32) -> (f64, Vec<u64>) {
        let table = pb::RouteTable {
            destinations: vec![pb::DestinationRoute {
                node: "b".into(),
                overlay_addr: "10.0.0.2".into(),
                next_hops: vec![],
            }],
            ..Default::default()
        };
        let routes: Routes = Arc::new(ArcSwap::from_pointee(
            RouteTable::from_proto(&table, |_| None).expect("table"),
        ));
        let (local, mut delivered) = mpsc::channel(1 << 16);
        let counters = Arc::new(NodeCounters::default());
        let processors = Processors::spawn(
            PROCESSORS as u32,
            mapping,
            Outputs {
                routes,
                local,
                counters: counters.clone(),
                synth: Arc::default(),
            },
        );
        let mut sources = Vec::new();
        for half in 0..2u16 {
            let p = processors.clone();
            sources.push(tokio::spawn(async move {
                for seq in 0..per_flow {
                    for flow in (half..flows).step_by(2) {
                        p.dispatch(Packet::from_tun(packet(flow, seq))).await;
                    }
                }
            }));
        }
        let total = u32::from(flows) * per_flow;
        let mut last: HashMap<u16, u32> = HashMap::new();
        let mut late = 0u32;
        for _ in 0..total {
            let p = delivered.recv().await.expect("delivered").data;
            let flow = u16::from_be_bytes([p[20], p[21]]);
            let seq = u32::from_be_bytes([p[28], p[29], p[30], p[31]]);
            match last.get(&flow) {
                Some(&prev) if seq < prev => late += 1,
                _ => {
                    last.insert(flow, seq);
                }
            }
        }
        for s in sources {
            s.await.expect("source");
        }
        (f64::from(late) / f64::from(total), counters.processed())
    }

    /// Sequential mapping promises two things: a flow never changes processor
    /// (so it is never reordered), and flows spread over all processors. Each
    /// processor must route exactly the packets of the flows its hash names.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sequential_mapping_keeps_each_flow_on_its_processor_and_uses_them_all() {
        const FLOWS: u16 = 64;
        const PER_FLOW: u32 = 500;
        let (late, processed) = run(Mapping::Sequential, FLOWS, PER_FLOW).await;
        assert_eq!(late, 0.0, "a flow was reordered");
        let mut expected = vec![0u64; PROCESSORS];
        for flow in 0..FLOWS {
            let key = FlowKey::parse(&packet(flow, 0)).expect("key");
            let index = jump_consistent_hash(key.stable_hash(), PROCESSORS as u32) as usize;
            expected[index] += u64::from(PER_FLOW);
        }
        assert_eq!(processed, expected, "packets per processor");
        assert!(
            processed.iter().all(|&n| n > 0),
            "a processor took no flow: {processed:?}"
        );
    }

    /// Concurrent mapping promises that one flow uses every processor (at the
    /// price of some reordering, measured here for BENCHMARKS.md).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_mapping_spreads_one_flow_over_every_processor() {
        const PER_FLOW: u32 = 40_000;
        let (late, processed) = run(Mapping::Concurrent, 1, PER_FLOW).await;
        println!(
            "concurrent mapping, one flow: {:.3}% of packets out of order, per processor {processed:?}",
            late * 100.0
        );
        assert_eq!(processed.iter().sum::<u64>(), u64::from(PER_FLOW));
        let least = u64::from(PER_FLOW) / (PROCESSORS as u64 * 20);
        assert!(
            processed.iter().all(|&n| n >= least),
            "one flow must be shared by all {PROCESSORS} processors (each at least {least}): {processed:?}"
        );
        let (late, _) = run(Mapping::Concurrent, 8, 4000).await;
        // PdP saw 10-13% with round robin.
        println!(
            "concurrent mapping, 8 flows: {:.3}% of packets out of order within their flow",
            late * 100.0
        );
    }
}
