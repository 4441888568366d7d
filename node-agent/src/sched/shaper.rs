//! The shaper gate between the scheduler and the wire: a token bucket (or a
//! delivery trace, `trace_shaper.rs`).

/// Decides when a packet may leave. Times are nanoseconds on the pipeline's clock.
pub trait Shaper: Send + Sync {
    /// Earliest instant at or after `now` at which `len` bytes may leave. The
    /// pipeline charges the packet with [`Shaper::consume`] right after, at the
    /// instant returned, so a shaper may keep what it worked out (`&mut`).
    fn earliest(&mut self, len: u32, now: u64) -> u64;

    /// Charges `len` bytes that left at `at` (never before an earlier charge).
    fn consume(&mut self, len: u32, at: u64);

    /// Changes rate and depth from `now` on, keeping the tokens earned so far.
    /// `rate_bps == 0` means unlimited.
    fn set_rate(&mut self, rate_bps: u64, burst_bytes: u64, now: u64);
}

/// Tokens are kept in bit·nanoseconds per second (bytes × 8 × 10⁹), so that
/// `rate_bps × elapsed_ns` adds exact integers and the long-run rate has no
/// rounding drift.
const UNITS_PER_BYTE: i128 = 8 * 1_000_000_000;

/// A token bucket of `burst` bytes filled at `rate` bits/s. A packet larger than
/// the bucket may leave once the bucket is full and leaves it in debt, so an
/// undersized burst slows such packets down instead of blocking them forever.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate_bps: u64,
    depth: i128,
    tokens: i128,
    updated: u64,
}

impl TokenBucket {
    /// A full bucket. `rate_bps == 0` means unlimited.
    pub fn new(rate_bps: u64, burst_bytes: u64) -> TokenBucket {
        let depth = i128::from(burst_bytes) * UNITS_PER_BYTE;
        TokenBucket {
            rate_bps,
            depth,
            tokens: depth,
            updated: 0,
        }
    }

    pub fn rate_bps(&self) -> u64 {
        self.rate_bps
    }

    fn tokens_at(&self, t: u64) -> i128 {
        if self.rate_bps == 0 {
            return self.depth;
        }
        let earned =
            i128::from(self.rate_bps).saturating_mul(i128::from(t.saturating_sub(self.updated)));
        self.tokens.saturating_add(earned).min(self.depth)
    }

    fn cost(len: u32) -> i128 {
        i128::from(len) * UNITS_PER_BYTE
    }
}

impl Shaper for TokenBucket {
    fn earliest(&mut self, len: u32, now: u64) -> u64 {
        let now = now.max(self.updated);
        if self.rate_bps == 0 {
            return now;
        }
        let need = Self::cost(len).min(self.depth);
        let missing = need - self.tokens_at(now);
        if missing <= 0 {
            return now;
        }
        // 64-bit division when the shortfall fits (any bucket under ~2 GB): this
        // runs for every packet of a backlogged link, and 128-bit division is slow.
        let wait = match u64::try_from(missing) {
            Ok(m) => m.div_ceil(self.rate_bps),
            Err(_) => {
                let rate = i128::from(self.rate_bps);
                u64::try_from((missing + rate - 1) / rate).unwrap_or(u64::MAX)
            }
        };
        now.saturating_add(wait)
    }

    fn consume(&mut self, len: u32, at: u64) {
        let at = at.max(self.updated);
        self.tokens = self.tokens_at(at) - Self::cost(len);
        self.updated = at;
    }

    fn set_rate(&mut self, rate_bps: u64, burst_bytes: u64, now: u64) {
        let now = now.max(self.updated);
        self.tokens = self.tokens_at(now);
        self.updated = now;
        self.rate_bps = rate_bps;
        self.depth = i128::from(burst_bytes) * UNITS_PER_BYTE;
        self.tokens = self.tokens.min(self.depth);
    }
}

