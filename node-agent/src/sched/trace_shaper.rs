//! A shaper that follows a packet-delivery trace in Mahimahi's format: each
//! entry is a millisecond offset at which the link may deliver one
//! [`OPPORTUNITY_BYTES`]-byte packet's worth of bytes, several entries at the
//! same millisecond being several opportunities; the trace repeats with the
//! period of its last entry. As in Mahimahi's link queue, an opportunity that
//! finds the queue empty is lost, one packet may fill several opportunities
//! and several small packets may share one, and packets leave exactly at
//! the opportunity that carries their last byte.
//!
//! The trace starts at an origin on the pipeline's clock: when the link's
//! pipeline was built, or when a new trace replaced the old one.

use super::shaper::Shaper;
use std::sync::Arc;

/// Bytes one delivery opportunity carries: a full-size IP packet, as in
/// Mahimahi's traces (their 1,504 bytes include a 4-byte TUN header).
pub const OPPORTUNITY_BYTES: u32 = 1500;

/// The longest trace a link takes: 250,000 entries is a 20-minute LTE trace
/// of Mahimahi's at its busiest, and about 750 KB in the hub's message to an
/// agent (gRPC refuses 4 MiB).
pub const MAX_TRACE_ENTRIES: usize = 250_000;

const NS_PER_MS: u64 = 1_000_000;

/// Why a trace cannot drive a link.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    #[error("no delivery opportunities")]
    Empty,
    #[error(
        "entry {index} ({ms} ms) is before the one above it ({previous} ms): offsets must not decrease"
    )]
    Decreasing {
        index: usize,
        ms: u32,
        previous: u32,
    },
    #[error("the last entry is 0 ms: the period must be at least 1 ms")]
    ZeroPeriod,
}

/// Checks a trace: at least one entry, offsets that never decrease, a last
/// offset (the period) above zero.
pub fn check_trace(ms: &[u32]) -> Result<(), TraceError> {
    let last = *ms.last().ok_or(TraceError::Empty)?;
    if let Some(index) = ms.windows(2).position(|w| w[1] < w[0]) {
        return Err(TraceError::Decreasing {
            index: index + 1,
            ms: ms[index + 1],
            previous: ms[index],
        });
    }
    if last == 0 {
        return Err(TraceError::ZeroPeriod);
    }
    Ok(())
}

/// The mean rate a trace offers, bits per second (for the parts that size
/// themselves by a link's rate, such as RED's idle decay).
pub fn trace_mean_rate_bps(ms: &[u32]) -> u64 {
    let Some(&period) = ms.last().filter(|&&p| p > 0) else {
        return 0;
    };
    ms.len() as u64 * u64::from(OPPORTUNITY_BYTES) * 8 * 1000 / u64::from(period)
}

/// Where the last packet ended: opportunity `index` (counted from the trace's
/// start over all its repetitions) with `left` bytes still unused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cursor {
    index: u64,
    left: u32,
}

#[derive(Debug, Clone)]
pub struct TraceShaper {
    ms: Arc<[u32]>,
    period_ns: u64,
    origin: u64,
    cursor: Option<Cursor>,
    /// The answer of the last `earliest` (length, departure, cursor after), so
    /// that `consume` charges exactly the opportunities it promised.
    planned: Option<(u32, u64, Cursor)>,
}

impl TraceShaper {
    /// A shaper over `ms` whose first cycle starts at `origin`.
    pub fn new(ms: Arc<[u32]>, origin: u64) -> Result<TraceShaper, TraceError> {
        check_trace(&ms)?;
        let period_ns = u64::from(*ms.last().unwrap_or(&1)) * NS_PER_MS;
        Ok(TraceShaper {
            ms,
            period_ns,
            origin,
            cursor: None,
            planned: None,
        })
    }

    pub fn trace(&self) -> &Arc<[u32]> {
        &self.ms
    }

    fn len(&self) -> u64 {
        self.ms.len() as u64
    }

    /// When opportunity `index` comes.
    fn time_of(&self, index: u64) -> u64 {
        let (cycle, i) = (index / self.len(), (index % self.len()) as usize);
        cycle
            .saturating_mul(self.period_ns)
            .saturating_add(u64::from(self.ms[i]) * NS_PER_MS)
            .saturating_add(self.origin)
    }

    /// The first opportunity at or after `t`.
    fn first_at_or_after(&self, t: u64) -> u64 {
        let t = t.saturating_sub(self.origin);
        let cycle = t / self.period_ns;
        let within = t - cycle * self.period_ns;
        // The last entry is the period itself, so the instant a cycle starts
        // still belongs to the cycle before it.
        let (cycle, within) = if within == 0 && cycle > 0 {
            (cycle - 1, self.period_ns)
        } else {
            (cycle, within)
        };
        let i = self
            .ms
            .partition_point(|&m| u64::from(m) * NS_PER_MS < within) as u64;
        cycle.saturating_mul(self.len()).saturating_add(i)
    }

    /// The opportunity a packet of `len` bytes at the head at `now` ends in,
    /// and the bytes left there.
    fn plan(&self, len: u32, now: u64) -> Cursor {
        // The last packet's opportunity still has room and has not passed.
        let (index, mut have) = match self.cursor {
            Some(c) if c.left > 0 && self.time_of(c.index) >= now => (c.index, c.left),
            Some(c) if self.time_of(c.index) >= now => (c.index + 1, OPPORTUNITY_BYTES),
            _ => (self.first_at_or_after(now), OPPORTUNITY_BYTES),
        };
        let mut extra = 0u64;
        if len > have {
            extra = u64::from((len - have).div_ceil(OPPORTUNITY_BYTES));
            have += (extra as u32).saturating_mul(OPPORTUNITY_BYTES);
        }
        Cursor {
            index: index.saturating_add(extra),
            left: have - len,
        }
    }
}

