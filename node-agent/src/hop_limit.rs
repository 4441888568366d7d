//! The one loop guard of the dataplane, shared by packet forwarding and max-mode
//! relays.
//!
//! A packet or relayed connection carries how many links it has crossed. The hub
//! sizes the limit from the topology (see `operator::hub::snapshot`): a path that
//! visits no node twice crosses at most `nodes − 1` links, so a limit of at least
//! the node count never cuts a planned path, however long, while a packet caught in
//! a real forwarding loop still dies after one trip around the topology at most.

/// How many links a packet may cross before a node drops it as looping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopLimit(u16);

impl HopLimit {
    /// What a route table without a limit means (a hub older than the field):
    /// the guard this dataplane had before the hub sized it.
    pub const DEFAULT: HopLimit = HopLimit(64);

    /// The limit a route table carries; 0 is proto3's "unset".
    pub fn from_proto(limit: u32) -> HopLimit {
        match limit {
            0 => HopLimit::DEFAULT,
            n => HopLimit(u16::try_from(n).unwrap_or(u16::MAX)),
        }
    }

    pub fn get(self) -> u16 {
        self.0
    }

    /// The hop count to send a packet on with, having crossed `hops` links so
    /// far; `None` when it may not cross another one (a routing loop).
    pub fn next(self, hops: u16) -> Option<u16> {
        // Not `then_some`: its argument is evaluated even at u16::MAX.
        if hops < self.0 { Some(hops + 1) } else { None }
    }
}

impl Default for HopLimit {
    fn default() -> Self {
        HopLimit::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packet_crosses_exactly_limit_links() {
        let limit = HopLimit::from_proto(300);
        let mut hops = 0u16;
        let mut crossed = 0;
        while let Some(next) = limit.next(hops) {
            hops = next;
            crossed += 1;
        }
        assert_eq!(crossed, 300);
        assert_eq!(limit.next(u16::MAX), None, "a forged count cannot wrap");
    }

    #[test]
    fn unset_and_oversized_limits() {
        assert_eq!(HopLimit::from_proto(0), HopLimit::DEFAULT);
        assert_eq!(HopLimit::from_proto(1 << 20).get(), u16::MAX);
        assert_eq!(
            HopLimit::from_proto(u32::from(u16::MAX)).next(u16::MAX - 1),
            Some(u16::MAX)
        );
    }
}
