//! What the pipeline may do to a packet's bytes: set ECN CE and flip a bit.
//!
//! The pipeline is generic over its payload so the actor can queue `Bytes` without
//! copying; only the rare mark or corruption needs write access.

use bytes::{Bytes, BytesMut};
use rand::Rng;
use rand::rngs::SmallRng;

const ECN_MASK: u8 = 0b11;
const ECN_CE: u8 = 0b11;
const IPV4_MIN_HEADER: usize = 20;
const IPV6_HEADER: usize = 40;

/// A queued packet. `Clone` is for duplication; it should be cheap (a reference count).
pub trait Payload: Clone {
    fn bytes(&self) -> &[u8];

    /// Runs `f` on writable bytes (copying first if the buffer is shared).
    fn edit<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> R;

    /// Sets the ECN field to CE. False (and untouched) unless the packet is an
    /// ECN-capable IP packet: marking a Not-ECT packet would be a protocol violation.
    fn mark_ce(&mut self) -> bool {
        if !is_ect(self.bytes()) {
            return false;
        }
        self.edit(set_ce)
    }

    /// Flips one random bit, after the IP header when there is a payload: a damaged
    /// IP header would be discarded by the next agent's parser and turn corruption
    /// into loss, while corruption is meant to reach the endpoint's checksums.
    fn corrupt(&mut self, rng: &mut SmallRng) {
        let data = self.bytes();
        if data.is_empty() {
            return;
        }
        let start = ip_header_len(data).filter(|&h| h < data.len()).unwrap_or(0);
        let byte = rng.random_range(start..data.len());
        let bit = rng.random_range(0..8u8);
        self.edit(|d| d[byte] ^= 1 << bit);
    }
}

impl Payload for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }

    fn edit<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        f(self)
    }
}

impl Payload for BytesMut {
    fn bytes(&self) -> &[u8] {
        self
    }

    fn edit<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        f(self)
    }
}

impl Payload for Bytes {
    fn bytes(&self) -> &[u8] {
        self
    }

    fn edit<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        // Reuses the buffer when this is its only handle, copies otherwise (e.g. a
        // duplicate whose twin is still in flight).
        let mut owned = std::mem::take(self)
            .try_into_mut()
            .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
        let result = f(&mut owned);
        *self = owned.freeze();
        result
    }
}

/// True for an IP packet whose ECN field is ECT(0), ECT(1) or CE.
pub fn is_ect(packet: &[u8]) -> bool {
    ecn_field(packet).is_some_and(|ecn| ecn != 0)
}

/// The two ECN bits of an IPv4 or IPv6 header.
pub fn ecn_field(packet: &[u8]) -> Option<u8> {
    match packet.first()? >> 4 {
        4 if packet.len() >= IPV4_MIN_HEADER => Some(packet[1] & ECN_MASK),
        6 if packet.len() >= IPV6_HEADER => Some((packet[1] >> 4) & ECN_MASK),
        _ => None,
    }
}

/// Sets CE on an ECN-capable packet, keeping the IPv4 header checksum valid.
/// Returns false and leaves the packet alone when it is not ECN-capable IP.
pub fn set_ce(packet: &mut [u8]) -> bool {
    match ecn_field(packet) {
        None | Some(0) => false,
        Some(ECN_CE) => true,
        Some(_) if packet[0] >> 4 == 4 => {
            let old = u16::from_be_bytes([packet[0], packet[1]]);
            packet[1] |= ECN_CE;
            let new = u16::from_be_bytes([packet[0], packet[1]]);
            let sum = u16::from_be_bytes([packet[10], packet[11]]);
            packet[10..12].copy_from_slice(&checksum_adjust(sum, old, new).to_be_bytes());
            true
        }
        Some(_) => {
            packet[1] |= ECN_CE << 4;
            true
        }
    }
}

/// RFC 1624 eqn. 3 incremental update: HC' = ~(~HC + ~m + m'). Incremental rather
/// than recomputed so a header that was already damaged stays detectably damaged.
pub(crate) fn checksum_adjust(sum: u16, old: u16, new: u16) -> u16 {
    let mut acc = u32::from(!sum) + u32::from(!old) + u32::from(new);
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    !(acc as u16)
}

fn ip_header_len(packet: &[u8]) -> Option<usize> {
    match packet.first()? >> 4 {
        4 => Some(usize::from(packet[0] & 0x0f) * 4),
        6 => Some(IPV6_HEADER),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::meta::tests::{ipv4_checksum, tcp6, udp4};
    use rand::SeedableRng;

    #[test]
    fn ce_on_ipv4_keeps_checksum_valid() {
        for tos in [0b01u8, 0b10, (46 << 2) | 0b10, 0xfd] {
            let mut p = udp4(60, tos, 1, 2);
            assert!(p.mark_ce());
            assert_eq!(p[1] & ECN_MASK, ECN_CE);
            assert_eq!(p[1] >> 2, tos >> 2, "DSCP kept");
            assert_eq!(ipv4_checksum(&p[..20]), 0, "tos {tos:#x}");
        }
    }

    #[test]
    fn ce_on_ipv6() {
        let mut p = tcp6((10 << 2) | 0b10, 1, 2);
        assert!(p.mark_ce());
        assert_eq!(ecn_field(&p), Some(ECN_CE));
        assert_eq!(crate::sched::PacketMeta::from_ip(&p).dscp, 10);
    }

    #[test]
    fn not_ect_and_garbage_are_untouched() {
        let original = udp4(60, 46 << 2, 1, 2);
        let mut p = original.clone();
        assert!(!p.mark_ce());
        assert_eq!(p, original);
        let mut junk = vec![0x45u8; 10];
        assert!(!junk.mark_ce());
        let mut empty: Vec<u8> = Vec::new();
        assert!(!empty.mark_ce());
        empty.corrupt(&mut SmallRng::seed_from_u64(1));
    }

    #[test]
    fn bytes_payload_copies_only_when_shared() {
        let mut b = Bytes::from(udp4(60, 0b10, 1, 2));
        let twin = b.clone();
        assert!(b.mark_ce());
        assert_eq!(ecn_field(&b), Some(ECN_CE));
        assert_eq!(
            ecn_field(&twin),
            Some(0b10),
            "the shared twin is not modified"
        );
        let mut m = BytesMut::from(&twin[..]);
        assert!(m.mark_ce());
        assert_eq!(ipv4_checksum(&m[..20]), 0);
    }

    #[test]
    fn corrupt_flips_one_bit_after_the_header() {
        let mut rng = SmallRng::seed_from_u64(7);
        for _ in 0..200 {
            let original = udp4(100, 0, 1, 2);
            let mut p = original.clone();
            p.corrupt(&mut rng);
            let flipped: u32 = original
                .iter()
                .zip(&p)
                .map(|(a, b)| (a ^ b).count_ones())
                .sum();
            assert_eq!(flipped, 1);
            assert_eq!(p[..20], original[..20], "IP header intact");
        }
    }
}
