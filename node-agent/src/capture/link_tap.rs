//! The packet-path half of a capture: a [`Tap`] in the link's pipeline that
//! copies the first `snaplen` bytes of each packet with its annotations into a
//! bounded channel. It never waits: when the reader falls behind, packets are
//! counted as missed instead of slowing the link.

use crate::sched::{PacketFate, Tap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use tokio::sync::mpsc;

/// Packets buffered between the link and the capture's reader: a second of a
/// 100 Mbit/s link's full-size packets.
pub const CHANNEL_PACKETS: usize = 8192;

/// One packet as a capture keeps it: its first `snaplen` bytes and its fate,
/// in Unix nanoseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedPacket {
    pub data: Vec<u8>,
    pub fate: PacketFate,
}

/// Shared by a capture's two halves.
#[derive(Debug, Default)]
pub struct TapCounters {
    pub kept: AtomicU64,
    pub missed: AtomicU64,
}

pub struct LinkTap {
    tx: mpsc::Sender<CapturedPacket>,
    snaplen: usize,
    /// Packets still wanted; `None`: no limit.
    remaining: Option<u64>,
    /// Added to the pipeline's clock to get Unix nanoseconds.
    unix_offset_ns: u64,
    counters: Arc<TapCounters>,
}

impl LinkTap {
    pub fn new(
        tx: mpsc::Sender<CapturedPacket>,
        snaplen: u32,
        count: Option<u64>,
        unix_offset_ns: u64,
        counters: Arc<TapCounters>,
    ) -> LinkTap {
        LinkTap {
            tx,
            snaplen: snaplen as usize,
            remaining: count,
            unix_offset_ns,
            counters,
        }
    }
}

impl Tap for LinkTap {
    fn record(&mut self, bytes: &[u8], fate: &PacketFate) -> bool {
        if self.tx.is_closed() {
            return false;
        }
        let packet = CapturedPacket {
            data: bytes[..bytes.len().min(self.snaplen)].to_vec(),
            fate: fate.shifted(self.unix_offset_ns),
        };
        match self.tx.try_send(packet) {
            Ok(()) => {
                self.counters.kept.fetch_add(1, Relaxed);
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.counters.missed.fetch_add(1, Relaxed);
                return true;
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return false,
        }
        match self.remaining.as_mut() {
            Some(n) => {
                *n = n.saturating_sub(1);
                *n > 0
            }
            None => true,
        }
    }
}
