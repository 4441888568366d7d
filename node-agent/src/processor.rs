//! Processor tasks: flow 4-tuple -> route -> next hop. Packets of one flow always
//! go to the same processor (jump consistent hash of the flow key), so a flow is
//! never reordered by the dataplane.

use crate::counters::NodeCounters;
use crate::flow::FlowKey;
use crate::jump_hash::jump_consistent_hash;
use crate::link::LinkHandle;
use crate::packet::Packet;
use crate::routing::{Decision, RouteTable};
use arc_swap::ArcSwap;
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use tokio::sync::mpsc;

pub type Routes = Arc<ArcSwap<RouteTable<Arc<LinkHandle>>>>;

const PROCESSOR_QUEUE: usize = 1024;
const MAX_HOPS: u8 = 64;

/// Senders to every processor; cheap to clone into each packet source.
#[derive(Clone)]
pub struct Processors {
    inputs: Arc<[mpsc::Sender<Packet>]>,
}

impl Processors {
    pub fn spawn(
        count: u32,
        routes: Routes,
        tun_tx: mpsc::Sender<Bytes>,
        counters: Arc<NodeCounters>,
    ) -> Processors {
        let inputs: Vec<_> = (0..count.max(1))
            .map(|_| {
                let (tx, rx) = mpsc::channel(PROCESSOR_QUEUE);
                tokio::spawn(run(rx, routes.clone(), tun_tx.clone(), counters.clone()));
                tx
            })
            .collect();
        Processors {
            inputs: inputs.into(),
        }
    }

    /// Hands a packet to the processor that owns its flow; waits when that
    /// processor is behind, which pushes back on the TUN device or the link.
    pub async fn dispatch(&self, packet: Packet) {
        let index = match FlowKey::parse(&packet.data) {
            Ok(key) => jump_consistent_hash(key.stable_hash(), self.inputs.len() as u32) as usize,
            Err(_) => 0,
        };
        // A closed processor means the agent is shutting down.
        let _ = self.inputs[index].send(packet).await;
    }
}

async fn run(
    mut rx: mpsc::Receiver<Packet>,
    routes: Routes,
    tun_tx: mpsc::Sender<Bytes>,
    counters: Arc<NodeCounters>,
) {
    while let Some(packet) = rx.recv().await {
        let key = match FlowKey::parse(&packet.data) {
            Ok(k) => k,
            Err(_) => {
                counters.malformed.fetch_add(1, Relaxed);
                continue;
            }
        };
        let table = routes.load();
        match table.lookup(&key, packet.label) {
            Decision::Local => {
                if tun_tx.send(packet.data).await.is_err() {
                    return;
                }
            }
            Decision::Forward { link, label } => {
                if packet.hops >= MAX_HOPS {
                    counters.hop_limit.fetch_add(1, Relaxed);
                    continue;
                }
                link.enqueue(Packet {
                    data: packet.data,
                    label,
                    hops: packet.hops + 1,
                });
            }
            Decision::Drop(_) => {
                counters.no_route.fetch_add(1, Relaxed);
            }
        }
    }
}
