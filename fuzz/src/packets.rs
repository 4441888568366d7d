//! Well-formed IPv4 and IPv6 packets, as a TUN device would deliver them.

pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_GRE: u8 = 47;
pub const PROTO_ICMPV6: u8 = 58;
pub const PROTO_SCTP: u8 = 132;

pub const IPV6_HOP_BY_HOP: u8 = 0;
pub const IPV6_ROUTING: u8 = 43;
pub const IPV6_FRAGMENT: u8 = 44;
pub const IPV6_AH: u8 = 51;
pub const IPV6_DEST_OPTS: u8 = 60;

pub const SRC4: [u8; 4] = [198, 18, 0, 1];
pub const DST4: [u8; 4] = [198, 18, 0, 3];
pub const SRC6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
pub const DST6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];

/// Fields of an IPv4 header besides the addresses.
#[derive(Debug, Clone, Copy)]
pub struct V4 {
    pub tos: u8,
    pub protocol: u8,
    /// Bytes of IP options (NOPs), a multiple of 4, at most 40.
    pub options: usize,
    /// Flags and fragment offset, as on the wire.
    pub frag: u16,
    pub src: [u8; 4],
    pub dst: [u8; 4],
}

impl V4 {
    pub fn new(protocol: u8) -> V4 {
        V4 {
            tos: 0,
            protocol,
            options: 0,
            frag: 0,
            src: SRC4,
            dst: DST4,
        }
    }
}

/// An IPv4 packet with a correct header checksum around `transport`.
pub fn ipv4(h: V4, transport: &[u8]) -> Vec<u8> {
    let options = h.options.min(40) / 4 * 4;
    let ihl = 20 + options;
    let total = ihl + transport.len();
    let mut p = vec![0u8; ihl];
    p[0] = 0x40 | (ihl / 4) as u8;
    p[1] = h.tos;
    p[2..4].copy_from_slice(&(total.min(usize::from(u16::MAX)) as u16).to_be_bytes());
    p[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
    p[6..8].copy_from_slice(&h.frag.to_be_bytes());
    p[8] = 64;
    p[9] = h.protocol;
    p[12..16].copy_from_slice(&h.src);
    p[16..20].copy_from_slice(&h.dst);
    for b in &mut p[20..] {
        *b = 0x01; // NOP
    }
    let sum = checksum(&p);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    p.extend_from_slice(transport);
    p
}

/// An IPv6 packet; `exts` are (header type, body) pairs chained before `transport`
/// (the first byte of each body is overwritten with the next header).
pub fn ipv6(tclass: u8, exts: &[(u8, Vec<u8>)], protocol: u8, transport: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; 40];
    p[0] = 0x60 | (tclass >> 4);
    p[1] = tclass << 4;
    p[6] = exts.first().map_or(protocol, |e| e.0);
    p[7] = 64;
    p[8..24].copy_from_slice(&SRC6);
    p[24..40].copy_from_slice(&DST6);
    for (i, (_, body)) in exts.iter().enumerate() {
        let mut body = body.clone();
        if let Some(first) = body.first_mut() {
            *first = exts.get(i + 1).map_or(protocol, |e| e.0);
        }
        p.extend_from_slice(&body);
    }
    p.extend_from_slice(transport);
    let payload_len = (p.len() - 40).min(usize::from(u16::MAX)) as u16;
    p[4..6].copy_from_slice(&payload_len.to_be_bytes());
    p
}

/// Hop-by-hop, routing or destination-options header of `units` extra 8-byte units.
pub fn ext_opts(kind: u8, units: u8) -> (u8, Vec<u8>) {
    let mut body = vec![0u8; (usize::from(units) + 1) * 8];
    body[1] = units;
    if kind != IPV6_ROUTING {
        // PadN over the rest of the header.
        body[2] = 1;
        body[3] = (body.len() - 4) as u8;
    }
    (kind, body)
}

/// Authentication header: length in 4-byte units minus 2.
pub fn ext_ah(payload_words: u8) -> (u8, Vec<u8>) {
    let mut body = vec![0u8; (usize::from(payload_words) + 2) * 4];
    body[1] = payload_words;
    (IPV6_AH, body)
}

/// Fragment header; `offset` in 8-byte units.
pub fn ext_fragment(offset: u16, more: bool) -> (u8, Vec<u8>) {
    let mut body = vec![0u8; 8];
    body[2..4].copy_from_slice(&((offset << 3) | u16::from(more)).to_be_bytes());
    body[4..8].copy_from_slice(&0xdead_beefu32.to_be_bytes());
    (IPV6_FRAGMENT, body)
}

/// A TCP header (SYN, no options) followed by `payload`.
pub fn tcp(src: u16, dst: u16, payload: &[u8]) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&src.to_be_bytes());
    t[2..4].copy_from_slice(&dst.to_be_bytes());
    t[4..8].copy_from_slice(&1000u32.to_be_bytes());
    t[12] = 0x50;
    t[13] = 0x02;
    t[14..16].copy_from_slice(&65_535u16.to_be_bytes());
    t.extend_from_slice(payload);
    t
}

/// A UDP header followed by `payload` (checksum left 0: optional over IPv4).
pub fn udp(src: u16, dst: u16, payload: &[u8]) -> Vec<u8> {
    let mut t = vec![0u8; 8];
    t[0..2].copy_from_slice(&src.to_be_bytes());
    t[2..4].copy_from_slice(&dst.to_be_bytes());
    let len = (8 + payload.len()).min(usize::from(u16::MAX)) as u16;
    t[4..6].copy_from_slice(&len.to_be_bytes());
    t.extend_from_slice(payload);
    t
}

/// An ICMP (or ICMPv6) message of `msg_type` with identifier and sequence,
/// followed by `payload`.
pub fn icmp(msg_type: u8, id: u16, seq: u16, payload: &[u8]) -> Vec<u8> {
    let mut t = vec![0u8; 8];
    t[0] = msg_type;
    t[4..6].copy_from_slice(&id.to_be_bytes());
    t[6..8].copy_from_slice(&seq.to_be_bytes());
    t.extend_from_slice(payload);
    let sum = checksum(&t);
    t[2..4].copy_from_slice(&sum.to_be_bytes());
    t
}

/// An SCTP common header (ports, tag, checksum) followed by `payload`.
pub fn sctp(src: u16, dst: u16, payload: &[u8]) -> Vec<u8> {
    let mut t = vec![0u8; 12];
    t[0..2].copy_from_slice(&src.to_be_bytes());
    t[2..4].copy_from_slice(&dst.to_be_bytes());
    t.extend_from_slice(payload);
    t
}

/// The Internet checksum of `data` (with its checksum field zero).
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}
