//! Keepalive probes of a link's connection: what they carry and when the next
//! one goes.
//!
//! Only the dialing end probes; the accepting end echoes and takes the round
//! trip the dialer measured from the probe itself. Both ends probing woke each
//! end four times per interval instead of two, and at thousands of idle agents
//! on a machine (a k=32 fat-tree's switches have 32 links each) those wake-ups
//! were most of the agents' CPU. An idle agent's probes go on a grid shared by
//! all its links, so a switch wakes once per interval for all of them, not once
//! per link.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How often a link that carries traffic measures its connection's round trip.
pub const BUSY_EVERY: Duration = Duration::from_secs(1);
/// How often an idle link does.
pub const IDLE_EVERY: Duration = Duration::from_secs(10);

/// What a probe carries: the prober's clock when it was sent, which the echo
/// returns, and the last round trip the prober measured (zero before the
/// first), which the accepting end reports as its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    pub sent_at_ns: u64,
    pub rtt_us: u64,
}

impl Probe {
    pub fn encode(&self) -> bytes::Bytes {
        let mut out = Vec::with_capacity(16);
        out.extend_from_slice(&self.sent_at_ns.to_be_bytes());
        out.extend_from_slice(&self.rtt_us.to_be_bytes());
        out.into()
    }

    /// A probe or its echo from the peer. An 8-byte payload (an agent from
    /// before the round trip was carried) reads as a probe without one.
    pub fn decode(payload: &[u8]) -> Option<Probe> {
        let word = |at: usize| -> Option<u64> {
            Some(u64::from_be_bytes(
                payload.get(at..at + 8)?.try_into().ok()?,
            ))
        };
        Some(Probe {
            sent_at_ns: word(0)?,
            rtt_us: word(8).unwrap_or(0),
        })
    }
}

/// When the dialer probes next, `now` being when it sent one. A busy link
/// probes every [`BUSY_EVERY`] from now. So does a link whose first round trip
/// is not known yet, so that the accepting end learns it within a second.
/// An idle link's next probe is the next point of a grid spaced by
/// [`IDLE_EVERY`] from `grid`, at least half an interval away: every idle link
/// of the agent lands on the same points.
pub fn next_at(now: Instant, busy: bool, rtt_known: bool, grid: Instant) -> Instant {
    if busy || !rtt_known {
        return now + BUSY_EVERY;
    }
    let every = IDLE_EVERY.as_nanos();
    let earliest = now + IDLE_EVERY / 2;
    let since = earliest.saturating_duration_since(grid).as_nanos();
    let steps = since.div_ceil(every);
    let offset = steps.saturating_mul(every);
    grid + Duration::from_nanos(u64::try_from(offset).unwrap_or(u64::MAX))
}

/// The agent's probe grid: the first time any link asked, the same for every
/// link of this process.
pub fn agent_grid() -> Instant {
    static GRID: OnceLock<Instant> = OnceLock::new();
    *GRID.get_or_init(Instant::now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_carries_its_clock_and_the_round_trip_and_reads_back() {
        let p = Probe {
            sent_at_ns: 123_456_789,
            rtt_us: 870,
        };
        assert_eq!(Probe::decode(&p.encode()), Some(p));
        // An older agent's probe: the clock alone.
        assert_eq!(
            Probe::decode(&42u64.to_be_bytes()),
            Some(Probe {
                sent_at_ns: 42,
                rtt_us: 0
            })
        );
        assert_eq!(Probe::decode(&[1, 2, 3]), None);
    }

    #[test]
    fn busy_links_and_unmeasured_ones_probe_within_a_second() {
        let grid = Instant::now();
        let now = grid + Duration::from_millis(2_345);
        assert_eq!(next_at(now, true, true, grid), now + BUSY_EVERY);
        assert_eq!(next_at(now, false, false, grid), now + BUSY_EVERY);
    }

    /// Links that went idle at different moments probe at the same instants,
    /// so the agent wakes once for all of them.
    #[test]
    fn idle_links_share_the_agents_grid() {
        let grid = Instant::now();
        let a = next_at(grid + Duration::from_millis(1_200), false, true, grid);
        let b = next_at(grid + Duration::from_millis(4_900), false, true, grid);
        assert_eq!(a, grid + IDLE_EVERY);
        assert_eq!(a, b);
        // Never sooner than half an interval: one just before a grid point
        // waits for the one after.
        let c = next_at(grid + Duration::from_millis(9_000), false, true, grid);
        assert_eq!(c, grid + 2 * IDLE_EVERY);
        for ms in (0..40_000).step_by(777) {
            let now = grid + Duration::from_millis(ms);
            let next = next_at(now, false, true, grid);
            let wait = next - now;
            assert!(
                wait >= IDLE_EVERY / 2 && wait <= IDLE_EVERY * 3 / 2,
                "{wait:?}"
            );
            assert_eq!((next - grid).as_nanos() % IDLE_EVERY.as_nanos(), 0);
        }
    }
}
