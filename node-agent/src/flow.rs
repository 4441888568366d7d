//! Flow keys: the 5-tuple that decides which route, next hop and processor a packet
//! gets, so all packets of one transport connection take the same path in order.
//!
//! Packets come from the TUN device or from a peer, so parsing is defensive: every
//! read is bounds-checked, the IPv6 extension-header walk is bounded, and malformed
//! input is an error, never a panic.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use thiserror::Error;

pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_ICMPV6: u8 = 58;
pub const PROTO_SCTP: u8 = 132;

const IPV6_HOP_BY_HOP: u8 = 0;
const IPV6_ROUTING: u8 = 43;
const IPV6_FRAGMENT: u8 = 44;
const IPV6_AH: u8 = 51;
const IPV6_DEST_OPTS: u8 = 60;
const IPV6_HEADER_LEN: usize = 40;
/// Real packets carry a handful of extension headers at most; the bound stops a
/// crafted chain from costing more than a few bounds checks.
const MAX_IPV6_EXT_HEADERS: usize = 8;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum FlowError {
    #[error("packet too short: {len} bytes, need at least {need}")]
    TooShort { len: usize, need: usize },
    #[error("not an IP packet: version {0}")]
    BadVersion(u8),
    #[error("bad IPv4 header length {0} bytes")]
    BadHeaderLength(usize),
    #[error("IP length field {0} is smaller than the header")]
    BadTotalLength(usize),
    #[error("{protocol} header truncated")]
    TruncatedTransport { protocol: u8 },
    #[error("truncated IPv6 extension header {0}")]
    TruncatedExtension(u8),
    #[error("more than {MAX_IPV6_EXT_HEADERS} IPv6 extension headers")]
    TooManyExtensions,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub protocol: u8,
    /// For ICMP/ICMPv6 echo: the echo identifier. 0 when the protocol has no ports
    /// or the packet is a non-first fragment.
    pub src_port: u16,
    pub dst_port: u16,
}

impl FlowKey {
    /// Reads the flow key of an IPv4 or IPv6 packet (no link-layer header).
    pub fn parse(packet: &[u8]) -> Result<FlowKey, FlowError> {
        let first = *packet
            .first()
            .ok_or(FlowError::TooShort { len: 0, need: 1 })?;
        match first >> 4 {
            4 => parse_v4(packet),
            6 => parse_v6(packet),
            v => Err(FlowError::BadVersion(v)),
        }
    }

    /// A 64-bit hash of the key that is the same in every process, run and platform,
    /// so multipath choices agree across agents and restarts (std's `RandomState`
    /// is seeded per process). FNV-1a over the fields, then a finaliser, because FNV's
    /// low bits alone spread poorly and callers reduce the hash to a few buckets.
    pub fn stable_hash(&self) -> u64 {
        let mut h = Fnv1a::new();
        for addr in [self.src, self.dst] {
            match addr {
                // Tagged so an IPv4 address and an IPv6 one with the same leading
                // bytes never feed the same stream.
                IpAddr::V4(a) => {
                    h.write(&[4]);
                    h.write(&a.octets());
                }
                IpAddr::V6(a) => {
                    h.write(&[6]);
                    h.write(&a.octets());
                }
            }
        }
        h.write(&[self.protocol]);
        h.write(&self.src_port.to_be_bytes());
        h.write(&self.dst_port.to_be_bytes());
        fmix64(h.finish())
    }
}

/// Destination of an IPv4 packet without parsing the rest: the hot path for plain
/// destination routing. `None` for anything that is not a full-length IPv4 header.
pub fn dst_v4(packet: &[u8]) -> Option<Ipv4Addr> {
    if packet.first()? >> 4 != 4 {
        return None;
    }
    let dst: [u8; 4] = packet.get(16..20)?.try_into().ok()?;
    Some(Ipv4Addr::from(dst))
}

