//! The shaper against a per-packet reference (issue 14, item 3): whatever the
//! pipeline does to save work, every packet must leave when a token bucket
//! evaluated packet by packet, in floating point and by other code, says it
//! may, within 1 µs. With MTU-sized packets and with TCP super-packets, which
//! a shaped link cuts into the segments a NIC would send.

use super::{PacketMeta, Pipeline};
use crate::offload::{self, tests::tcp_offload, tests::tcp_super};
use nextmini_proto::v1 as pb;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const RATE_BPS: u64 = 200_000_000;
const BURST_BYTES: u64 = 3_000;
const TOLERANCE_NS: f64 = 1_000.0;

/// Departures of FIFO packets `(arrival ns, bytes)` from a token bucket of
/// `BURST_BYTES` filled at `RATE_BPS`, one packet at a time.
fn reference(packets: &[(u64, usize)]) -> Vec<f64> {
    let rate = RATE_BPS as f64 / 8e9; // bytes per ns
    let depth = BURST_BYTES as f64;
    let (mut tokens, mut last) = (depth, 0.0f64);
    let mut out = Vec::with_capacity(packets.len());
    for &(arrival, len) in packets {
        let ready = (arrival as f64).max(last);
        let at_ready = (tokens + (ready - last) * rate).min(depth);
        let need = (len as f64).min(depth);
        let depart = if at_ready >= need {
            ready
        } else {
            ready + (need - at_ready) / rate
        };
        tokens = (tokens + (depart - last) * rate).min(depth) - len as f64;
        last = depart;
        out.push(depart);
    }
    out
}

fn pipeline() -> Pipeline<Vec<u8>> {
    let params = pb::LinkParams {
        rate_bps: RATE_BPS,
        burst_bytes: BURST_BYTES,
        queue_packets: 100_000,
        ..Default::default()
    };
    Pipeline::new(&params, 1500, 7).expect("valid parameters")
}

/// Offers each burst of packets at its instant, polling at every wake-up in
/// between; returns each packet's release time, in offer order.
fn run(bursts: &[(u64, Vec<Vec<u8>>)]) -> Vec<u64> {
    let mut pl = pipeline();
    let mut released = Vec::new();
    let mut now = 0;
    let mut poll_until = |pl: &mut Pipeline<Vec<u8>>, until: Option<u64>, now: &mut u64| {
        loop {
            let poll = pl.poll(*now);
            released.extend(poll.packets.iter().map(|_| *now));
            match poll.next_wakeup {
                Some(t) if until.is_none_or(|u| t <= u) => *now = t.max(*now),
                _ => break,
            }
        }
    };
    for (at, packets) in bursts {
        poll_until(&mut pl, Some(*at), &mut now);
        now = *at;
        for p in packets {
            let meta = PacketMeta::from_ip(p);
            pl.enqueue(p.clone(), meta, now);
        }
    }
    poll_until(&mut pl, None, &mut now);
    released
}

fn compare(bursts: &[(u64, Vec<Vec<u8>>)]) {
    let flat: Vec<(u64, usize)> = bursts
        .iter()
        .flat_map(|(at, ps)| ps.iter().map(move |p| (*at, p.len())))
        .collect();
    let expected = reference(&flat);
    let got = run(bursts);
    assert_eq!(got.len(), expected.len(), "every packet leaves");
    let worst = got
        .iter()
        .zip(&expected)
        .map(|(g, e)| (*g as f64 - e).abs())
        .fold(0.0f64, f64::max);
    assert!(
        worst <= TOLERANCE_NS,
        "a departure is {worst:.0} ns off the per-packet reference"
    );
}

fn udp(len: usize, id: u16) -> Vec<u8> {
    super::meta::tests::udp4(len, 0, 1000, id)
}

#[test]
fn mtu_sized_packets_leave_when_the_per_packet_reference_says() {
    let mut rng = SmallRng::seed_from_u64(14);
    let mut at = 0u64;
    let bursts: Vec<(u64, Vec<Vec<u8>>)> = (0..2_000u16)
        .map(|i| {
            // Arrivals from back-to-back to idle gaps, sizes from ACK to MTU.
            at += rng.random_range(0..120_000u64);
            let len = if rng.random_bool(0.3) {
                64
            } else {
                rng.random_range(200..=1500)
            };
            (at, vec![udp(len, i)])
        })
        .collect();
    compare(&bursts);
}

#[test]
fn super_packets_leave_as_the_segments_a_nic_would_send() {
    let mut rng = SmallRng::seed_from_u64(3);
    let mut at = 0u64;
    let bursts: Vec<(u64, Vec<Vec<u8>>)> = (0..200u16)
        .map(|i| {
            at += rng.random_range(0..2_000_000u64);
            let payload = vec![i as u8; rng.random_range(1..=40) * 1448];
            let mut segments = Vec::new();
            offload::finish(
                tcp_super(&payload, u32::from(i) * 100_000, 0x18, i),
                tcp_offload(1448),
                &mut |s| segments.push(s.to_vec()),
            )
            .expect("segmentation");
            assert!(segments.iter().all(|s| s.len() <= 1500));
            (at, segments)
        })
        .collect();
    compare(&bursts);
}