/// Sends `n` back-to-back packets of `len` bytes through `shaper` as early as
/// it allows, all waiting from `start`; returns the departure times.
#[cfg(test)]
pub(crate) fn send_backlog(shaper: &mut impl Shaper, n: usize, len: u32, start: u64) -> Vec<u64> {
    let mut t = start;
    (0..n)
        .map(|_| {
            t = shaper.earliest(len, t);
            shaper.consume(len, t);
            t
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::send_backlog as send;
    use super::*;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn long_run_rate_matches() {
        for rate in [1_000_000u64, 100_000_000, 999_999_937, 40_000_000_000] {
            let mut tb = TokenBucket::new(rate, 1500);
            let times = send(&mut tb, 20_000, 1500, 0);
            // After the initial burst, 19_999 packets took this long.
            let elapsed = times[times.len() - 1] - times[0];
            let achieved = 19_999.0 * 1500.0 * 8.0 * SEC as f64 / elapsed as f64;
            let error = (achieved - rate as f64).abs() / rate as f64;
            assert!(error < 0.01, "{rate}: {achieved}");
        }
    }

    #[test]
    fn burst_is_honoured() {
        let mut tb = TokenBucket::new(8_000_000, 15_000); // 1 byte/µs, 10 packets deep
        let times = send(&mut tb, 12, 1500, 5 * SEC);
        assert!(times[..10].iter().all(|&t| t == 5 * SEC), "{times:?}");
        assert_eq!(times[10], 5 * SEC + 1_500_000);
        assert_eq!(times[11], 5 * SEC + 3_000_000);
        // Idle long enough to refill, and the burst is available again, not more.
        let later = send(&mut tb, 11, 1500, 10 * SEC);
        assert!(later[..10].iter().all(|&t| t == 10 * SEC));
        assert_eq!(later[10], 10 * SEC + 1_500_000);
    }

    #[test]
    fn oversized_packets_go_into_debt() {
        let mut tb = TokenBucket::new(8_000_000, 1000);
        let times = send(&mut tb, 3, 3000, 0);
        // Each waits for a full bucket, then pays its own size back.
        assert_eq!(times, [0, 3_000_000, 6_000_000]);
    }

    #[test]
    fn rate_change_mid_stream() {
        let mut tb = TokenBucket::new(8_000_000, 1000);
        let times = send(&mut tb, 5, 1000, 0);
        assert_eq!(times[4], 4_000_000);
        // Ten times faster from 4 ms on: tokens earned before the change are kept.
        tb.set_rate(80_000_000, 1000, 4_000_000);
        let after = send(&mut tb, 3, 1000, 4_000_000);
        assert_eq!(after, [4_100_000, 4_200_000, 4_300_000]);
        // Half-way to the next token at the slow rate, switch: the half counts.
        let mut tb = TokenBucket::new(8_000_000, 1000);
        send(&mut tb, 1, 1000, 0);
        tb.set_rate(16_000_000, 1000, 500_000);
        assert_eq!(tb.earliest(1000, 500_000), 750_000);
    }

    #[test]
    fn unlimited_and_back() {
        let mut tb = TokenBucket::new(0, 1500);
        assert!(send(&mut tb, 1000, 1500, 7).iter().all(|&t| t == 7));
        tb.set_rate(8_000_000, 1500, 7);
        assert_eq!(send(&mut tb, 2, 1500, 7), [7, 7 + 1_500_000]);
        tb.set_rate(0, 1500, 2_000_000);
        assert_eq!(tb.earliest(1500, 2_000_000), 2_000_000);
    }

    #[test]
    fn huge_values_do_not_overflow() {
        let mut tb = TokenBucket::new(u64::MAX, u64::MAX);
        assert_eq!(tb.earliest(u32::MAX, u64::MAX - 1), u64::MAX - 1);
        tb.consume(u32::MAX, u64::MAX);
        // 1 bit/s: a byte of debt plus a byte to send is 16 s away.
        let mut tb = TokenBucket::new(1, 1);
        tb.consume(2, 0);
        assert_eq!(tb.earliest(1, 0), 16_000_000_000);
        // A debt longer than the clock can express saturates instead of wrapping.
        tb.consume(u32::MAX, 0);
        assert_eq!(tb.earliest(1, 0), u64::MAX);
    }
}
