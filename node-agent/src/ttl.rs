//! `spec.dataplane.ttl: decrement`: every emulated node forwards like a router.
//!
//! A transit node decrements the IPv4 TTL (updating the header checksum) or the
//! IPv6 hop limit of each packet it forwards. A packet that arrives with 1 or 0
//! left is not forwarded; for IPv4 the node answers with an ICMP Time Exceeded
//! from its own overlay address, as RFC 1812 asks of a router, so `traceroute`
//! and `mtr` list the emulated nodes with their delays. The overlay has no IPv6
//! addresses, so an expired IPv6 packet is only dropped (and counted).
//!
//! The packet's first node does not decrement: it stands for the sending host,
//! whose kernel already set the TTL, and the last one delivers to its kernel.
//! Pure functions over packet bytes; the processor decides when they apply.

use smoltcp::wire::{Icmpv4Message, Icmpv4Packet, Icmpv4TimeExceeded, IpProtocol, Ipv4Packet};
use std::net::Ipv4Addr;

/// TTL of the ICMP messages a node originates (Linux's default).
const ICMP_TTL: u8 = 64;
/// Most of the expired packet an ICMP error quotes: RFC 1812 4.3.2.3 allows as much
/// as keeps the whole error within 576 bytes.
const MAX_QUOTE: usize = 576 - 20 - 8;
const IPV4_HEADER: usize = 20;
const ICMP_HEADER: usize = 8;

/// What forwarding may do with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// TTL or hop limit decremented in place; send it on.
    Forward,
    /// It may not cross another link: drop it (and answer, if [`time_exceeded`] says so).
    Expired,
    /// Not an IP packet this module can read; the caller counts it as malformed.
    Unreadable,
}

/// Decrements the TTL (IPv4, checksum updated incrementally) or hop limit (IPv6).
pub fn decrement(packet: &mut [u8]) -> Verdict {
    match packet.first().map(|b| b >> 4) {
        Some(4) if packet.len() >= IPV4_HEADER => {
            let ttl = packet[8];
            if ttl <= 1 {
                return Verdict::Expired;
            }
            // TTL is the high byte of the header's 5th 16-bit word (RFC 1624).
            let old = u16::from_be_bytes([packet[8], packet[9]]);
            packet[8] = ttl - 1;
            let new = u16::from_be_bytes([packet[8], packet[9]]);
            let sum = u16::from_be_bytes([packet[10], packet[11]]);
            let sum = crate::sched::checksum_adjust(sum, old, new);
            packet[10..12].copy_from_slice(&sum.to_be_bytes());
            Verdict::Forward
        }
        Some(6) if packet.len() >= 40 => {
            if packet[7] <= 1 {
                return Verdict::Expired;
            }
            packet[7] -= 1;
            Verdict::Forward
        }
        _ => Verdict::Unreadable,
    }
}

/// The ICMP Time Exceeded (TTL exceeded in transit) that node `from` sends back
/// for the IPv4 packet `expired`, or `None` when none may be sent: the packet is
/// not IPv4, is itself an ICMP error, is a fragment other than the first, or
/// comes from an address no reply can go to (RFC 1812 4.3.2.7).
pub fn time_exceeded(from: Ipv4Addr, expired: &[u8]) -> Option<Vec<u8>> {
    let original = Ipv4Packet::new_checked(expired).ok()?;
    if original.version() != 4 || original.frag_offset() != 0 {
        return None;
    }
    let to = original.src_addr();
    if to.is_unspecified() || to.is_broadcast() || to.is_multicast() || to.is_loopback() {
        return None;
    }
    if original.next_header() == IpProtocol::Icmp && is_icmp_error(original.payload()) {
        return None;
    }
    let quote = &expired[..expired.len().min(MAX_QUOTE)];
    let total = IPV4_HEADER + ICMP_HEADER + quote.len();
    let mut out = vec![0u8; total];

    let mut ip = Ipv4Packet::new_unchecked(&mut out[..]);
    ip.set_version(4);
    ip.set_header_len(IPV4_HEADER as u8);
    ip.set_total_len(total as u16);
    ip.set_hop_limit(ICMP_TTL);
    ip.set_next_header(IpProtocol::Icmp);
    ip.set_src_addr(from);
    ip.set_dst_addr(to);
    ip.fill_checksum();

    let mut icmp = Icmpv4Packet::new_unchecked(&mut out[IPV4_HEADER..]);
    icmp.set_msg_type(Icmpv4Message::TimeExceeded);
    icmp.set_msg_code(Icmpv4TimeExceeded::TtlExpired.into());
    icmp.data_mut().copy_from_slice(quote);
    icmp.fill_checksum();
    Some(out)
}

