//! Synthetic flows: traffic generated inside the agents instead of by
//! applications, as a discrete-event simulator would, but carried by the real
//! dataplane.
//!
//! The source agent runs smoltcp on a [`device::VirtualDevice`] whose packets
//! go straight to the processors (no TUN, no kernel); the sink agent's
//! processors hand it packets for ports [`stack::LISTEN_PORT`] and up, which
//! smoltcp terminates. Pure parts ([`rng`], [`cdf`], [`workload`], [`wire`],
//! [`stack`], [`outbox`]) take `now` and return what to do; [`driver`] is the
//! tokio task that runs them.

pub mod cdf;
pub mod device;
pub mod driver;
pub mod max;
pub mod outbox;
pub mod rng;
pub mod stack;
pub mod task;
pub mod wire;
pub mod workload;

pub use driver::{Inbox, Synth, SynthSlot};

use crate::flow::{FlowKey, PROTO_TCP, PROTO_UDP};

/// Whether a packet delivered to this node belongs to its synthetic flows:
/// TCP or UDP to ports 61000-65535, above Linux's ephemeral range, which both
/// ends of a synthetic flow use.
pub fn claims(key: &FlowKey) -> bool {
    (key.protocol == PROTO_TCP || key.protocol == PROTO_UDP) && key.dst_port >= stack::LISTEN_PORT
}
