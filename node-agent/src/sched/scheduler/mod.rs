//! Schedule: which non-empty queue the link serves next (Flexplane's `schedule`).

mod drr;
mod fcfs;
mod priority;
mod wrr;

pub use drr::Drr;
pub use fcfs::Fcfs;
pub use priority::StrictPriority;
pub use wrr::Wrr;

use super::{Classifier, PacketMeta, QueueState};

pub trait Scheduler: Send + Sync {
    /// A scheduler that sorts packets into its queues itself (pFabric: one queue
    /// per flow) gives the classifier here; it then replaces the link's class rules.
    fn classifier(&self) -> Option<Box<dyn Classifier>> {
        None
    }

    /// The non-empty queue to serve next, or `None` when all are empty. The pipeline
    /// may ask again before dequeuing (e.g. while the shaper holds the packet back),
    /// so asking twice with nothing in between must give the same answer.
    fn select(&mut self, queues: &[QueueState]) -> Option<usize>;

    /// Told when a packet joined `queue`.
    fn on_enqueue(&mut self, _queue: usize, _meta: &PacketMeta) {}

    /// Told when the packet `meta` left `queue`; `queues` is the state after.
    fn on_dequeue(&mut self, _queue: usize, _meta: &PacketMeta, _queues: &[QueueState]) {}
}

/// The first non-empty queue at or after `from`, wrapping around.
pub(crate) fn next_busy(queues: &[QueueState], from: usize) -> Option<usize> {
    let n = queues.len();
    (0..n)
        .map(|i| (from + i) % n)
        .find(|&q| !queues[q].is_empty())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Drives a scheduler over queues of packet lengths without a pipeline; returns
    /// the queue served at each step.
    pub(crate) fn drain(
        s: &mut dyn Scheduler,
        mut lens: Vec<Vec<u32>>,
        steps: usize,
    ) -> Vec<usize> {
        let mut seq = 0;
        let mut seqs: Vec<Vec<u64>> = lens
            .iter()
            .map(|q| {
                q.iter()
                    .map(|_| {
                        seq += 1;
                        seq
                    })
                    .collect()
            })
            .collect();
        let state = |lens: &Vec<Vec<u32>>, seqs: &Vec<Vec<u64>>| -> Vec<QueueState> {
            lens.iter()
                .zip(seqs)
                .map(|(q, s)| QueueState {
                    packets: q.len() as u32,
                    bytes: q.iter().map(|&l| u64::from(l)).sum(),
                    head_len: q.first().copied().unwrap_or(0),
                    head_seq: s.first().copied().unwrap_or(0),
                })
                .collect()
        };
        let mut served = Vec::new();
        for _ in 0..steps {
            let before = state(&lens, &seqs);
            let Some(q) = s.select(&before) else { break };
            assert_eq!(s.select(&before), Some(q), "select must be idempotent");
            assert!(!before[q].is_empty(), "selected an empty queue");
            let len = lens[q].remove(0);
            seqs[q].remove(0);
            s.on_dequeue(q, &PacketMeta::with_len(len), &state(&lens, &seqs));
            served.push(q);
        }
        served
    }

    #[test]
    fn next_busy_wraps() {
        let mut qs = vec![QueueState::default(); 4];
        assert_eq!(next_busy(&qs, 2), None);
        qs[1].packets = 1;
        assert_eq!(next_busy(&qs, 2), Some(1));
        assert_eq!(next_busy(&qs, 1), Some(1));
    }
}
