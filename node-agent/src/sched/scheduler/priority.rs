use super::Scheduler;
use crate::sched::QueueState;

/// Strict priority: queue 0 first; a lower band is served only when every higher
/// band is empty, so it may starve (that is the point).
#[derive(Debug, Clone, Copy, Default)]
pub struct StrictPriority;

impl Scheduler for StrictPriority {
    fn select(&mut self, queues: &[QueueState]) -> Option<usize> {
        queues.iter().position(|q| !q.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::scheduler::tests::drain;

    #[test]
    fn higher_bands_starve_lower_ones() {
        let served = drain(
            &mut StrictPriority,
            vec![vec![1; 3], vec![1; 2], vec![1; 2]],
            100,
        );
        assert_eq!(served, [0, 0, 0, 1, 1, 2, 2]);
    }
}
