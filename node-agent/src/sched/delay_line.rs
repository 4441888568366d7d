//! Packets on the emulated wire, released in order of arrival time.
//!
//! Releases are almost always in FIFO order (constant delay, FIFO-preserving
//! jitter), so the common case is a ring buffer; the few packets that overtake
//! (reorder) wait in a heap beside it. Popping merges the two by (time, sequence).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

#[derive(Debug)]
pub(crate) struct Slot<P> {
    pub at: u64,
    seq: u64,
    pub len: u32,
    /// Wire packets it stands for: more than one for a train.
    pub segments: u32,
    pub payload: P,
}

impl<P> Slot<P> {
    fn key(&self) -> (u64, u64) {
        (self.at, self.seq)
    }
}

// Reversed so `BinaryHeap` (a max-heap) pops the earliest release first.
impl<P> Ord for Slot<P> {
    fn cmp(&self, other: &Self) -> Ordering {
        other.key().cmp(&self.key())
    }
}

impl<P> PartialOrd for Slot<P> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<P> PartialEq for Slot<P> {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl<P> Eq for Slot<P> {}

#[derive(Debug)]
pub(crate) struct DelayLine<P> {
    fifo: VecDeque<Slot<P>>,
    ahead: BinaryHeap<Slot<P>>,
    seq: u64,
}

impl<P> Default for DelayLine<P> {
    fn default() -> Self {
        DelayLine {
            fifo: VecDeque::new(),
            ahead: BinaryHeap::new(),
            seq: 0,
        }
    }
}

impl<P> DelayLine<P> {
    /// Puts a packet on the wire; true when it overtakes one already there.
    pub fn push(&mut self, at: u64, len: u32, segments: u32, payload: P) -> bool {
        self.seq += 1;
        let slot = Slot {
            at,
            seq: self.seq,
            len,
            segments,
            payload,
        };
        if self.fifo.back().is_none_or(|last| last.at <= at) {
            self.fifo.push_back(slot);
            false
        } else {
            self.ahead.push(slot);
            true
        }
    }

    /// The next packet due at or before `now`.
    pub fn pop_due(&mut self, now: u64) -> Option<Slot<P>> {
        let (ahead, fifo) = (self.ahead.peek(), self.fifo.front());
        let take_ahead = match (ahead, fifo) {
            (Some(a), Some(f)) => a.key() < f.key(),
            (a, _) => a.is_some(),
        };
        let due = if take_ahead { ahead } else { fifo }.is_some_and(|s| s.at <= now);
        if !due {
            None
        } else if take_ahead {
            self.ahead.pop()
        } else {
            self.fifo.pop_front()
        }
    }

    pub fn next_release(&self) -> Option<u64> {
        let fifo = self.fifo.front().map(|s| s.at);
        let ahead = self.ahead.peek().map(|s| s.at);
        fifo.into_iter().chain(ahead).min()
    }

    /// Release time of the last packet in FIFO order.
    pub fn fifo_tail(&self) -> Option<u64> {
        self.fifo.back().map(|s| s.at)
    }

    pub fn len(&self) -> usize {
        self.fifo.len() + self.ahead.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(line: &mut DelayLine<u32>, now: u64) -> Vec<u32> {
        std::iter::from_fn(|| line.pop_due(now).map(|s| s.payload)).collect()
    }

    #[test]
    fn merges_overtakers_by_time_then_arrival() {
        let mut line = DelayLine::default();
        assert!(!line.push(100, 1, 1, 1));
        assert!(!line.push(100, 1, 1, 2));
        assert!(!line.push(200, 1, 1, 3));
        assert!(line.push(50, 1, 1, 4), "overtakes");
        assert!(line.push(100, 1, 1, 5), "ties keep arrival order");
        assert_eq!(line.len(), 5);
        assert_eq!(line.next_release(), Some(50));
        assert_eq!(line.fifo_tail(), Some(200));
        assert_eq!(drain(&mut line, 49), Vec::<u32>::new());
        assert_eq!(drain(&mut line, 100), [4, 1, 2, 5]);
        assert_eq!(line.next_release(), Some(200));
        assert_eq!(drain(&mut line, 1000), [3]);
        assert_eq!(line.next_release(), None);
    }
}
