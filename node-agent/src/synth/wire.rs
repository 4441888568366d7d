//! The few packet fields the synthetic stack looks at outside smoltcp: to
//! accept connections on demand, to mark and label what it sends, and to count
//! retransmissions. Bounds-checked; anything that is not IPv4 TCP/UDP is `None`.

use crate::flow::{PROTO_TCP, PROTO_UDP};
use std::net::Ipv4Addr;

const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;

/// The transport fields of an IPv4 TCP or UDP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub protocol: u8,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub src_port: u16,
    pub dst_port: u16,
    /// TCP only (0 for UDP).
    pub seq: u32,
    pub flags: u8,
    /// Transport payload bytes.
    pub payload_len: usize,
}

impl Segment {
    pub fn parse(packet: &[u8]) -> Option<Segment> {
        let version_ihl = *packet.first()?;
        if version_ihl >> 4 != 4 {
            return None;
        }
        let ihl = usize::from(version_ihl & 0x0f) * 4;
        let total = usize::from(u16::from_be_bytes([*packet.get(2)?, *packet.get(3)?]));
        let fragment = u16::from_be_bytes([*packet.get(6)?, *packet.get(7)?]) & 0x1fff;
        if ihl < 20 || total < ihl || total > packet.len() || fragment != 0 {
            return None;
        }
        let protocol = packet[9];
        let src = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
        let dst = Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]);
        let l4 = &packet[ihl..total];
        let port = |at: usize| Some(u16::from_be_bytes([*l4.get(at)?, *l4.get(at + 1)?]));
        let (src_port, dst_port) = (port(0)?, port(2)?);
        match protocol {
            PROTO_TCP => {
                let seq = u32::from_be_bytes(l4.get(4..8)?.try_into().ok()?);
                let offset = usize::from(*l4.get(12)? >> 4) * 4;
                let flags = *l4.get(13)?;
                if offset < 20 || offset > l4.len() {
                    return None;
                }
                Some(Segment {
                    protocol,
                    src,
                    dst,
                    src_port,
                    dst_port,
                    seq,
                    flags,
                    payload_len: l4.len() - offset,
                })
            }
            PROTO_UDP if l4.len() >= 8 => Some(Segment {
                protocol,
                src,
                dst,
                src_port,
                dst_port,
                seq: 0,
                flags: 0,
                payload_len: l4.len() - 8,
            }),
            _ => None,
        }
    }

    /// A TCP connection request: SYN without ACK.
    pub fn is_syn(&self) -> bool {
        self.protocol == PROTO_TCP && self.flags & (TCP_SYN | TCP_ACK) == TCP_SYN
    }
}

/// Sets the DSCP of an IPv4 packet and fixes its header checksum.
pub fn set_dscp(packet: &mut [u8], dscp: u8) {
    let Some(&version_ihl) = packet.first() else {
        return;
    };
    let ihl = usize::from(version_ihl & 0x0f) * 4;
    if version_ihl >> 4 != 4 || ihl < 20 || packet.len() < ihl {
        return;
    }
    packet[1] = (dscp << 2) | (packet[1] & 0x03);
    packet[10] = 0;
    packet[11] = 0;
    let mut sum = 0u32;
    for pair in packet[..ihl].chunks(2) {
        sum += u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let checksum = !(sum as u16);
    packet[10..12].copy_from_slice(&checksum.to_be_bytes());
}

/// Counts data segments sent again: a segment that starts below the highest
/// sequence number sent so far repeats bytes already sent once.
#[derive(Debug, Default, Clone, Copy)]
pub struct RetransmitCounter {
    highest_end: Option<u32>,
    pub retransmissions: u64,
}

impl RetransmitCounter {
    pub fn observe(&mut self, seq: u32, payload_len: usize) {
        if payload_len == 0 {
            return;
        }
        let end = seq.wrapping_add(payload_len as u32);
        match self.highest_end {
            None => self.highest_end = Some(end),
            Some(high) => {
                // Sequence arithmetic modulo 2^32, as TCP compares.
                if (seq.wrapping_sub(high) as i32) < 0 {
                    self.retransmissions += 1;
                }
                if (end.wrapping_sub(high) as i32) > 0 {
                    self.highest_end = Some(end);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(flags: u8, seq: u32, payload: usize) -> Vec<u8> {
        let total = 40 + payload;
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[8] = 64;
        p[9] = PROTO_TCP;
        p[12..16].copy_from_slice(&[198, 18, 0, 1]);
        p[16..20].copy_from_slice(&[198, 18, 0, 3]);
        p[20..22].copy_from_slice(&61001u16.to_be_bytes());
        p[22..24].copy_from_slice(&61000u16.to_be_bytes());
        p[24..28].copy_from_slice(&seq.to_be_bytes());
        p[32] = 5 << 4;
        p[33] = flags;
        p
    }

    #[test]
    fn parses_what_it_needs_and_refuses_the_rest() {
        let s = Segment::parse(&tcp(0x02, 7, 0)).expect("tcp");
        assert!(s.is_syn());
        assert_eq!((s.src_port, s.dst_port, s.seq), (61001, 61000, 7));
        assert!(!Segment::parse(&tcp(0x12, 7, 0)).expect("tcp").is_syn());
        assert_eq!(
            Segment::parse(&tcp(0x10, 1, 100)).map(|s| s.payload_len),
            Some(100)
        );
        assert!(Segment::parse(&[0x45, 0, 0]).is_none());
        assert!(Segment::parse(&tcp(0x02, 7, 0)[..30]).is_none());
    }

    #[test]
    fn dscp_rewrite_keeps_the_header_checksum_valid() {
        let mut p = tcp(0x10, 1, 10);
        set_dscp(&mut p, 46);
        assert_eq!(p[1] >> 2, 46);
        let mut sum = 0u32;
        for pair in p[..20].chunks(2) {
            sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff, "a valid header sums to all ones");
    }

    #[test]
    fn retransmissions_are_segments_below_the_highest_sent() {
        let mut c = RetransmitCounter::default();
        c.observe(u32::MAX - 99, 100);
        c.observe(0, 100); // wraps around: new data
        c.observe(100, 0); // a pure ACK is no data
        assert_eq!(c.retransmissions, 0);
        c.observe(0, 100);
        c.observe(u32::MAX - 99, 100);
        assert_eq!(c.retransmissions, 2);
        c.observe(100, 100);
        assert_eq!(c.retransmissions, 2);
    }
}
