//! Finished-flow results on their way to the hub. A batch stays here until the
//! hub says it stored it, and everything unconfirmed is sent again on the next
//! session, so a hub restart or a dropped stream loses no result; the hub's
//! primary key makes a repeated one harmless.

use nextmini_proto::v1 as pb;
use std::collections::{BTreeMap, VecDeque};

/// Results per report message.
const MAX_BATCH: usize = 2000;
/// Unconfirmed results kept while the hub is away; the oldest go first beyond it.
const MAX_KEPT: usize = 1_000_000;

#[derive(Debug, Default)]
pub struct ResultOutbox {
    next_sequence: u64,
    unsent: VecDeque<pb::FlowResult>,
    in_flight: BTreeMap<u64, Vec<pb::FlowResult>>,
    dropped: u64,
}

impl ResultOutbox {
    pub fn push(&mut self, result: pb::FlowResult) {
        if self.unsent.len() + self.in_flight_len() >= MAX_KEPT {
            self.unsent.pop_front();
            self.dropped += 1;
        }
        self.unsent.push_back(result);
        crate::news::touch();
    }

    fn in_flight_len(&self) -> usize {
        self.in_flight.values().map(Vec::len).sum()
    }

    /// The next batch to send, if there is anything new.
    pub fn next_report(&mut self) -> Option<pb::FlowReport> {
        if self.unsent.is_empty() {
            return None;
        }
        self.next_sequence += 1;
        let n = self.unsent.len().min(MAX_BATCH);
        let results: Vec<pb::FlowResult> = self.unsent.drain(..n).collect();
        self.in_flight.insert(self.next_sequence, results.clone());
        Some(pb::FlowReport {
            sequence: self.next_sequence,
            results,
        })
    }

    /// The hub stored batch `sequence`.
    pub fn stored(&mut self, sequence: u64) {
        self.in_flight.remove(&sequence);
    }

    /// A new session: what the last one did not confirm goes again, first.
    pub fn resend_unconfirmed(&mut self) {
        for (_, batch) in std::mem::take(&mut self.in_flight).into_iter().rev() {
            for r in batch.into_iter().rev() {
                self.unsent.push_front(r);
            }
        }
    }

    /// Results not yet confirmed by the hub.
    pub fn pending(&self) -> usize {
        self.unsent.len() + self.in_flight_len()
    }

    /// Results given up while the hub was away too long.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(instance: u32) -> pb::FlowResult {
        pb::FlowResult {
            flow: "f".into(),
            instance,
            ..Default::default()
        }
    }

    #[test]
    fn unconfirmed_results_are_sent_again_in_order() {
        let mut o = ResultOutbox::default();
        for i in 0..3 {
            o.push(result(i));
        }
        let first = o.next_report().expect("batch");
        assert_eq!(first.results.len(), 3);
        assert!(o.next_report().is_none(), "nothing new");
        o.push(result(3));
        let second = o.next_report().expect("batch");
        assert_eq!(o.pending(), 4);
        o.stored(second.sequence);
        // The stream broke before the first batch was confirmed.
        o.resend_unconfirmed();
        let again = o.next_report().expect("resent");
        let instances: Vec<u32> = again.results.iter().map(|r| r.instance).collect();
        assert_eq!(instances, [0, 1, 2]);
        assert_ne!(again.sequence, first.sequence);
        o.stored(again.sequence);
        assert_eq!(o.pending(), 0);
        o.stored(first.sequence);
        assert_eq!(o.pending(), 0, "a late confirmation is harmless");
    }

    #[test]
    fn batches_are_bounded() {
        let mut o = ResultOutbox::default();
        for i in 0..(MAX_BATCH as u32 + 5) {
            o.push(result(i));
        }
        assert_eq!(o.next_report().map(|r| r.results.len()), Some(MAX_BATCH));
        assert_eq!(o.next_report().map(|r| r.results.len()), Some(5));
    }
}
