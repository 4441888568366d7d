use super::{Aqm, Verdict};
use crate::sched::{PacketMeta, QueueState};
use rand::rngs::SmallRng;

/// Accepts everything: the pipeline's queue limit is the tail drop.
#[derive(Debug, Clone, Copy, Default)]
pub struct TailDrop;

impl Aqm for TailDrop {
    fn on_enqueue(&mut self, _: &QueueState, _: &PacketMeta, _: u64, _: &mut SmallRng) -> Verdict {
        Verdict::Accept
    }
}
