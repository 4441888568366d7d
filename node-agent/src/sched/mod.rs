//! Link emulation, Flexplane-style: small schemes behind small traits, composed
//! into a sans-IO [`Pipeline`] per outbound link.
//!
//! ```text
//! enqueue ─► classify ─► AQM (accept/drop/mark) ─► queue i ─┐
//!                                                            │
//! poll ◄─ wire (delay line) ◄─ impairment ◄─ shaper ◄─ scheduler
//! ```
//!
//! No clocks, no I/O, no tokio: time is `now` in nanoseconds from any epoch and
//! randomness comes from a seeded RNG the pipeline owns, so a test with a fake
//! clock replays exactly. The owner (an actor per link) calls
//! [`Pipeline::enqueue`] for each packet and [`Pipeline::poll`] when a packet
//! arrived or the returned wake-up time has come.
//!
//! Each scheme is one file implementing one trait: [`Classifier`], [`Aqm`],
//! [`Scheduler`], [`Shaper`], [`Impairment`]. A new scheme is written against
//! the traits alone and registered in [`schemes`] (see `schemes/pfabric.rs`),
//! after which links name it in YAML; or plugged into one pipeline with
//! [`Pipeline::with_parts`]. The traits require `Send + Sync` so a pipeline can
//! live in a task that holds `&self` across an await.

pub mod aqm;
pub mod classify;
pub mod config;
mod delay_line;
pub mod impair;
mod meta;
mod payload;
pub(crate) use payload::checksum_adjust;
mod pipeline;
mod queue;
pub mod scheduler;
pub mod schemes;
pub mod shaper;
pub mod tap;
pub mod trace_shaper;

#[cfg(test)]
mod reference_tests;
#[cfg(test)]
mod tests;

pub use aqm::{Aqm, Verdict};
pub use classify::{ClassRule, Classifier, RuleClassifier};
pub use config::{ConfigError, LinkConfig, QueueLimits};
pub use impair::{Action, Impairment, Release};
pub use meta::PacketMeta;
pub use payload::{Payload, ecn_field, is_ect, set_ce};
pub use pipeline::{
    DropCause, DropCounts, EnqueueOutcome, LATE_BOUND_NS, Parts, Pipeline, PipelineStats, Poll,
    QueueDepth, RELEASE_SLACK, ReleaseSlack,
};
pub use queue::QueueState;
pub use scheduler::Scheduler;
pub use shaper::{Shaper, TokenBucket};
pub use tap::{PacketFate, Tap, TapVerdict};
pub use trace_shaper::TraceShaper;

/// The random number generator every scheme draws from: small, fast, seedable.
pub use rand::rngs::SmallRng;
