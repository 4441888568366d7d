use super::Scheduler;
use crate::sched::{PacketMeta, QueueState};

/// Deficit round robin (Shreedhar & Varghese): each turn credits a queue its
/// quantum in bytes; it sends while its head fits the deficit. Byte-fair whatever
/// the packet sizes, unlike WRR.
#[derive(Debug, Clone)]
pub struct Drr {
    quanta: Vec<u64>,
    deficits: Vec<u64>,
    current: usize,
    /// Whether the current queue has been credited for this turn.
    credited: bool,
}

impl Drr {
    /// One quantum per queue in bytes; zeros are treated as one byte.
    pub fn new(quanta: Vec<u32>) -> Drr {
        let n = quanta.len();
        Drr {
            quanta: quanta.into_iter().map(|q| u64::from(q.max(1))).collect(),
            deficits: vec![0; n],
            current: 0,
            credited: false,
        }
    }

    fn advance(&mut self, n: usize) {
        self.current = (self.current + 1) % n;
        self.credited = false;
    }
}

impl Scheduler for Drr {
    fn select(&mut self, queues: &[QueueState]) -> Option<usize> {
        let n = queues.len();
        if n == 0 || queues.iter().all(QueueState::is_empty) {
            return None;
        }
        if self.deficits.len() != n {
            self.deficits.resize(n, 0);
            self.current %= n;
        }
        // Terminates: every visit to a busy queue at a fresh turn adds at least one
        // byte to its deficit, so some head fits eventually.
        loop {
            let q = self.current;
            let state = &queues[q];
            if state.is_empty() {
                self.deficits[q] = 0;
                self.advance(n);
                continue;
            }
            if !self.credited {
                self.deficits[q] += self.quanta.get(q).copied().unwrap_or(1500);
                self.credited = true;
            }
            if self.deficits[q] >= u64::from(state.head_len) {
                return Some(q);
            }
            self.advance(n);
        }
    }

    fn on_dequeue(&mut self, queue: usize, meta: &PacketMeta, queues: &[QueueState]) {
        if let Some(d) = self.deficits.get_mut(queue) {
            *d = d.saturating_sub(u64::from(meta.len));
            // An emptied queue keeps no credit, or it could burst when it returns.
            if queues.get(queue).is_none_or(QueueState::is_empty) {
                *d = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::scheduler::tests::drain;

    #[test]
    fn byte_fair_with_unequal_packet_sizes() {
        // Queue 0 sends 1500-byte packets, queue 1 sends 100-byte ones; both always
        // busy. Over the first N packets, bytes served must be about equal.
        let lens = vec![vec![1500; 2000], vec![100; 30_000]];
        let served = drain(&mut Drr::new(vec![1500, 1500]), lens, 16_000);
        let bytes = |q| {
            served.iter().filter(|&&s| s == q).count() as f64 * if q == 0 { 1500.0 } else { 100.0 }
        };
        let (b0, b1) = (bytes(0), bytes(1));
        assert!((b0 - b1).abs() / b0 < 0.01, "{b0} vs {b1}");
    }

    #[test]
    fn quanta_set_shares() {
        let lens = vec![vec![1000; 5000], vec![1000; 5000]];
        let served = drain(&mut Drr::new(vec![3000, 1000]), lens, 4000);
        let zeros = served.iter().filter(|&&s| s == 0).count();
        assert_eq!((zeros, served.len() - zeros), (3000, 1000));
    }

    #[test]
    fn small_quantum_still_serves_big_packets() {
        let served = drain(
            &mut Drr::new(vec![100, 100]),
            vec![vec![1500; 2], vec![1500]],
            10,
        );
        assert_eq!(served.len(), 3);
    }
}