impl Shaper for TraceShaper {
    fn earliest(&mut self, len: u32, now: u64) -> u64 {
        let end = self.plan(len, now);
        let at = self.time_of(end.index);
        self.planned = Some((len, at, end));
        at
    }

    fn consume(&mut self, len: u32, at: u64) {
        let end = match self.planned.take() {
            Some((l, t, end)) if l == len && t == at => end,
            _ => self.plan(len, at),
        };
        self.cursor = Some(end);
    }

    /// A trace link has no rate: a new trace is a new shaper.
    fn set_rate(&mut self, _rate_bps: u64, _burst_bytes: u64, _now: u64) {}
}

#[cfg(test)]
mod tests {
    use super::super::shaper::send_backlog as send;
    use super::*;

    const MS: u64 = NS_PER_MS;

    fn shaper(ms: &[u32]) -> TraceShaper {
        TraceShaper::new(ms.into(), 0).expect("valid trace")
    }

    #[test]
    fn full_packets_leave_at_the_opportunities() {
        let mut s = shaper(&[1, 1, 3, 7, 10]);
        let times = send(&mut s, 8, 1500, 0);
        // Two at 1 ms, then 3, 7, 10; the trace repeats every 10 ms.
        assert_eq!(
            times,
            [MS, MS, 3 * MS, 7 * MS, 10 * MS, 11 * MS, 11 * MS, 13 * MS]
        );
    }

    #[test]
    fn opportunities_pass_unused_when_nothing_waits() {
        let mut s = shaper(&[2, 4, 6, 8, 10]);
        assert_eq!(send(&mut s, 1, 1500, 0), [2 * MS]);
        // Nothing queued until 5 ms: the one at 4 ms is gone.
        assert_eq!(send(&mut s, 2, 1500, 5 * MS), [6 * MS, 8 * MS]);
        // A packet at exactly an opportunity's instant takes it.
        assert_eq!(send(&mut s, 1, 1500, 20 * MS), [20 * MS]);
    }

    #[test]
    fn small_packets_share_and_large_ones_span_opportunities() {
        let mut s = shaper(&[1, 2, 3, 4]);
        // Three 500-byte packets fill the first opportunity.
        assert_eq!(send(&mut s, 4, 500, 0), [MS, MS, MS, 2 * MS]);
        // 1,000 left at 2 ms: a 4,000-byte packet needs the ones at 3 and 4 ms too.
        assert_eq!(send(&mut s, 1, 4000, 0), [4 * MS]);
        // The next starts in the second cycle; 1,400 of its 1,500 bytes are left.
        assert_eq!(send(&mut s, 1, 100, 0), [5 * MS]);
        // The leftover of a passed opportunity is lost: at 50 ms (cycle 12's
        // 2 ms) a fresh one.
        assert_eq!(send(&mut s, 2, 1500, 50 * MS), [50 * MS, 51 * MS]);
    }

    #[test]
    fn a_backlogged_link_delivers_the_traces_bytes() {
        // 4 opportunities every ms for 500 ms, then 1 every ms for 500 ms:
        // 48 Mbit/s, then 12 Mbit/s; 1,400-byte packets pack bytes exactly.
        let mut ms = Vec::new();
        for t in 1..=1000u32 {
            let n = if t <= 500 { 4 } else { 1 };
            ms.extend(std::iter::repeat_n(t, n));
        }
        assert_eq!(trace_mean_rate_bps(&ms), 30_000_000);
        let mut s = shaper(&ms);
        let times = send(&mut s, 40_000, 1400, 0);
        for (second, expected) in [
            (0u64, 2_500 * 1500u64),
            (1, 2_500 * 1500),
            (2, 2_500 * 1500),
        ] {
            let bytes = times
                .iter()
                .filter(|&&t| t > second * 1000 * MS && t <= (second + 1) * 1000 * MS)
                .count() as u64
                * 1400;
            let error = bytes.abs_diff(expected) as f64 / expected as f64;
            assert!(
                error < 0.001,
                "second {second}: {bytes} bytes vs {expected}"
            );
        }
        let fast = times.iter().filter(|&&t| t > 0 && t <= 500 * MS).count();
        let slow = times
            .iter()
            .filter(|&&t| t > 500 * MS && t <= 1000 * MS)
            .count();
        assert_eq!((fast, slow), (2000 * 1500 / 1400, 500 * 1500 / 1400 + 1));
    }

    #[test]
    fn a_trace_starts_at_its_origin() {
        let mut s = TraceShaper::new([5, 10].as_slice().into(), 7 * MS).expect("valid");
        assert_eq!(send(&mut s, 3, 1500, 0), [12 * MS, 17 * MS, 22 * MS]);
    }

    #[test]
    fn bad_traces_are_refused_with_the_entry() {
        assert_eq!(check_trace(&[]), Err(TraceError::Empty));
        assert_eq!(check_trace(&[0, 0]), Err(TraceError::ZeroPeriod));
        let err = check_trace(&[1, 5, 3]).expect_err("decreasing");
        assert_eq!(
            err.to_string(),
            "entry 2 (3 ms) is before the one above it (5 ms): offsets must not decrease"
        );
        assert!(check_trace(&[0, 0, 1]).is_ok());
    }
}
