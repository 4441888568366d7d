use super::*;
use proptest::prelude::*;

const SRC: [u8; 4] = [10, 0, 0, 1];
const DST: [u8; 4] = [10, 0, 0, 2];
const TCP_HEADER: usize = 32; // with the timestamp option, as Linux sends
const PSH_ACK: u8 = 0x18;

/// One's-complement sum, folded; written independently of tun-rs so the
/// tests check its arithmetic rather than repeat it.
fn ones_sum(data: &[u8], mut sum: u32) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum > 0xffff {
        sum = (sum >> 16) + (sum & 0xffff);
    }
    sum
}

fn pseudo_v4(packet: &[u8], protocol: u8, transport_len: usize) -> u32 {
    let mut p = Vec::new();
    p.extend_from_slice(&packet[12..20]);
    p.extend_from_slice(&[0, protocol]);
    p.extend_from_slice(&(transport_len as u16).to_be_bytes());
    ones_sum(&p, 0)
}

/// True when the IPv4 header and the transport checksum both verify.
pub(crate) fn checksums_verify(packet: &[u8]) -> bool {
    let ihl = usize::from(packet[0] & 0xf) * 4;
    let ip_ok = ones_sum(&packet[..ihl], 0) == 0xffff;
    let transport = &packet[ihl..];
    let l4_ok = ones_sum(transport, pseudo_v4(packet, packet[9], transport.len())) == 0xffff;
    ip_ok && l4_ok
}

