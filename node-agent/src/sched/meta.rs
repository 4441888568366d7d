//! The abstract packet the schemes see: a few header fields read once at enqueue.
//!
//! Like Flexplane's abstract packets, schemes decide on metadata only, so a scheme
//! never parses bytes and the pipeline parses each packet exactly once.

use crate::flow::FlowKey;

const ECN_MASK: u8 = 0b11;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PacketMeta {
    /// Bytes on the wire (the whole IP packet).
    pub len: u32,
    /// [`FlowKey::stable_hash`] of the 5-tuple; 0 when the packet does not parse.
    pub flow_hash: u64,
    /// Differentiated services code point (upper 6 bits of TOS / traffic class).
    pub dscp: u8,
    /// ECT(0), ECT(1) or already CE: the sender understands congestion marks.
    pub ecn_capable: bool,
    pub protocol: u8,
    pub src_port: u16,
    pub dst_port: u16,
}

impl PacketMeta {
    /// Metadata for a packet of `len` bytes with every other field zero: for tests,
    /// benchmarks and payloads that are not IP.
    pub fn with_len(len: u32) -> PacketMeta {
        PacketMeta {
            len,
            ..PacketMeta::default()
        }
    }

    /// Reads the fields of an IPv4 or IPv6 packet. Never panics: whatever cannot be
    /// read stays zero, so a malformed packet is still queued and shaped by its length.
    pub fn from_ip(packet: &[u8]) -> PacketMeta {
        let len = u32::try_from(packet.len()).unwrap_or(u32::MAX);
        let mut meta = PacketMeta::with_len(len);
        let (tos, protocol) = match packet.first().map(|b| b >> 4) {
            Some(4) if packet.len() >= 20 => (packet[1], packet[9]),
            Some(6) if packet.len() >= 40 => ((packet[0] << 4) | (packet[1] >> 4), packet[6]),
            _ => return meta,
        };
        meta.dscp = tos >> 2;
        meta.ecn_capable = tos & ECN_MASK != 0;
        meta.protocol = protocol;
        if let Ok(key) = FlowKey::parse(packet) {
            // The key's protocol is the one after IPv6 extension headers.
            meta.protocol = key.protocol;
            meta.src_port = key.src_port;
            meta.dst_port = key.dst_port;
            meta.flow_hash = key.stable_hash();
        }
        meta
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::flow::{PROTO_TCP, PROTO_UDP};

    /// A minimal IPv4/UDP packet of `len` bytes (at least 28) with the given TOS byte
    /// and a valid header checksum.
    pub(crate) fn udp4(len: usize, tos: u8, src_port: u16, dst_port: u16) -> Vec<u8> {
        let len = len.max(28);
        let mut p = vec![0u8; len];
        p[0] = 0x45;
        p[1] = tos;
        p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        p[8] = 64;
        p[9] = PROTO_UDP;
        p[12..16].copy_from_slice(&[198, 18, 0, 1]);
        p[16..20].copy_from_slice(&[198, 18, 0, 2]);
        p[20..22].copy_from_slice(&src_port.to_be_bytes());
        p[22..24].copy_from_slice(&dst_port.to_be_bytes());
        let sum = ipv4_checksum(&p[..20]);
        p[10..12].copy_from_slice(&sum.to_be_bytes());
        p
    }

    /// The ones' complement sum over a header whose checksum field is zero gives the
    /// checksum; over a header with a correct checksum it gives 0.
    pub(crate) fn ipv4_checksum(header: &[u8]) -> u16 {
        let mut sum: u32 = header
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    pub(crate) fn tcp6(tclass: u8, src_port: u16, dst_port: u16) -> Vec<u8> {
        let mut p = vec![0u8; 60];
        p[0] = 0x60 | (tclass >> 4);
        p[1] = tclass << 4;
        p[4..6].copy_from_slice(&20u16.to_be_bytes());
        p[6] = PROTO_TCP;
        p[7] = 64;
        p[8] = 0x20;
        p[24] = 0x20;
        p[40..42].copy_from_slice(&src_port.to_be_bytes());
        p[42..44].copy_from_slice(&dst_port.to_be_bytes());
        p
    }

    #[test]
    fn reads_ipv4_fields() {
        // DSCP 46 (EF) with ECT(0).
        let p = udp4(100, (46 << 2) | 0b10, 5000, 53);
        let m = PacketMeta::from_ip(&p);
        assert_eq!(m.len, 100);
        assert_eq!(m.dscp, 46);
        assert!(m.ecn_capable);
        assert_eq!((m.protocol, m.src_port, m.dst_port), (PROTO_UDP, 5000, 53));
        let key = FlowKey::parse(&p).expect("valid packet");
        assert_eq!(m.flow_hash, key.stable_hash());
        assert!(!PacketMeta::from_ip(&udp4(100, 46 << 2, 1, 2)).ecn_capable);
    }

    #[test]
    fn reads_ipv6_fields() {
        let m = PacketMeta::from_ip(&tcp6((10 << 2) | 0b01, 443, 40_000));
        assert_eq!(m.dscp, 10);
        assert!(m.ecn_capable);
        assert_eq!(
            (m.protocol, m.src_port, m.dst_port),
            (PROTO_TCP, 443, 40_000)
        );
        assert_ne!(m.flow_hash, 0);
    }

    #[test]
    fn malformed_packets_keep_their_length() {
        assert_eq!(PacketMeta::from_ip(&[]), PacketMeta::with_len(0));
        assert_eq!(PacketMeta::from_ip(&[0x45; 10]), PacketMeta::with_len(10));
        // Header present but transport truncated: header fields still count.
        let mut p = udp4(28, 0b11, 1, 2);
        p.truncate(22);
        p[2..4].copy_from_slice(&22u16.to_be_bytes());
        let m = PacketMeta::from_ip(&p);
        assert_eq!(
            (m.len, m.protocol, m.src_port, m.flow_hash),
            (22, PROTO_UDP, 0, 0)
        );
        assert!(m.ecn_capable);
    }

    proptest::proptest! {
        #[test]
        fn from_ip_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..100)) {
            let m = PacketMeta::from_ip(&bytes);
            proptest::prop_assert_eq!(m.len as usize, bytes.len());
        }
    }
}
