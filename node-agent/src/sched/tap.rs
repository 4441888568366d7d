//! What a link's pipeline can tell an observer about each packet: when it was
//! queued, when it left, how deep its queue was and what became of it. A
//! capture (`nextmini capture`) is one such observer; the pipeline holds at
//! most one, and with none it does no work beyond a branch per packet.

use super::pipeline::DropCause;

/// The fate of one packet on the emulated link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TapVerdict {
    /// Left the queue and went onto the wire (`copies` > 1: duplicated).
    Sent {
        ecn_marked: bool,
        corrupted: bool,
        copies: u32,
    },
    /// Refused at the queue (full, or by the AQM) or lost on the emulated wire.
    Dropped(DropCause),
}

impl TapVerdict {
    /// One word for the verdict, as a capture shows it.
    pub fn label(&self) -> &'static str {
        match self {
            TapVerdict::Sent {
                ecn_marked: true, ..
            } => "sent-ecn-marked",
            TapVerdict::Sent { .. } => "sent",
            TapVerdict::Dropped(DropCause::QueueFull) => "dropped-queue-full",
            TapVerdict::Dropped(DropCause::Aqm) => "dropped-aqm",
            TapVerdict::Dropped(DropCause::Loss) => "dropped-loss",
        }
    }
}

/// What the link did to one packet, in one clock (the pipeline's: ns from the
/// owner's epoch; a capture moves it to Unix time with [`PacketFate::shifted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketFate {
    /// Its length on the emulated link (a super-packet's whole length).
    pub len: u32,
    pub enqueued_ns: u64,
    /// When the shaper let it leave the queue; `None` for a packet refused at the queue.
    pub departed_ns: Option<u64>,
    /// When its first copy reaches the far end (after delay and jitter); `None`
    /// unless it was sent.
    pub delivered_ns: Option<u64>,
    pub queue: usize,
    /// Packets and bytes in its queue when it arrived, itself not counted.
    pub depth_packets: u32,
    pub depth_bytes: u64,
    pub verdict: TapVerdict,
}

impl PacketFate {
    /// The same fate with every time moved by `offset_ns`.
    pub fn shifted(self, offset_ns: u64) -> PacketFate {
        let at = |t: u64| t.saturating_add(offset_ns);
        PacketFate {
            enqueued_ns: at(self.enqueued_ns),
            departed_ns: self.departed_ns.map(at),
            delivered_ns: self.delivered_ns.map(at),
            ..self
        }
    }

    /// When the packet was on the link: when it left the queue, or, refused,
    /// when it arrived.
    pub fn timestamp_ns(&self) -> u64 {
        self.departed_ns.unwrap_or(self.enqueued_ns)
    }
}

/// Receives every packet's bytes (as queued, before any corruption the
/// impairment applies) and fate. Returns false once it wants no more (its
/// reader is gone, or it has what it asked for): the pipeline then drops it.
/// Called on the packet path, so it must not block.
pub trait Tap: Send + Sync {
    fn record(&mut self, bytes: &[u8], fate: &PacketFate) -> bool;
}
