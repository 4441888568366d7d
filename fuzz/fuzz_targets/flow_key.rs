//! Flow keys of packets from the TUN device or a peer: `FlowKey::parse`,
//! `flow::dst_v4` and `sched::PacketMeta::from_ip`, which must agree with each
//! other and with the header bytes they read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nextmini_agent::flow::{
    self, FlowKey, PROTO_ICMP, PROTO_ICMPV6, PROTO_SCTP, PROTO_TCP, PROTO_UDP,
};
use nextmini_agent::sched::PacketMeta;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

fuzz_target!(|data: &[u8]| {
    let parsed = FlowKey::parse(data);
    assert_eq!(FlowKey::parse(data), parsed, "deterministic");
    let dst4 = flow::dst_v4(data);
    let meta = PacketMeta::from_ip(data);
    let version = data.first().map(|b| b >> 4);

    // dst_v4 reads the destination of any IPv4 header that is all there.
    assert_eq!(
        dst4.is_some(),
        version == Some(4) && data.len() >= 20,
        "dst_v4 on {} bytes",
        data.len()
    );
    if let Some(dst) = dst4 {
        assert_eq!(dst, Ipv4Addr::new(data[16], data[17], data[18], data[19]));
    }

    assert_eq!(meta.len as usize, data.len());
    match version {
        Some(4) if data.len() >= 20 => {
            assert_eq!(meta.dscp, data[1] >> 2);
            assert_eq!(meta.ecn_capable, data[1] & 0b11 != 0);
        }
        Some(6) if data.len() >= 40 => {
            let tclass = (data[0] << 4) | (data[1] >> 4);
            assert_eq!(meta.dscp, tclass >> 2);
            assert_eq!(meta.ecn_capable, tclass & 0b11 != 0);
        }
        _ => assert_eq!(
            meta,
            PacketMeta::with_len(meta.len),
            "not IP: only the length"
        ),
    }

    match parsed {
        Ok(key) => {
            // PacketMeta carries what the key says.
            assert_eq!(meta.protocol, key.protocol);
            assert_eq!(meta.src_port, key.src_port);
            assert_eq!(meta.dst_port, key.dst_port);
            assert_eq!(meta.flow_hash, key.stable_hash());
            check_key(data, &key);
            if let IpAddr::V4(dst) = key.dst {
                assert_eq!(dst4, Some(dst), "dst_v4 agrees with the key");
            }
            check_padding(data, &key);
        }
        Err(_) => {
            assert_eq!((meta.src_port, meta.dst_port, meta.flow_hash), (0, 0, 0));
        }
    }
});

/// The key's addresses are the header's, and ports only exist where they should.
fn check_key(data: &[u8], key: &FlowKey) {
    match data[0] >> 4 {
        4 => {
            assert!(data.len() >= 20);
            let at = |i: usize| {
                IpAddr::V4(Ipv4Addr::new(
                    data[i],
                    data[i + 1],
                    data[i + 2],
                    data[i + 3],
                ))
            };
            assert_eq!(key.src, at(12));
            assert_eq!(key.dst, at(16));
            assert_eq!(key.protocol, data[9]);
        }
        6 => {
            assert!(data.len() >= 40);
            let at = |i: usize| {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(&data[i..i + 16]);
                IpAddr::V6(Ipv6Addr::from(octets))
            };
            assert_eq!(key.src, at(8));
            assert_eq!(key.dst, at(24));
        }
        v => panic!("parsed a version {v} packet"),
    }
    match key.protocol {
        PROTO_TCP | PROTO_UDP | PROTO_SCTP => {}
        // The echo identifier, and never a destination "port".
        PROTO_ICMP | PROTO_ICMPV6 => assert_eq!(key.dst_port, 0),
        _ => assert_eq!((key.src_port, key.dst_port), (0, 0)),
    }
    let same = FlowKey { ..*key };
    assert_eq!(same.stable_hash(), key.stable_hash());
}

/// Bytes after the datagram (as the IP length field says) are not part of it:
/// padding them on changes nothing.
fn check_padding(data: &[u8], key: &FlowKey) {
    let end = match data[0] >> 4 {
        4 => usize::from(u16::from_be_bytes([data[2], data[3]])),
        6 => match usize::from(u16::from_be_bytes([data[4], data[5]])) {
            0 => return, // jumbogram-style: the buffer is the packet
            n => 40 + n,
        },
        _ => return,
    };
    if end > data.len() {
        return;
    }
    let mut padded = data.to_vec();
    padded.extend_from_slice(&[0xff; 24]);
    assert_eq!(
        FlowKey::parse(&padded),
        Ok(*key),
        "trailing padding changed the key"
    );
}
