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
    pub drops_queue: AtomicU64,
    pub drops_aqm: AtomicU64,
    pub drops_loss: AtomicU64,
    pub ecn_marks: AtomicU64,
    pub queue_packets: AtomicU64,
    pub queue_bytes: AtomicU64,
    /// Latest keepalive round trip of the connection, microseconds (0 = none yet).
    pub rtt_us: AtomicU64,
}

impl LinkCounters {
    /// Copies the pipeline's cumulative figures, read by the reporter.
    pub fn record_pipeline(&self, stats: &crate::sched::PipelineStats) {
        self.drops_queue.store(stats.drops.queue_full, Relaxed);
        self.drops_aqm.store(stats.drops.aqm, Relaxed);
        self.drops_loss.store(stats.drops.loss, Relaxed);
        self.ecn_marks.store(stats.ecn_marked, Relaxed);
        self.queue_packets.store(stats.queued.packets, Relaxed);
        self.queue_bytes.store(stats.queued.bytes, Relaxed);
    }

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
            drops_queue: self.drops_queue.load(Relaxed),
            drops_aqm: self.drops_aqm.load(Relaxed),
            drops_loss: self.drops_loss.load(Relaxed),
            ecn_marks: self.ecn_marks.load(Relaxed),
            queue_packets: self.queue_packets.load(Relaxed),
            queue_bytes: self.queue_bytes.load(Relaxed),
            rtt_us: self.rtt_us.load(Relaxed),
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
