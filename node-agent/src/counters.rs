//! Per-link counters, shared lock-free between the link's tasks, the processors
//! and the reporter.

use nextmini_proto::v1 as pb;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

#[derive(Debug, Default)]
pub struct LinkCounters {
    pub connected: AtomicBool,
    pub tx_bytes: AtomicU64,
    pub tx_packets: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub rx_packets: AtomicU64,
    pub drops: AtomicU64,
    pub connects: AtomicU64,
}

impl LinkCounters {
    pub fn count_tx(&self, bytes: usize) {
        self.tx_bytes.fetch_add(bytes as u64, Relaxed);
        self.tx_packets.fetch_add(1, Relaxed);
    }

    pub fn count_rx(&self, bytes: usize) {
        self.rx_bytes.fetch_add(bytes as u64, Relaxed);
        self.rx_packets.fetch_add(1, Relaxed);
    }

    pub fn count_drop(&self) {
        self.drops.fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self, link: &str) -> pb::LinkCounters {
        pb::LinkCounters {
            link: link.to_string(),
            connected: self.connected.load(Relaxed),
            tx_bytes: self.tx_bytes.load(Relaxed),
            tx_packets: self.tx_packets.load(Relaxed),
            rx_bytes: self.rx_bytes.load(Relaxed),
            rx_packets: self.rx_packets.load(Relaxed),
            drops: self.drops.load(Relaxed),
            connects: self.connects.load(Relaxed),
        }
    }
}

/// Drops that belong to no link (no route, hop limit, unparsable packet).
#[derive(Debug, Default)]
pub struct NodeCounters {
    pub no_route: AtomicU64,
    pub hop_limit: AtomicU64,
    pub malformed: AtomicU64,
    pub tun_rx_packets: AtomicU64,
    pub tun_tx_packets: AtomicU64,
}
