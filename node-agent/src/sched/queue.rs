//! The FIFO queues between enqueue and schedule, and the per-queue state that
//! AQMs and schedulers decide on.

use super::PacketMeta;
use std::collections::VecDeque;

/// What a scheme may know about one queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueState {
    pub packets: u32,
    pub bytes: u64,
    /// Length of the head packet; 0 when empty.
    pub head_len: u32,
    /// Pipeline-wide arrival number of the head packet, so FCFS can serve several
    /// queues in arrival order; 0 when empty.
    pub head_seq: u64,
}

impl QueueState {
    pub fn is_empty(&self) -> bool {
        self.packets == 0
    }
}

#[derive(Debug)]
pub(crate) struct Entry<P> {
    pub payload: P,
    pub meta: PacketMeta,
    /// Wire packets it stands for: more than one for a train (a super-packet a
    /// plain rate-limited link charges and releases whole). Queue states and
    /// limits count these, so a train takes the room its packets would.
    pub segments: u32,
    /// When the packet arrived: it cannot leave earlier.
    pub arrival: u64,
    pub seq: u64,
    /// What a capture reports of its arrival: the queue's depth before it
    /// (packets, bytes) and whether the AQM marked it ECN CE.
    pub depth_packets: u32,
    pub depth_bytes: u64,
    pub marked: bool,
}

/// Ring buffers (no allocation per packet once warmed up) plus their states.
#[derive(Debug)]
pub(crate) struct Queues<P> {
    fifos: Vec<VecDeque<Entry<P>>>,
    states: Vec<QueueState>,
    packets: u64,
    bytes: u64,
}

impl<P> Queues<P> {
    pub fn new(n: usize) -> Queues<P> {
        Queues {
            fifos: (0..n).map(|_| VecDeque::new()).collect(),
            states: vec![QueueState::default(); n],
            packets: 0,
            bytes: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.fifos.len()
    }

    pub fn states(&self) -> &[QueueState] {
        &self.states
    }

    pub fn packets(&self) -> u64 {
        self.packets
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn front(&self, q: usize) -> Option<&Entry<P>> {
        self.fifos.get(q)?.front()
    }

    pub fn push(&mut self, q: usize, entry: Entry<P>) {
        let len = u64::from(entry.meta.len);
        let state = &mut self.states[q];
        if state.packets == 0 {
            state.head_len = entry.meta.len;
            state.head_seq = entry.seq;
        }
        state.packets += entry.segments;
        state.bytes += len;
        self.packets += u64::from(entry.segments);
        self.bytes += len;
        self.fifos[q].push_back(entry);
    }

    pub fn pop(&mut self, q: usize) -> Option<Entry<P>> {
        let fifo = self.fifos.get_mut(q)?;
        let entry = fifo.pop_front()?;
        let len = u64::from(entry.meta.len);
        let state = &mut self.states[q];
        state.packets -= entry.segments;
        state.bytes -= len;
        (state.head_len, state.head_seq) = fifo.front().map_or((0, 0), |e| (e.meta.len, e.seq));
        self.packets -= u64::from(entry.segments);
        self.bytes -= len;
        Some(entry)
    }

    /// Changes the number of queues. Packets of removed queues move to the new
    /// last queue in arrival order, so a reconfiguration loses nothing.
    pub fn resize(&mut self, n: usize) {
        let n = n.max(1);
        if n >= self.fifos.len() {
            self.fifos.resize_with(n, VecDeque::new);
            self.states.resize(n, QueueState::default());
            return;
        }
        let mut moved: Vec<Entry<P>> = self.fifos.drain(n - 1..).flatten().collect();
        moved.sort_by_key(|e| e.seq);
        self.states.truncate(n - 1);
        self.fifos.push(VecDeque::new());
        self.states.push(QueueState::default());
        let (packets, bytes) = (self.packets, self.bytes);
        for e in moved {
            self.push(n - 1, e);
        }
        // `push` counted the moved packets a second time.
        (self.packets, self.bytes) = (packets, bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64, len: u32) -> Entry<u64> {
        Entry {
            payload: seq,
            meta: PacketMeta::with_len(len),
            segments: 1,
            arrival: 0,
            seq,
            depth_packets: 0,
            depth_bytes: 0,
            marked: false,
        }
    }

    #[test]
    fn state_follows_the_head() {
        let mut q = Queues::new(2);
        q.push(1, entry(1, 100));
        q.push(1, entry(2, 200));
        let s = q.states()[1];
        assert_eq!(
            (s.packets, s.bytes, s.head_len, s.head_seq),
            (2, 300, 100, 1)
        );
        assert_eq!(q.pop(1).map(|e| e.payload), Some(1));
        let s = q.states()[1];
        assert_eq!(
            (s.packets, s.bytes, s.head_len, s.head_seq),
            (1, 200, 200, 2)
        );
        assert_eq!(q.pop(1).map(|e| e.payload), Some(2));
        assert_eq!(q.states()[1], QueueState::default());
        assert!(q.pop(1).is_none());
        assert!(q.pop(7).is_none());
        assert_eq!((q.packets(), q.bytes()), (0, 0));
    }

    #[test]
    fn shrinking_merges_in_arrival_order() {
        let mut q = Queues::new(3);
        q.push(0, entry(1, 10));
        q.push(2, entry(2, 10));
        q.push(1, entry(3, 10));
        q.push(2, entry(4, 10));
        q.resize(2);
        assert_eq!(q.len(), 2);
        assert_eq!((q.packets(), q.bytes()), (4, 40));
        assert_eq!(q.states()[1].packets, 3);
        let order: Vec<u64> = std::iter::from_fn(|| q.pop(1).map(|e| e.payload)).collect();
        assert_eq!(order, [2, 3, 4]);
        q.resize(4);
        assert_eq!(q.len(), 4);
        assert_eq!(q.packets(), 1);
    }
}
