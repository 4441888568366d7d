//! What the link tests share: one node's dataplane without a TUN device.

use arc_swap::ArcSwap;
use nextmini_agent::counters::NodeCounters;
use nextmini_agent::link::LinkContext;
use nextmini_agent::packet::Packet;
use nextmini_agent::processor::{Mapping, Outputs, Processors, Routes};
use nextmini_agent::routing::RouteTable;
use std::sync::Arc;
use tokio::sync::mpsc;

/// A node's empty route table, counters, one sequential processor and the
/// link context over them; packets for the node itself come out of the
/// receiver (which holds up to `local` of them).
pub struct Dataplane {
    pub routes: Routes,
    pub counters: Arc<NodeCounters>,
    pub processors: Processors,
    pub context: LinkContext,
    pub local: mpsc::Receiver<Packet>,
}

pub fn dataplane(mtu: u32, local: usize) -> Dataplane {
    let routes: Routes = Arc::new(ArcSwap::from_pointee(RouteTable::empty()));
    let counters = Arc::new(NodeCounters::default());
    let (local_tx, local) = mpsc::channel(local);
    let processors = Processors::spawn(
        1,
        Mapping::Sequential,
        Outputs {
            routes: routes.clone(),
            local: local_tx,
            counters: counters.clone(),
            synth: Default::default(),
        },
    );
    let context = LinkContext {
        processors: processors.clone(),
        routes: routes.clone(),
        quic: None,
        mtu,
        auth: None,
        seed: 0,
    };
    Dataplane {
        routes,
        counters,
        processors,
        context,
        local,
    }
}

/// Polls `done` every 5 ms; fails the test after 20 s.
pub async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}