fn parse_v4(packet: &[u8]) -> Result<FlowKey, FlowError> {
    let header: &[u8; 20] = packet.first_chunk().ok_or(FlowError::TooShort {
        len: packet.len(),
        need: 20,
    })?;
    let ihl = usize::from(header[0] & 0x0f) * 4;
    if ihl < 20 {
        return Err(FlowError::BadHeaderLength(ihl));
    }
    if packet.len() < ihl {
        return Err(FlowError::TooShort {
            len: packet.len(),
            need: ihl,
        });
    }
    let total = usize::from(u16::from_be_bytes([header[2], header[3]]));
    if total < ihl {
        return Err(FlowError::BadTotalLength(total));
    }
    // Trailing padding after the IP datagram is not transport data.
    let datagram = &packet[..total.min(packet.len())];
    let protocol = header[9];
    let fragment_offset = u16::from_be_bytes([header[6], header[7]]) & 0x1fff;
    let src = Ipv4Addr::new(header[12], header[13], header[14], header[15]);
    let dst = Ipv4Addr::new(header[16], header[17], header[18], header[19]);
    let (src_port, dst_port) = if fragment_offset == 0 {
        ports(protocol, &datagram[ihl..])?
    } else {
        // Later fragments carry no transport header.
        (0, 0)
    };
    Ok(FlowKey {
        src: src.into(),
        dst: dst.into(),
        protocol,
        src_port,
        dst_port,
    })
}

fn parse_v6(packet: &[u8]) -> Result<FlowKey, FlowError> {
    let header: &[u8; IPV6_HEADER_LEN] = packet.first_chunk().ok_or(FlowError::TooShort {
        len: packet.len(),
        need: IPV6_HEADER_LEN,
    })?;
    let src = ipv6_at(header, 8);
    let dst = ipv6_at(header, 24);
    let payload_len = usize::from(u16::from_be_bytes([header[4], header[5]]));
    // Payload length 0 is a jumbogram (or a sloppy writer): trust the buffer then.
    let end = if payload_len == 0 {
        packet.len()
    } else {
        (IPV6_HEADER_LEN + payload_len).min(packet.len())
    };
    let mut rest = &packet[IPV6_HEADER_LEN..end];
    let mut next = header[6];
    for _ in 0..=MAX_IPV6_EXT_HEADERS {
        let ext_len = match next {
            IPV6_HOP_BY_HOP | IPV6_ROUTING | IPV6_DEST_OPTS => {
                let len = rest.get(1).ok_or(FlowError::TruncatedExtension(next))?;
                (usize::from(*len) + 1) * 8
            }
            IPV6_AH => {
                let len = rest.get(1).ok_or(FlowError::TruncatedExtension(next))?;
                (usize::from(*len) + 2) * 4
            }
            IPV6_FRAGMENT => {
                let frag: &[u8; 8] = rest
                    .first_chunk()
                    .ok_or(FlowError::TruncatedExtension(next))?;
                let offset = u16::from_be_bytes([frag[2], frag[3]]) >> 3;
                if offset != 0 {
                    return Ok(FlowKey {
                        src: src.into(),
                        dst: dst.into(),
                        protocol: frag[0],
                        src_port: 0,
                        dst_port: 0,
                    });
                }
                8
            }
            protocol => {
                let (src_port, dst_port) = ports(protocol, rest)?;
                return Ok(FlowKey {
                    src: src.into(),
                    dst: dst.into(),
                    protocol,
                    src_port,
                    dst_port,
                });
            }
        };
        let after = rest
            .get(ext_len..)
            .ok_or(FlowError::TruncatedExtension(next))?;
        next = rest[0];
        rest = after;
    }
    Err(FlowError::TooManyExtensions)
}

fn ipv6_at(header: &[u8; IPV6_HEADER_LEN], at: usize) -> Ipv6Addr {
    let mut octets = [0u8; 16];
    octets.copy_from_slice(&header[at..at + 16]);
    Ipv6Addr::from(octets)
}