/// An IPv4/TCP super-packet as the kernel hands it over: IP header checksum
/// done, the TCP checksum field holding the folded pseudo-header sum.
pub(crate) fn tcp_super(payload: &[u8], seq: u32, flags: u8, ip_id: u16) -> BytesMut {
    let total = IPV4_MIN_HEADER + TCP_HEADER + payload.len();
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[1] = 0x02; // ECT(0)
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[4..6].copy_from_slice(&ip_id.to_be_bytes());
    p[6] = 0x40; // DF
    p[8] = 64;
    p[9] = 6;
    p[12..16].copy_from_slice(&SRC);
    p[16..20].copy_from_slice(&DST);
    let ip_sum = !(ones_sum(&p[..20], 0) as u16);
    p[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    let t = IPV4_MIN_HEADER;
    p[t..t + 2].copy_from_slice(&40000u16.to_be_bytes());
    p[t + 2..t + 4].copy_from_slice(&5201u16.to_be_bytes());
    p[t + 4..t + 8].copy_from_slice(&seq.to_be_bytes());
    p[t + 8..t + 12].copy_from_slice(&7u32.to_be_bytes());
    p[t + 12] = ((TCP_HEADER / 4) as u8) << 4;
    p[t + 13] = flags;
    p[t + 14..t + 16].copy_from_slice(&502u16.to_be_bytes());
    // Timestamp option: NOP NOP TS(10).
    p[t + 20..t + 24].copy_from_slice(&[1, 1, 8, 10]);
    p[t + 24..t + 28].copy_from_slice(&0x0102_0304u32.to_be_bytes());
    p[IPV4_MIN_HEADER + TCP_HEADER..].copy_from_slice(payload);
    let partial = pseudo_v4(&p, 6, total - IPV4_MIN_HEADER) as u16;
    p[t + 16..t + 18].copy_from_slice(&partial.to_be_bytes());
    BytesMut::from(&p[..])
}

pub(crate) fn tcp_offload(gso_size: u16) -> Offload {
    Offload {
        flags: NEEDS_CSUM,
        gso_type: GSO_TCPV4,
        hdr_len: (IPV4_MIN_HEADER + TCP_HEADER) as u16,
        gso_size,
        csum_start: IPV4_MIN_HEADER as u16,
        csum_offset: TCP_CSUM_OFFSET,
    }
}

fn finish_all(packet: BytesMut, offload: Offload) -> Result<Vec<BytesMut>, OffloadError> {
    let mut out = Vec::new();
    finish(packet, offload, &mut |p| out.push(p))?;
    Ok(out)
}

fn payload_of(segment: &[u8]) -> &[u8] {
    let t = usize::from(segment[0] & 0xf) * 4;
    let tcp = usize::from(segment[t + 12] >> 4) * 4;
    &segment[t + tcp..]
}

#[test]
fn a_super_packet_becomes_mss_sized_segments_a_receiver_accepts() {
    let payload: Vec<u8> = (0..4000u32).map(|i| (i * 7) as u8).collect();
    let segments = finish_all(tcp_super(&payload, 1000, PSH_ACK, 77), tcp_offload(1348))
        .expect("a valid super-packet");
    assert_eq!(segments.len(), 3, "4000 bytes at 1348 per segment");
    let mut joined = Vec::new();
    for (i, s) in segments.iter().enumerate() {
        let t = IPV4_MIN_HEADER;
        assert!(checksums_verify(s), "segment {i} checksums");
        assert_eq!(usize::from(u16::from_be_bytes([s[2], s[3]])), s.len());
        assert_eq!(u16::from_be_bytes([s[4], s[5]]), 77 + i as u16, "IP id");
        let seq = u32::from_be_bytes([s[t + 4], s[t + 5], s[t + 6], s[t + 7]]);
        assert_eq!(seq, 1000 + 1348 * i as u32);
        let last = i == segments.len() - 1;
        assert_eq!(s[t + 13] & 0x08 != 0, last, "PSH only on the last segment");
        assert_eq!(s[1], 0x02, "ECN field kept");
        assert!(s.len() <= IPV4_MIN_HEADER + TCP_HEADER + 1348);
        joined.extend_from_slice(payload_of(s));
    }
    assert_eq!(joined, payload);
}

#[test]
fn a_finished_packet_is_passed_on_untouched() {
    let packet = tcp_super(b"hello", 1, PSH_ACK, 1);
    let out = finish_all(packet.clone(), Offload::default()).expect("nothing to do");
    assert_eq!(out, vec![packet]);
}

#[test]
fn a_partial_checksum_is_finished() {
    let packet = tcp_super(&[0xab; 999], 1, PSH_ACK, 1);
    assert!(!checksums_verify(&packet), "the kernel left it unfinished");
    let offload = Offload {
        gso_type: GSO_NONE,
        gso_size: 0,
        ..tcp_offload(0)
    };
    let out = finish_all(packet, offload).expect("valid");
    assert_eq!(out.len(), 1);
    assert!(checksums_verify(&out[0]));
}

#[test]
fn wire_size_counts_segments_and_their_headers() {
    let packet = tcp_super(&[0; 4000], 1, PSH_ACK, 1);
    let (segments, bytes) = tcp_offload(1348).wire_size(&packet);
    let total: usize = finish_all(packet, tcp_offload(1348))
        .expect("valid")
        .iter()
        .map(|s| s.len())
        .sum();
    assert_eq!(segments, 3);
    assert_eq!(bytes, total as u64);
    assert_eq!(Offload::default().wire_size(&[0; 60]), (1, 60));
}

#[test]
fn bad_metadata_is_refused_not_panicked_on() {
    let packet = tcp_super(&[0; 3000], 1, PSH_ACK, 1);
    let cases = [
        (
            Offload {
                gso_size: 0,
                ..tcp_offload(0)
            },
            OffloadError::ZeroSegmentSize,
        ),
        (
            Offload {
                gso_type: GSO_TCPV6,
                ..tcp_offload(1000)
            },
            OffloadError::GsoMismatch {
                gso_type: GSO_TCPV6,
                version: 4,
            },
        ),
        (
            Offload {
                gso_type: 3,
                ..tcp_offload(1000)
            },
            OffloadError::GsoType(3),
        ),
        (tcp_offload(2), OffloadError::TooManySegments(1500)),
        (
            Offload {
                csum_start: 10,
                ..tcp_offload(1000)
            },
            OffloadError::Header("transport header starts inside the IP header"),
        ),
    ];
    for (offload, expected) in cases {
        assert_eq!(
            finish_all(packet.clone(), offload),
            Err(expected),
            "{offload:?}"
        );
    }
    let outside = Offload {
        gso_type: GSO_NONE,
        csum_start: 60000,
        ..tcp_offload(0)
    };
    assert!(matches!(
        finish_all(packet, outside),
        Err(OffloadError::ChecksumOutside { .. })
    ));
}

#[test]
fn headers_round_trip_through_vnet_and_wire_forms() {
    let o = Offload {
        gso_type: GSO_TCPV4 | GSO_ECN,
        ..tcp_offload(1348)
    };
    assert_eq!(Offload::from_vnet(&o.to_vnet()), o);
    let mut framed = o.to_wire().to_vec();
    framed.extend_from_slice(b"packet");
    let (back, packet) = Offload::split_wire(Bytes::from(framed)).expect("valid");
    assert_eq!(back, o);
    assert_eq!(&packet[..], b"packet");
    assert_eq!(
        Offload::split_wire(Bytes::from_static(b"short")),
        Err(OffloadError::Truncated)
    );
}

#[test]
fn a_checksum_valid_hint_alone_means_nothing_to_do() {
    let mut h = [0u8; VNET_LEN];
    h[0] = 2; // VIRTIO_NET_HDR_F_DATA_VALID
    assert!(Offload::from_vnet(&h).is_finished());
    assert_eq!(Offload::from_vnet(&h), Offload::default());
}

fn chunk_all(packet: BytesMut, offload: Offload, per_train: usize) -> Vec<(Bytes, Offload, u32)> {
    let mut out = Vec::new();
    chunk(packet.freeze(), offload, per_train, &mut |p, o, n| {
        out.push((p, o, n))
    })
    .expect("valid");
    out
}

#[test]
fn a_short_super_packet_is_one_train_untouched() {
    let payload = vec![7u8; 3000];
    let packet = tcp_super(&payload, 1, PSH_ACK, 9);
    let trains = chunk_all(packet.clone(), tcp_offload(1000), 16);
    assert_eq!(trains.len(), 1);
    assert_eq!(&trains[0].0[..], &packet[..]);
    assert_eq!(trains[0].2, 3);
}

proptest! {
    /// The promise of a train: the segments a receiver cuts from the trains
    /// are byte for byte those it would cut from the super-packet, and each
    /// train's partial checksum is its own pseudo-header sum (a receiver's
    /// kernel adjusts that field by length, it does not recompute it).
    #[test]
    fn trains_cut_into_the_same_segments_as_the_super_packet(
        len in 1usize..20_000,
        gso_size in 500u16..9000,
        per_train in 1usize..20,
        seq in any::<u32>(),
        ip_id in any::<u16>(),
        fin in any::<bool>(),
        cwr in any::<bool>(),
    ) {
        let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let flags = PSH_ACK | u8::from(fin) | if cwr { 0x80 } else { 0 };
        let whole = tcp_super(&payload, seq, flags, ip_id);
        let expected = finish_all(whole.clone(), tcp_offload(gso_size)).expect("valid");
        let trains = chunk_all(whole, tcp_offload(gso_size), per_train);
        let mut cut = Vec::new();
        for (train, offload, n) in &trains {
            prop_assert!(*n as usize <= per_train);
            let t = IPV4_MIN_HEADER;
            let field = u16::from_be_bytes([train[t + 16], train[t + 17]]);
            prop_assert_eq!(u32::from(field), pseudo_v4(train, 6, train.len() - t));
            let segments = finish_all(BytesMut::from(&train[..]), *offload).expect("valid");
            prop_assert_eq!(segments.len(), *n as usize);
            cut.extend(segments);
        }
        prop_assert_eq!(cut, expected);
    }

    #[test]
    fn segments_carry_exactly_the_payload_with_valid_checksums(
        len in 1usize..20_000,
        gso_size in 500u16..9000,
        seq in any::<u32>(),
        fin in any::<bool>(),
    ) {
        let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let flags = PSH_ACK | u8::from(fin);
        let segments = finish_all(tcp_super(&payload, seq, flags, 9), tcp_offload(gso_size))
            .expect("valid");
        prop_assert_eq!(segments.len(), len.div_ceil(usize::from(gso_size)));
        let mut joined = Vec::new();
        for (i, s) in segments.iter().enumerate() {
            prop_assert!(checksums_verify(s));
            let last = i + 1 == segments.len();
            prop_assert_eq!(s[IPV4_MIN_HEADER + 13] & 0x01 != 0, fin && last, "FIN only last");
            joined.extend_from_slice(payload_of(s));
        }
        prop_assert_eq!(joined, payload);
    }

    #[test]
    fn finish_never_panics(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
        wire in proptest::array::uniform10(any::<u8>()),
    ) {
        let mut framed = wire.to_vec();
        framed.extend_from_slice(&bytes);
        if let Ok((offload, packet)) = Offload::split_wire(Bytes::from(framed)) {
            let _ = offload.wire_size(&packet);
            let _ = finish_all(BytesMut::from(&packet[..]), offload);
        }
    }
}
