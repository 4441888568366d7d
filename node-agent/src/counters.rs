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
    /// Packets that reached the hop limit on their way out over this link.
    pub drops_loop: AtomicU64,
    /// Packets handed to the connection later than the emulated link released
    /// them, by more than the fidelity guard's bound.
    pub late_packets: AtomicU64,
    /// Time the link ran behind its emulated schedule (cumulative, ns).
    pub behind_ns: AtomicU64,
    /// The worst lateness since the last report, nanoseconds.
    pub max_late_ns: AtomicU64,
    /// Packets dropped while a scenario held the link down (also in `drops`).
    pub drops_down: AtomicU64,
    /// Bytes of frames this node moved onto the link's connection from
    /// another link's with splice(2), never copied into user space (a
    /// cut-through transit hop); also in `tx_bytes` as packet bytes.
    pub spliced_bytes: AtomicU64,
    /// The fidelity guard's verdict on the last report window.
    pub unfaithful: AtomicBool,
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
        self.late_packets.store(stats.late, Relaxed);
        self.behind_ns.store(stats.behind_ns, Relaxed);
        crate::news::touch();
    }

    /// Folds the lateness of one poll into the report window's worst.
    pub fn record_lateness(&self, ns: u64) {
        self.max_late_ns.fetch_max(ns, Relaxed);
    }

    /// Counts what was sent as the packets it stands for on a wire: a
    /// super-packet counts as its segments, with their headers.
    pub fn count_tx(&self, packets: u64, bytes: u64) {
        self.tx_bytes.fetch_add(bytes, Relaxed);
        self.tx_packets.fetch_add(packets, Relaxed);
        crate::news::touch();
    }

    pub fn count_rx(&self, packets: u64, bytes: u64) {
        self.rx_bytes.fetch_add(bytes, Relaxed);
        self.rx_packets.fetch_add(packets, Relaxed);
        crate::news::touch();
    }

    pub fn count_drop(&self) {
        self.drops.fetch_add(1, Relaxed);
        crate::news::touch();
    }

    /// A packet dropped because the link is down (a timed scenario's doing).
    pub fn count_down_drop(&self) {
        self.drops.fetch_add(1, Relaxed);
        self.drops_down.fetch_add(1, Relaxed);
        crate::news::touch();
    }

    /// A packet that reached the hop limit on its way out over this link.
    pub fn count_loop_drop(&self) {
        self.drops_loop.fetch_add(1, Relaxed);
        crate::news::touch();
    }

    /// Bytes spliced onto this link's connection (see `spliced_bytes`).
    pub fn count_spliced(&self, bytes: u64) {
        self.spliced_bytes.fetch_add(bytes, Relaxed);
        crate::news::touch();
    }

    /// The connection came up (counted as a connect) or went down.
    pub fn set_connected(&self, up: bool) {
        self.connected.store(up, Relaxed);
        if up {
            self.connects.fetch_add(1, Relaxed);
        }
        crate::news::touch();
    }

    /// The connection's latest round trip. Only the first is news to the hub
    /// (it says the link forwards); later ones ride on the next report.
    pub fn set_rtt_us(&self, rtt_us: u64) {
        if self.rtt_us.swap(rtt_us, Relaxed) == 0 && rtt_us > 0 {
            crate::news::touch();
        }
    }

    /// The counters for a report; starts a new window of the worst lateness.
    pub fn report(&self, link: &str) -> pb::LinkCounters {
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
            drops_loop: self.drops_loop.load(Relaxed),
            late_packets: self.late_packets.load(Relaxed),
            max_late_us: self.max_late_ns.swap(0, Relaxed) / 1000,
            behind_us: self.behind_ns.load(Relaxed) / 1000,
            drops_down: self.drops_down.load(Relaxed),
            unfaithful: String::new(),
        }
    }
}

/// Drops that belong to no link (no route, hop limit, expired TTL, unparsable packet).
#[derive(Debug, Default)]
pub struct NodeCounters {
    pub no_route: AtomicU64,
    pub hop_limit: AtomicU64,
    /// Packets whose TTL or hop limit ran out here (`ttl: decrement`).
    pub ttl_expired: AtomicU64,
    pub malformed: AtomicU64,
    pub tun_rx_packets: AtomicU64,
    pub tun_tx_packets: AtomicU64,
    /// TUN reads and writes that carried a super-packet whole (offload).
    pub tun_rx_super: AtomicU64,
    pub tun_tx_super: AtomicU64,
    /// Packets each processor routed, by processor index; set once, when the
    /// processors start. Shows whether flows really spread over processors.
    pub processed: std::sync::OnceLock<Box<[ProcessorCount]>>,
}

/// One processor's packet count, alone on its cache line: processors run on
/// different cores and count every packet, and neighbours sharing a line would
/// bounce it between the cores at each increment.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct ProcessorCount(pub AtomicU64);

impl NodeCounters {
    /// Packets each processor routed so far (empty before they start).
    pub fn processed(&self) -> Vec<u64> {
        self.processed
            .get()
            .map(|c| c.iter().map(|v| v.0.load(Relaxed)).collect())
            .unwrap_or_default()
    }
}

/// SOCKS and max-mode relays of this agent (read by the metrics collector).
#[derive(Debug, Default)]
pub struct RelayCounters {
    /// Bytes this agent moved between two sockets, both directions summed, by mode.
    pub normal_bytes: AtomicU64,
    pub max_bytes: AtomicU64,
    /// Relayed connections set up, by mode, and how many run now.
    pub normal_connections: AtomicU64,
    pub max_connections: AtomicU64,
    pub normal_active: AtomicU64,
    pub max_active: AtomicU64,
    /// Directions of relayed connections that splice() refused, moved by a copy loop.
    pub splice_fallbacks: AtomicU64,
    /// SOCKS clients turned away, by reason.
    pub socks_refused_auth: AtomicU64,
    pub socks_refused_request: AtomicU64,
    pub socks_refused_connect: AtomicU64,
    /// Max-mode hop connections refused (bad header or tag, no route, hop limit).
    pub max_refused: AtomicU64,
}

impl RelayCounters {
    pub fn bytes(&self, max: bool) -> &AtomicU64 {
        if max {
            &self.max_bytes
        } else {
            &self.normal_bytes
        }
    }

    /// Counts a relayed connection, active until the guard is dropped.
    pub fn connection(self: &std::sync::Arc<Self>, max: bool) -> ActiveRelay {
        let (total, active) = if max {
            (&self.max_connections, &self.max_active)
        } else {
            (&self.normal_connections, &self.normal_active)
        };
        total.fetch_add(1, Relaxed);
        active.fetch_add(1, Relaxed);
        ActiveRelay {
            counters: self.clone(),
            max,
        }
    }
}

pub struct ActiveRelay {
    counters: std::sync::Arc<RelayCounters>,
    max: bool,
}

impl Drop for ActiveRelay {
    fn drop(&mut self) {
        let active = if self.max {
            &self.counters.max_active
        } else {
            &self.counters.normal_active
        };
        active.fetch_sub(1, Relaxed);
    }
}
