//! The impairment stage after the shaper: what the wire does to a packet that
//! left the queue (delay, jitter, loss, reorder, duplication, corruption).

mod delay;
mod loss;
mod netem;

pub use delay::Delay;
pub use loss::{GilbertLoss, chance};
pub use netem::Netem;

use super::PacketMeta;
use rand::rngs::SmallRng;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Deliver,
    /// Deliver with a flipped bit.
    DeliverCorrupted,
    Drop,
}

/// One copy of a packet leaving the stage: `at` is when it reaches the far end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    pub at: u64,
    pub action: Action,
}

pub trait Impairment: Send + Sync {
    /// Decides the fate of a packet that left the queue at `now`, pushing one entry
    /// per copy into `out` (empty on entry): two deliveries duplicate it, a release
    /// earlier than a previous packet's reorders it. `out` is reused across
    /// packets so the hot path does not allocate.
    fn impair(&mut self, meta: &PacketMeta, now: u64, rng: &mut SmallRng, out: &mut Vec<Release>);

    /// A lower bound on `at - now` of every release: lets the owner sleep
    /// through departures that cannot reach the far end yet. 0 is always safe.
    fn min_delay_ns(&self) -> u64 {
        0
    }
}

/// A perfect wire: every packet arrives the instant it leaves.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoImpairment;

impl Impairment for NoImpairment {
    fn impair(&mut self, _: &PacketMeta, now: u64, _: &mut SmallRng, out: &mut Vec<Release>) {
        out.push(Release {
            at: now,
            action: Action::Deliver,
        });
    }
}