/// Ports (or the echo identifier) from the start of the transport header.
fn ports(protocol: u8, transport: &[u8]) -> Result<(u16, u16), FlowError> {
    let truncated = FlowError::TruncatedTransport { protocol };
    match protocol {
        PROTO_TCP | PROTO_UDP | PROTO_SCTP => {
            let p: &[u8; 4] = transport.first_chunk().ok_or(truncated)?;
            Ok((
                u16::from_be_bytes([p[0], p[1]]),
                u16::from_be_bytes([p[2], p[3]]),
            ))
        }
        PROTO_ICMP | PROTO_ICMPV6 => {
            let msg_type = *transport.first().ok_or(truncated)?;
            let is_echo = match protocol {
                PROTO_ICMP => matches!(msg_type, 0 | 8),
                _ => matches!(msg_type, 128 | 129),
            };
            if !is_echo {
                return Ok((0, 0));
            }
            let id = transport
                .get(4..6)
                .ok_or(FlowError::TruncatedTransport { protocol })?;
            Ok((u16::from_be_bytes([id[0], id[1]]), 0))
        }
        _ => Ok((0, 0)),
    }
}

/// FNV-1a, 64-bit: tiny, seedless, and the same everywhere.
pub(crate) struct Fnv1a(u64);

impl Fnv1a {
    pub(crate) fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    pub(crate) fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    pub(crate) fn finish(&self) -> u64 {
        self.0
    }
}