/// Whether an ICMP message is an error (never answered with another error).
fn is_icmp_error(icmp: &[u8]) -> bool {
    !matches!(icmp.first(), Some(0 | 8 | 13 | 14 | 15 | 16 | 17 | 18))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4/UDP probe as traceroute sends it, with a valid header checksum.
    fn probe(ttl: u8) -> Vec<u8> {
        let mut p = vec![0u8; 60];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&60u16.to_be_bytes());
        p[8] = ttl;
        p[9] = 17;
        p[12..16].copy_from_slice(&[198, 18, 0, 1]);
        p[16..20].copy_from_slice(&[198, 18, 0, 7]);
        p[20..22].copy_from_slice(&40_000u16.to_be_bytes());
        p[22..24].copy_from_slice(&33_434u16.to_be_bytes());
        let mut ip = Ipv4Packet::new_unchecked(&mut p[..]);
        ip.fill_checksum();
        p
    }

    #[test]
    fn decrement_keeps_the_header_checksum_valid() {
        for ttl in [2u8, 64, 255] {
            let mut p = probe(ttl);
            assert_eq!(decrement(&mut p), Verdict::Forward);
            let ip = Ipv4Packet::new_checked(&p[..]).expect("packet");
            assert_eq!(ip.hop_limit(), ttl - 1);
            assert!(ip.verify_checksum(), "ttl {ttl}");
        }
    }

    #[test]
    fn the_last_ttl_expires_and_nothing_changes() {
        for ttl in [0u8, 1] {
            let mut p = probe(ttl);
            let before = p.clone();
            assert_eq!(decrement(&mut p), Verdict::Expired);
            assert_eq!(p, before);
        }
        let mut v6 = vec![0u8; 48];
        v6[0] = 0x60;
        v6[7] = 1;
        assert_eq!(decrement(&mut v6), Verdict::Expired);
        v6[7] = 9;
        assert_eq!(decrement(&mut v6), Verdict::Forward);
        assert_eq!(v6[7], 8);
        assert_eq!(decrement(&mut [0x45, 0, 0]), Verdict::Unreadable);
    }

    #[test]
    fn time_exceeded_comes_from_the_node_and_quotes_the_probe() {
        let expired = probe(1);
        let from = Ipv4Addr::new(198, 18, 0, 3);
        let reply = time_exceeded(from, &expired).expect("a reply");
        let ip = Ipv4Packet::new_checked(&reply[..]).expect("IPv4");
        assert!(ip.verify_checksum());
        assert_eq!(ip.src_addr(), from);
        assert_eq!(ip.dst_addr(), Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(ip.next_header(), IpProtocol::Icmp);
        let icmp = Icmpv4Packet::new_checked(ip.payload()).expect("ICMP");
        assert!(icmp.verify_checksum());
        assert_eq!(icmp.msg_type(), Icmpv4Message::TimeExceeded);
        assert_eq!(icmp.msg_code(), 0);
        // traceroute matches the reply to its probe by the quoted header and ports.
        assert_eq!(icmp.data(), &expired[..]);
    }

    #[test]
    fn no_error_about_an_error_a_fragment_or_a_broadcast() {
        let from = Ipv4Addr::new(198, 18, 0, 3);
        let error = time_exceeded(from, &probe(1)).expect("a reply");
        let mut expired_error = error.clone();
        expired_error[8] = 1;
        assert_eq!(time_exceeded(from, &expired_error), None);

        let mut fragment = probe(1);
        fragment[7] = 10; // fragment offset 10 × 8 bytes
        assert_eq!(time_exceeded(from, &fragment), None);

        let mut broadcast = probe(1);
        broadcast[12..16].copy_from_slice(&[255; 4]);
        assert_eq!(time_exceeded(from, &broadcast), None);
    }

    #[test]
    fn a_long_packet_is_quoted_up_to_576_bytes_in_all() {
        let mut big = probe(1);
        big.resize(1400, 7);
        big[2..4].copy_from_slice(&1400u16.to_be_bytes());
        let reply = time_exceeded(Ipv4Addr::new(198, 18, 0, 3), &big).expect("a reply");
        assert_eq!(reply.len(), 576);
    }
}
