use super::Scheduler;
use crate::sched::QueueState;

/// First come, first served across all queues: the head that arrived first.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fcfs;

impl Scheduler for Fcfs {
    fn select(&mut self, queues: &[QueueState]) -> Option<usize> {
        queues
            .iter()
            .enumerate()
            .filter(|(_, q)| !q.is_empty())
            .min_by_key(|(_, q)| q.head_seq)
            .map(|(i, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::scheduler::tests::drain;

    #[test]
    fn serves_in_arrival_order() {
        // drain() numbers packets queue by queue, so arrival order is 0,0,1,2.
        let served = drain(&mut Fcfs, vec![vec![1, 1], vec![1], vec![1]], 10);
        assert_eq!(served, [0, 0, 1, 2]);
        assert_eq!(
            drain(&mut Fcfs, vec![vec![], vec![]], 10),
            Vec::<usize>::new()
        );
    }
}
