//! Enqueue: the active queue management decision for an arriving packet
//! (Flexplane's `enqueue`). The queue's hard limit is enforced by the pipeline for
//! every AQM; an AQM only decides earlier drops and marks.

mod ecn;
mod red;
mod taildrop;

pub use ecn::EcnThreshold;
pub use red::Red;
pub use taildrop::TailDrop;

use super::{PacketMeta, QueueState};
use rand::rngs::SmallRng;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accept,
    Drop,
    /// Accept and set ECN CE. The pipeline drops instead when the packet is not
    /// ECN-capable.
    Mark,
}

pub trait Aqm: Send + Sync {
    /// Decides for a packet about to join `queue` (whose state excludes it).
    fn on_enqueue(
        &mut self,
        queue: &QueueState,
        meta: &PacketMeta,
        now: u64,
        rng: &mut SmallRng,
    ) -> Verdict;

    /// Told after a packet left `queue` (state now excludes it) at `now`.
    fn on_dequeue(&mut self, _queue: &QueueState, _now: u64) {}
}