/// MurmurHash3's 64-bit finaliser: every input bit affects every output bit.
pub(crate) fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    const A4: [u8; 4] = [198, 18, 0, 1];
    const B4: [u8; 4] = [198, 18, 0, 2];
    const A6: &str = "2001:db8::1";
    const B6: &str = "2001:db8::2";

    /// An IPv4 packet with `options` bytes of IP options and the given transport bytes.
    fn v4(protocol: u8, options: usize, frag: u16, transport: &[u8]) -> Vec<u8> {
        let ihl = 20 + options;
        let total = ihl + transport.len();
        let mut p = vec![0u8; ihl];
        p[0] = 0x40 | (ihl / 4) as u8;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[6..8].copy_from_slice(&frag.to_be_bytes());
        p[8] = 64;
        p[9] = protocol;
        p[12..16].copy_from_slice(&A4);
        p[16..20].copy_from_slice(&B4);
        for b in &mut p[20..] {
            *b = 0x01; // NOP options
        }
        p.extend_from_slice(transport);
        p
    }

    /// An IPv6 packet: `exts` are (header type, body) pairs chained before `transport`.
    fn v6(exts: &[(u8, Vec<u8>)], protocol: u8, transport: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; 40];
        p[0] = 0x60;
        p[6] = exts.first().map_or(protocol, |e| e.0);
        p[7] = 64;
        p[8..24].copy_from_slice(&A6.parse::<Ipv6Addr>().expect("addr").octets());
        p[24..40].copy_from_slice(&B6.parse::<Ipv6Addr>().expect("addr").octets());
        for (i, (_, body)) in exts.iter().enumerate() {
            let next = exts.get(i + 1).map_or(protocol, |e| e.0);
            let mut h = body.clone();
            h[0] = next;
            p.extend_from_slice(&h);
        }
        p.extend_from_slice(transport);
        let payload_len = (p.len() - 40) as u16;
        p[4..6].copy_from_slice(&payload_len.to_be_bytes());
        p
    }

    /// An extension header of `units` 8-byte units (hop-by-hop, routing, dest opts).
    fn opts(kind: u8, units: u8) -> (u8, Vec<u8>) {
        let mut body = vec![0u8; (usize::from(units) + 1) * 8];
        body[1] = units;
        (kind, body)
    }

    fn frag6(offset: u16, more: bool) -> (u8, Vec<u8>) {
        let mut body = vec![0u8; 8];
        body[2..4].copy_from_slice(&((offset << 3) | u16::from(more)).to_be_bytes());
        (IPV6_FRAGMENT, body)
    }

    fn tcp(src: u16, dst: u16) -> Vec<u8> {
        let mut t = vec![0u8; 20];
        t[0..2].copy_from_slice(&src.to_be_bytes());
        t[2..4].copy_from_slice(&dst.to_be_bytes());
        t[12] = 0x50;
        t
    }

    fn udp(src: u16, dst: u16) -> Vec<u8> {
        let mut t = vec![0u8; 8];
        t[0..2].copy_from_slice(&src.to_be_bytes());
        t[2..4].copy_from_slice(&dst.to_be_bytes());
        t
    }

    fn echo(msg_type: u8, id: u16) -> Vec<u8> {
        let mut t = vec![0u8; 8];
        t[0] = msg_type;
        t[4..6].copy_from_slice(&id.to_be_bytes());
        t[6..8].copy_from_slice(&7u16.to_be_bytes()); // sequence: must not matter
        t
    }

    fn key4(protocol: u8, src_port: u16, dst_port: u16) -> FlowKey {
        FlowKey {
            src: Ipv4Addr::from(A4).into(),
            dst: Ipv4Addr::from(B4).into(),
            protocol,
            src_port,
            dst_port,
        }
    }

    fn key6(protocol: u8, src_port: u16, dst_port: u16) -> FlowKey {
        let addr = |s: &str| IpAddr::V6(s.parse().expect("addr"));
        FlowKey {
            src: addr(A6),
            dst: addr(B6),
            protocol,
            src_port,
            dst_port,
        }
    }

    #[test]
    fn ipv4_tcp() {
        let p = v4(PROTO_TCP, 0, 0, &tcp(40_000, 80));
        assert_eq!(FlowKey::parse(&p), Ok(key4(PROTO_TCP, 40_000, 80)));
    }

    #[test]
    fn ipv4_udp_with_options_honours_ihl() {
        let p = v4(PROTO_UDP, 8, 0, &udp(5353, 53));
        assert_eq!(FlowKey::parse(&p), Ok(key4(PROTO_UDP, 5353, 53)));
    }

    #[test]
    fn ipv4_sctp() {
        let p = v4(PROTO_SCTP, 0, 0, &udp(1000, 2000)[..4]);
        assert_eq!(FlowKey::parse(&p), Ok(key4(PROTO_SCTP, 1000, 2000)));
    }

    #[test]
    fn ipv4_icmp_echo_uses_identifier() {
        for msg_type in [8, 0] {
            let p = v4(PROTO_ICMP, 0, 0, &echo(msg_type, 0x1234));
            assert_eq!(FlowKey::parse(&p), Ok(key4(PROTO_ICMP, 0x1234, 0)));
        }
    }

    #[test]
    fn ipv4_icmp_other_types_have_no_ports() {
        // Destination unreachable quotes another packet; its bytes are not ports.
        let p = v4(PROTO_ICMP, 0, 0, &echo(3, 0x1234));
        assert_eq!(FlowKey::parse(&p), Ok(key4(PROTO_ICMP, 0, 0)));
    }

    #[test]
    fn ipv4_first_fragment_has_ports_later_ones_do_not() {
        let more_fragments = 0x2000;
        let first = v4(PROTO_UDP, 0, more_fragments, &udp(1, 2));
        assert_eq!(FlowKey::parse(&first), Ok(key4(PROTO_UDP, 1, 2)));
        let later = v4(PROTO_UDP, 0, 185, &[0xaa; 8]);
        assert_eq!(FlowKey::parse(&later), Ok(key4(PROTO_UDP, 0, 0)));
        // Offset set but no transport bytes at all: still fine.
        let empty_later = v4(PROTO_TCP, 0, 1, &[]);
        assert_eq!(FlowKey::parse(&empty_later), Ok(key4(PROTO_TCP, 0, 0)));
    }

    #[test]
    fn ipv4_other_protocols_have_no_ports() {
        let p = v4(47, 0, 0, &[1, 2, 3, 4, 5, 6, 7, 8]); // GRE
        assert_eq!(FlowKey::parse(&p), Ok(key4(47, 0, 0)));
    }

    #[test]
    fn ipv4_ignores_trailing_padding() {
        // A UDP header cut to 2 bytes by the total length, then padding that looks like
        // the rest of a header: the padding must not be read as ports.
        let mut p = v4(PROTO_UDP, 0, 0, &[0, 1]);
        p.extend_from_slice(&[0, 2, 0, 0]);
        assert_eq!(
            FlowKey::parse(&p),
            Err(FlowError::TruncatedTransport {
                protocol: PROTO_UDP
            })
        );
    }

    #[test]
    fn ipv4_errors() {
        assert_eq!(
            FlowKey::parse(&[]),
            Err(FlowError::TooShort { len: 0, need: 1 })
        );
        assert_eq!(
            FlowKey::parse(&[0x45; 10]),
            Err(FlowError::TooShort { len: 10, need: 20 })
        );
        let mut p = v4(PROTO_TCP, 0, 0, &tcp(1, 2));
        p[0] = 0x44;
        assert_eq!(FlowKey::parse(&p), Err(FlowError::BadHeaderLength(16)));
        p[0] = 0x4f;
        assert_eq!(
            FlowKey::parse(&p),
            Err(FlowError::TooShort { len: 40, need: 60 })
        );
        let mut p = v4(PROTO_TCP, 0, 0, &tcp(1, 2));
        p[2..4].copy_from_slice(&10u16.to_be_bytes());
        assert_eq!(FlowKey::parse(&p), Err(FlowError::BadTotalLength(10)));
        let p = v4(PROTO_TCP, 0, 0, &[0, 1, 0]);
        assert_eq!(
            FlowKey::parse(&p),
            Err(FlowError::TruncatedTransport {
                protocol: PROTO_TCP
            })
        );
        let p = v4(PROTO_ICMP, 0, 0, &[8, 0, 0, 0, 0x12]);
        assert_eq!(
            FlowKey::parse(&p),
            Err(FlowError::TruncatedTransport {
                protocol: PROTO_ICMP
            })
        );
        assert_eq!(FlowKey::parse(&[0x20; 40]), Err(FlowError::BadVersion(2)));
    }

    #[test]
    fn dst_v4_fast_path() {
        let p = v4(PROTO_TCP, 0, 0, &tcp(1, 2));
        assert_eq!(dst_v4(&p), Some(Ipv4Addr::from(B4)));
        assert_eq!(dst_v4(&p[..20]), Some(Ipv4Addr::from(B4)));
        assert_eq!(dst_v4(&p[..19]), None);
        assert_eq!(dst_v4(&[]), None);
        assert_eq!(dst_v4(&v6(&[], PROTO_UDP, &udp(1, 2))), None);
    }

    #[test]
    fn ipv6_tcp_and_udp() {
        assert_eq!(
            FlowKey::parse(&v6(&[], PROTO_TCP, &tcp(443, 50_000))),
            Ok(key6(PROTO_TCP, 443, 50_000))
        );
        assert_eq!(
            FlowKey::parse(&v6(&[], PROTO_UDP, &udp(9, 10))),
            Ok(key6(PROTO_UDP, 9, 10))
        );
    }

    #[test]
    fn ipv6_icmp_echo() {
        for msg_type in [128, 129] {
            let p = v6(&[], PROTO_ICMPV6, &echo(msg_type, 0xbeef));
            assert_eq!(FlowKey::parse(&p), Ok(key6(PROTO_ICMPV6, 0xbeef, 0)));
        }
        // Neighbour solicitation: no identifier.
        let p = v6(&[], PROTO_ICMPV6, &echo(135, 0xbeef));
        assert_eq!(FlowKey::parse(&p), Ok(key6(PROTO_ICMPV6, 0, 0)));
    }

    #[test]
    fn ipv6_skips_extension_headers() {
        let exts = [
            opts(IPV6_HOP_BY_HOP, 0),
            opts(IPV6_DEST_OPTS, 1),
            opts(IPV6_ROUTING, 2),
            frag6(0, true),
            opts(IPV6_DEST_OPTS, 0),
        ];
        let p = v6(&exts, PROTO_UDP, &udp(1234, 4321));
        assert_eq!(FlowKey::parse(&p), Ok(key6(PROTO_UDP, 1234, 4321)));
    }

    #[test]
    fn ipv6_skips_authentication_header() {
        let mut ah = vec![0u8; 24];
        ah[1] = 4; // (4 + 2) * 4 = 24 bytes
        let p = v6(&[(IPV6_AH, ah)], PROTO_TCP, &tcp(7, 8));
        assert_eq!(FlowKey::parse(&p), Ok(key6(PROTO_TCP, 7, 8)));
    }

    #[test]
    fn ipv6_later_fragment_has_no_ports() {
        let p = v6(&[frag6(100, false)], PROTO_TCP, &[0xaa; 16]);
        assert_eq!(FlowKey::parse(&p), Ok(key6(PROTO_TCP, 0, 0)));
    }

    #[test]
    fn ipv6_no_next_header_and_unknown_protocols() {
        assert_eq!(FlowKey::parse(&v6(&[], 59, &[])), Ok(key6(59, 0, 0)));
        assert_eq!(FlowKey::parse(&v6(&[], 50, &[0; 16])), Ok(key6(50, 0, 0))); // ESP
    }

    #[test]
    fn ipv6_errors() {
        assert_eq!(
            FlowKey::parse(&[0x60; 39]),
            Err(FlowError::TooShort { len: 39, need: 40 })
        );
        // Extension header claiming more bytes than the packet has.
        let mut p = v6(&[opts(IPV6_ROUTING, 0)], PROTO_UDP, &udp(1, 2));
        p[41] = 10;
        assert_eq!(
            FlowKey::parse(&p),
            Err(FlowError::TruncatedExtension(IPV6_ROUTING))
        );
        // Extension header with no bytes at all.
        let p = v6(&[], IPV6_HOP_BY_HOP, &[]);
        assert_eq!(
            FlowKey::parse(&p),
            Err(FlowError::TruncatedExtension(IPV6_HOP_BY_HOP))
        );
        let p = v6(&[], IPV6_FRAGMENT, &[0; 7]);
        assert_eq!(
            FlowKey::parse(&p),
            Err(FlowError::TruncatedExtension(IPV6_FRAGMENT))
        );
        let p = v6(&[], PROTO_UDP, &[0; 3]);
        assert_eq!(
            FlowKey::parse(&p),
            Err(FlowError::TruncatedTransport {
                protocol: PROTO_UDP
            })
        );
        // A long chain of options headers is cut off.
        let chain: Vec<_> = (0..=MAX_IPV6_EXT_HEADERS)
            .map(|_| opts(IPV6_DEST_OPTS, 0))
            .collect();
        assert_eq!(
            FlowKey::parse(&v6(&chain, PROTO_UDP, &udp(1, 2))),
            Err(FlowError::TooManyExtensions)
        );
        let chain: Vec<_> = (0..MAX_IPV6_EXT_HEADERS)
            .map(|_| opts(IPV6_DEST_OPTS, 0))
            .collect();
        assert_eq!(
            FlowKey::parse(&v6(&chain, PROTO_UDP, &udp(1, 2))),
            Ok(key6(PROTO_UDP, 1, 2))
        );
    }

    #[test]
    fn ipv6_payload_length_bounds_the_walk() {
        // Payload length says the packet ends after the fixed header: the trailing
        // bytes are not a UDP header.
        let mut p = v6(&[], PROTO_UDP, &udp(1, 2));
        p[4..6].copy_from_slice(&2u16.to_be_bytes());
        assert_eq!(
            FlowKey::parse(&p),
            Err(FlowError::TruncatedTransport {
                protocol: PROTO_UDP
            })
        );
        // Zero payload length (jumbogram-style): the buffer is trusted.
        p[4..6].copy_from_slice(&0u16.to_be_bytes());
        assert_eq!(FlowKey::parse(&p), Ok(key6(PROTO_UDP, 1, 2)));
    }

    #[test]
    fn stable_hash_is_pinned() {
        // Agents on different machines must agree; pin values so a change is noticed.
        // Cross-checked against a Python transcription of FNV-1a + fmix64.
        assert_eq!(key4(PROTO_TCP, 40_000, 80).stable_hash(), PINNED_V4);
        assert_eq!(key6(PROTO_UDP, 1, 2).stable_hash(), PINNED_V6);
    }
    const PINNED_V4: u64 = 16_154_474_480_305_861_957;
    const PINNED_V6: u64 = 14_545_158_277_152_900_563;

    #[test]
    fn stable_hash_distinguishes_every_field() {
        let base = key4(PROTO_TCP, 1000, 80);
        let variants = [
            FlowKey {
                src: Ipv4Addr::new(198, 18, 0, 3).into(),
                ..base
            },
            FlowKey {
                dst: Ipv4Addr::new(198, 18, 0, 3).into(),
                ..base
            },
            FlowKey {
                protocol: PROTO_UDP,
                ..base
            },
            FlowKey {
                src_port: 1001,
                ..base
            },
            FlowKey {
                dst_port: 81,
                ..base
            },
            // Swapped direction is a different flow.
            FlowKey {
                src: base.dst,
                dst: base.src,
                src_port: 80,
                dst_port: 1000,
                ..base
            },
        ];
        let hashes: HashSet<u64> = variants
            .iter()
            .chain([&base])
            .map(FlowKey::stable_hash)
            .collect();
        assert_eq!(hashes.len(), variants.len() + 1);
    }

    #[test]
    fn stable_hash_spreads_similar_flows() {
        // Flows differing only in the source port (the common case: many connections
        // between two hosts) must fill small bucket counts evenly, low bits included.
        for buckets in [2u64, 3, 4, 8] {
            let mut counts = vec![0u32; buckets as usize];
            for port in 0..8000u16 {
                counts[(key4(PROTO_TCP, port, 80).stable_hash() % buckets) as usize] += 1;
            }
            let p = 1.0 / buckets as f64;
            let expected = 8000.0 * p;
            // Five binomial standard deviations.
            let tolerance = 5.0 * (8000.0 * p * (1.0 - p)).sqrt();
            for &c in &counts {
                assert!(
                    (f64::from(c) - expected).abs() < tolerance,
                    "{buckets}: {counts:?}"
                );
            }
        }
        // And each output bit is set about half the time.
        let hashes: Vec<u64> = (0..8000u16)
            .map(|p| key4(PROTO_UDP, 5000, p).stable_hash())
            .collect();
        for bit in 0..64 {
            let ones = hashes.iter().filter(|h| (*h >> bit) & 1 == 1).count();
            assert!((3700..4300).contains(&ones), "bit {bit}: {ones}");
        }
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..120)) {
            let _ = FlowKey::parse(&bytes);
            let _ = dst_v4(&bytes);
        }

        #[test]
        fn parse_never_panics_on_plausible_v4(
            ihl in 0u8..16, total: u16, frag: u16, protocol in prop_oneof![Just(1u8), Just(6), Just(17), Just(132), any::<u8>()],
            rest in proptest::collection::vec(any::<u8>(), 0..80),
        ) {
            let mut p = vec![0x40 | ihl, 0];
            p.extend_from_slice(&total.to_be_bytes());
            p.extend_from_slice(&[0, 0]);
            p.extend_from_slice(&frag.to_be_bytes());
            p.extend_from_slice(&[64, protocol, 0, 0]);
            p.extend_from_slice(&rest);
            let _ = FlowKey::parse(&p);
        }

        #[test]
        fn parse_never_panics_on_plausible_v6(
            payload_len: u16,
            chain in proptest::collection::vec(prop_oneof![Just(0u8), Just(43), Just(44), Just(51), Just(60), Just(6), Just(17), Just(58)], 1..12),
            lens in proptest::collection::vec(0u8..4, 12),
            tail in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            // Build a chain of headers whose types and lengths are random but plausible,
            // so the walk goes deep instead of stopping at the first byte.
            let mut p = vec![0u8; 40];
            p[0] = 0x60;
            p[4..6].copy_from_slice(&payload_len.to_be_bytes());
            p[6] = chain[0];
            for (i, len) in lens.iter().enumerate().take(chain.len()) {
                let next = chain.get(i + 1).copied().unwrap_or(17);
                let mut h = vec![0u8; (usize::from(*len) + 1) * 8];
                h[0] = next;
                h[1] = *len;
                p.extend_from_slice(&h);
            }
            p.extend_from_slice(&tail);
            let _ = FlowKey::parse(&p);
        }

        #[test]
        fn parsed_v4_tcp_matches_construction(src_port: u16, dst_port: u16, options in 0usize..11) {
            let p = v4(PROTO_TCP, options * 4, 0, &tcp(src_port, dst_port));
            prop_assert_eq!(FlowKey::parse(&p), Ok(key4(PROTO_TCP, src_port, dst_port)));
        }

        #[test]
        fn stable_hash_is_a_function_of_the_key(src_port: u16, dst_port: u16, protocol: u8) {
            let a = key4(protocol, src_port, dst_port);
            let b = a;
            prop_assert_eq!(a.stable_hash(), b.stable_hash());
        }
    }
}
