use super::{Scheduler, next_busy};
use crate::sched::{PacketMeta, QueueState};

/// Weighted round robin: each queue's turn lasts up to `weight` packets.
#[derive(Debug, Clone)]
pub struct Wrr {
    weights: Vec<u32>,
    /// The queue whose turn it is and how many packets it may still send.
    turn: Option<(usize, u32)>,
}

impl Wrr {
    /// One weight per queue; zero weights are treated as one.
    pub fn new(weights: Vec<u32>) -> Wrr {
        Wrr {
            weights: weights.into_iter().map(|w| w.max(1)).collect(),
            turn: None,
        }
    }
}

impl Scheduler for Wrr {
    fn select(&mut self, queues: &[QueueState]) -> Option<usize> {
        if let Some((q, credit)) = self.turn
            && credit > 0
            && queues.get(q).is_some_and(|s| !s.is_empty())
        {
            return Some(q);
        }
        // Turn over, or the queue ran dry: the next busy queue starts a fresh turn.
        let from = self.turn.map_or(0, |(q, _)| q + 1) % queues.len().max(1);
        let q = next_busy(queues, from)?;
        self.turn = Some((q, self.weights.get(q).copied().unwrap_or(1)));
        Some(q)
    }

    fn on_dequeue(&mut self, queue: usize, _: &PacketMeta, _: &[QueueState]) {
        if let Some((q, credit)) = &mut self.turn
            && *q == queue
        {
            *credit = credit.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::scheduler::tests::drain;

    #[test]
    fn weights_are_honoured() {
        let lens = vec![vec![1; 3000], vec![1; 3000]];
        let served = drain(&mut Wrr::new(vec![3, 1]), lens, 4000);
        assert_eq!(served[..8], [0, 0, 0, 1, 0, 0, 0, 1]);
        let zeros = served.iter().filter(|&&q| q == 0).count();
        assert_eq!((zeros, served.len() - zeros), (3000, 1000));
    }

    #[test]
    fn idle_queues_are_skipped() {
        let lens = vec![vec![1; 4], vec![], vec![1; 4]];
        let served = drain(&mut Wrr::new(vec![2, 5, 1]), lens, 100);
        assert_eq!(served, [0, 0, 2, 0, 0, 2, 2, 2]);
    }
}
