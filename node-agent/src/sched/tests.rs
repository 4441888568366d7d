//! Pipeline tests with a fake clock: the schemes composed, end to end.

use super::meta::tests::{ipv4_checksum, udp4};
use super::*;
use nextmini_proto::v1 as pb;
use pb::scheduler_config::Kind;

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;

type Pkt = Vec<u8>;

fn pipeline(params: &pb::LinkParams) -> Pipeline<Pkt> {
    Pipeline::new(params, 1500, 42).expect("valid params")
}

/// A 1000-byte UDP packet whose destination port identifies it.
fn pkt(id: u16) -> (Pkt, PacketMeta) {
    pkt_with(1000, 0, id)
}

fn pkt_with(len: usize, tos: u8, id: u16) -> (Pkt, PacketMeta) {
    let p = udp4(len, tos, 1000, id);
    let meta = PacketMeta::from_ip(&p);
    (p, meta)
}

fn id(p: &Pkt) -> u16 {
    u16::from_be_bytes([p[22], p[23]])
}

fn offer(
    pl: &mut Pipeline<Pkt>,
    ids: impl IntoIterator<Item = u16>,
    now: u64,
) -> Vec<EnqueueOutcome> {
    ids.into_iter()
        .map(|i| {
            let (p, m) = pkt(i);
            pl.enqueue(p, m, now)
        })
        .collect()
}

/// Polls at every wake-up until idle; returns (release time, packet id).
fn run_to_idle(pl: &mut Pipeline<Pkt>, start: u64) -> Vec<(u64, u16)> {
    let mut out = Vec::new();
    let mut now = start;
    loop {
        let poll = pl.poll(now);
        out.extend(poll.packets.iter().map(|p| (now, id(p))));
        match poll.next_wakeup {
            Some(t) => now = t.max(now),
            None => return out,
        }
    }
}

fn rate(bps: u64) -> pb::LinkParams {
    pb::LinkParams {
        rate_bps: bps,
        ..Default::default()
    }
}

fn with_scheduler(mut p: pb::LinkParams, kind: Kind) -> pb::LinkParams {
    p.scheduler = Some(pb::SchedulerConfig { kind: Some(kind) });
    p
}

fn class_by_port(queue: u32, port: u32) -> pb::ClassRule {
    pb::ClassRule {
        queue,
        dst_port: Some(port),
        ..Default::default()
    }
}

#[test]
fn unlimited_link_passes_packets_straight_through() {
    let mut pl = pipeline(&pb::LinkParams::default());
    assert_eq!(
        pl.poll(0),
        Poll {
            packets: vec![],
            next_wakeup: None
        }
    );
    assert!(
        offer(&mut pl, 0..5, 7)
            .iter()
            .all(|o| *o == EnqueueOutcome::Queued)
    );
    assert_eq!(pl.next_wakeup(), Some(7));
    let poll = pl.poll(7);
    assert_eq!(
        poll.packets.iter().map(id).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    assert_eq!(poll.next_wakeup, None);
    let s = pl.stats();
    assert_eq!(
        (s.enqueued, s.dequeued, s.sent_packets, s.sent_bytes),
        (5, 5, 5, 5000)
    );
    assert_eq!(s.queued, QueueDepth::default());
}

#[test]
fn fcfs_order_and_exact_departures() {
    // 8 Mbit/s: a 1000-byte packet every 1 ms after a one-packet burst.
    let mut pl = pipeline(&rate(8_000_000));
    offer(&mut pl, 0..10, 0);
    // The first packet left (onto the wire) when the second arrived.
    assert_eq!(
        pl.stats().queued,
        QueueDepth {
            packets: 9,
            bytes: 9000
        }
    );
    let out = run_to_idle(&mut pl, 0);
    // The burst is 1500 bytes: the first packet goes at once, the second waits
    // for the 500 missing bytes, the rest 1 ms apart.
    let expected: Vec<(u64, u16)> = (0..10u16)
        .map(|i| {
            (
                if i == 0 {
                    0
                } else {
                    500_000 + (u64::from(i) - 1) * MS
                },
                i,
            )
        })
        .collect();
    assert_eq!(out, expected);
}

#[test]
fn late_polls_keep_the_rate_exact() {
    // The owner's timer fires up to 1 ms late; departures still happen in virtual
    // time, so the long-run rate is the configured one.
    let mut pl = pipeline(&rate(100_000_000)); // 80 µs per packet
    let n = 50_000u16;
    let mut sent = 0usize;
    let mut now = 0;
    let mut next_id = 0u16;
    let mut first_full = None;
    while sent < usize::from(n) {
        // Keep the queue topped up, as a saturating sender would.
        while next_id < n && pl.stats().queued.packets < 500 {
            let (p, m) = pkt(next_id);
            pl.enqueue(p, m, now);
            next_id += 1;
        }
        let poll = pl.poll(now);
        sent += poll.packets.len();
        if first_full.is_none() && sent > 0 {
            first_full = Some((now, sent));
        }
        now = poll.next_wakeup.map_or(now, |t| t.max(now)) + 999_000;
    }
    let (t0, s0) = first_full.expect("sent");
    // Every packet's departure is exact; the last release happened by `now`.
    let achieved = (sent - s0) as f64 * 8000.0 * SEC as f64 / (now - t0) as f64;
    assert!((achieved - 1e8).abs() / 1e8 < 0.03, "{achieved}");
    // And precisely: the shaper's clock says 80 µs per packet.
    assert_eq!(pl.stats().sent_packets, u64::from(n));
}

#[test]
fn rate_is_within_one_percent() {
    let mut pl = pipeline(&rate(10_000_000));
    offer(&mut pl, 0..1000, 0);
    let out = run_to_idle(&mut pl, 0);
    let elapsed = out[999].0 - out[1].0;
    let achieved = 998.0 * 8000.0 * SEC as f64 / elapsed as f64;
    assert!((achieved - 1e7).abs() / 1e7 < 0.01, "{achieved}");
}

#[test]
fn tail_drop_at_the_packet_and_byte_limits() {
    let mut params = rate(8_000);
    params.queue = Some(pb::QueueConfig {
        limit_packets: 5,
        ..Default::default()
    });
    let mut pl = pipeline(&params);
    // The first packet leaves at once (burst); five wait; the rest are dropped.
    let outcomes = offer(&mut pl, 0..10, 0);
    let full = EnqueueOutcome::Dropped(DropCause::QueueFull);
    assert_eq!(outcomes.iter().filter(|o| **o == full).count(), 4);
    assert_eq!(outcomes[9], full);
    assert_eq!(pl.stats().drops.queue_full, 4);
    assert_eq!(pl.stats().queued.packets, 5);

    params.queue = Some(pb::QueueConfig {
        limit_bytes: 2500,
        ..Default::default()
    });
    let mut pl = pipeline(&params);
    let outcomes = offer(&mut pl, 0..5, 0);
    assert_eq!(outcomes.iter().filter(|o| **o == full).count(), 2);
    assert_eq!(pl.stats().queued.bytes, 2000);
}

#[test]
fn ecn_threshold_marks_payload_and_keeps_checksum() {
    let mut params = rate(8_000);
    params.queue = Some(pb::QueueConfig {
        aqm: Some(pb::queue_config::Aqm::Ecn(pb::EcnThreshold {
            threshold_packets: 3,
        })),
        ..Default::default()
    });
    let mut pl = pipeline(&params);
    let mut outcomes = Vec::new();
    for i in 0..8u16 {
        let (p, m) = pkt_with(1000, 0b10, i); // ECT(0)
        outcomes.push(pl.enqueue(p, m, 0));
    }
    let (p, m) = pkt_with(1000, 0, 99); // Not-ECT
    assert_eq!(pl.enqueue(p, m, 0), EnqueueOutcome::Queued);
    // Packet 0 left at once; marks start when more than 3 are queued.
    let marked: Vec<bool> = outcomes
        .iter()
        .map(|o| *o == EnqueueOutcome::Marked)
        .collect();
    assert_eq!(
        marked,
        [false, false, false, false, false, true, true, true]
    );
    assert_eq!(pl.stats().ecn_marked, 3);
    let mut out = Vec::new();
    pl.poll_into(SEC * 100, &mut out);
    assert_eq!(out.len(), 9);
    for p in &out {
        assert_eq!(ipv4_checksum(&p[..20]), 0, "checksum still valid");
        let ce = ecn_field(p) == Some(0b11);
        assert_eq!(ce, (5..8).contains(&id(p)), "packet {}", id(p));
    }
}

#[test]
fn red_drops_and_marks_through_the_pipeline() {
    let red = |ecn| {
        let mut params = rate(8_000);
        params.queue = Some(pb::QueueConfig {
            aqm: Some(pb::queue_config::Aqm::Red(pb::Red {
                min_packets: 5,
                max_packets: 15,
                max_p_ppm: 200_000,
                weight_ppm: 1_000_000,
                ecn,
            })),
            ..Default::default()
        });
        params
    };
    let mut pl = pipeline(&red(false));
    let outcomes = offer(&mut pl, 0..100, 0);
    assert!(outcomes[..6].iter().all(|o| *o == EnqueueOutcome::Queued));
    let s = pl.stats();
    assert!(s.drops.aqm > 80, "{s:?}");
    assert!(s.queued.packets <= 15);
    let mut pl = pipeline(&red(true));
    for i in 0..100u16 {
        let (p, m) = pkt_with(1000, 0b01, i);
        pl.enqueue(p, m, 0);
    }
    let s = pl.stats();
    assert_eq!(s.drops.aqm, 0);
    assert!(s.ecn_marked > 80);
    // Marks accept the packet, so only the hard limit bounds the queue.
    assert_eq!(s.queued.packets, 99);
}

#[test]
fn wrr_shares_a_saturated_link_three_to_one() {
    let mut params = with_scheduler(
        rate(80_000_000),
        Kind::Wrr(pb::Wrr {
            weights: vec![3, 1],
        }),
    );
    params.classes = vec![class_by_port(0, 1)];
    let mut pl = pipeline(&params);
    let mut served = [0usize; 2];
    let mut now = 0;
    for _ in 0..2000 {
        offer(&mut pl, [1, 2], now);
        for p in pl.poll(now).packets {
            served[usize::from(id(&p) != 1)] += 1;
        }
        now += 100_000; // two arrivals per 100 µs, one departure per 100 µs
    }
    let ratio = served[0] as f64 / served[1] as f64;
    assert!((ratio - 3.0).abs() < 0.05, "{served:?}");
}

#[test]
fn drr_is_byte_fair_through_the_pipeline() {
    let mut params = with_scheduler(
        rate(8_000_000),
        Kind::Drr(pb::Drr {
            quantum_bytes: vec![1500],
        }),
    );
    // A single quantum applies to every queue and does not size the scheduler:
    // the classes do.
    params.classes = vec![class_by_port(0, 1), class_by_port(1, 2)];
    params.queue = Some(pb::QueueConfig {
        limit_packets: 100_000,
        ..Default::default()
    });
    let mut pl = pipeline(&params);
    for _ in 0..3000 {
        let (p, m) = pkt_with(1500, 0, 1);
        pl.enqueue(p, m, 0);
    }
    for _ in 0..30_000 {
        let (p, m) = pkt_with(100, 0, 2);
        pl.enqueue(p, m, 0);
    }
    let mut bytes = [0u64; 2];
    for p in pl.poll(2 * SEC).packets {
        bytes[usize::from(id(&p) != 1)] += p.len() as u64;
    }
    let share = bytes[0] as f64 / (bytes[0] + bytes[1]) as f64;
    assert!((share - 0.5).abs() < 0.01, "{bytes:?}");
}

#[test]
fn strict_priority_starves_lower_bands() {
    let mut params = with_scheduler(
        rate(8_000_000),
        Kind::Priority(pb::StrictPriority { bands: 3 }),
    );
    params.classes = vec![class_by_port(0, 0), class_by_port(1, 1)];
    let mut pl = pipeline(&params);
    offer(&mut pl, [2, 2, 1, 1, 0, 0], 0);
    let order: Vec<u16> = run_to_idle(&mut pl, 0)
        .into_iter()
        .map(|(_, i)| i)
        .collect();
    // The first port-2 packet had the link to itself; then strictly by band.
    assert_eq!(order, [2, 0, 0, 1, 1, 2]);
    assert_eq!(pl.stats().per_queue.len(), 3);
}

#[test]
fn delay_is_added_exactly() {
    let mut params = rate(0);
    params.delay_us = 10_000;
    let mut pl = pipeline(&params);
    offer(&mut pl, [1], 5 * MS);
    let poll = pl.poll(5 * MS);
    assert!(poll.packets.is_empty());
    assert_eq!(poll.next_wakeup, Some(15 * MS));
    assert_eq!(pl.stats().in_flight, 1);
    assert!(pl.poll(15 * MS - 1).packets.is_empty());
    assert_eq!(pl.poll(15 * MS).packets.len(), 1);
    assert_eq!(pl.stats().in_flight, 0);
}

#[test]
fn delay_follows_shaping() {
    let mut params = rate(8_000_000);
    params.delay_us = 10_000;
    params.burst_bytes = 1000;
    let mut pl = pipeline(&params);
    offer(&mut pl, 0..3, 0);
    let times: Vec<u64> = run_to_idle(&mut pl, 0)
        .into_iter()
        .map(|(t, _)| t)
        .collect();
    assert_eq!(times, [10 * MS, 11 * MS, 12 * MS]);
}

#[test]
fn jitter_stays_in_bounds_and_fifo() {
    for dist in [0, 1, 2] {
        let mut params = rate(0);
        params.delay_us = 20_000;
        params.jitter_us = 5_000;
        params.jitter_distribution = dist;
        let mut pl = pipeline(&params);
        let mut out = Vec::new();
        for i in 0..2000u16 {
            let now = u64::from(i) * 100_000;
            let (p, m) = pkt(i);
            pl.enqueue(p, m, now);
            let poll = pl.poll(now);
            out.extend(poll.packets.iter().map(|p| (now, id(p))));
        }
        out.extend(
            run_to_idle(&mut pl, 200 * SEC)
                .into_iter()
                .map(|(_, i)| (0, i)),
        );
        let ids: Vec<u16> = out.iter().map(|(_, i)| *i).collect();
        assert_eq!(ids, (0..2000).collect::<Vec<_>>(), "FIFO for {dist}");
        assert_eq!(pl.stats().reordered, 0);
    }
    // Released times stay within delay ± jitter for uniform when nothing queues behind.
    let mut params = rate(0);
    params.delay_us = 20_000;
    params.jitter_us = 5_000;
    let mut pl = pipeline(&params);
    for i in 0..200u64 {
        let start = i * SEC;
        offer(&mut pl, [1], start);
        let out = run_to_idle(&mut pl, start);
        let delay = out[0].0 - start;
        assert!((15 * MS..=25 * MS).contains(&delay), "{delay}");
    }
}

#[test]
fn one_percent_loss_over_100k_packets() {
    let mut params = rate(0);
    params.loss_ppm = 10_000;
    let mut pl = pipeline(&params);
    let mut delivered = 0usize;
    for i in 0..100_000u64 {
        let (p, m) = pkt(0);
        pl.enqueue(p, m, i);
        delivered += pl.poll(i).packets.len();
    }
    let lost = pl.stats().drops.loss;
    assert!((900..=1100).contains(&lost), "{lost}");
    assert_eq!(delivered as u64 + lost, 100_000);
    assert_eq!(pl.stats().dequeued, 100_000);
}

#[test]
fn correlated_loss_makes_longer_bursts_with_the_same_mean() {
    let bursts = |correlation_ppm| {
        let mut params = rate(0);
        params.loss_ppm = 20_000;
        params.loss_correlation_ppm = correlation_ppm;
        let mut pl = pipeline(&params);
        let (mut runs, mut prev_lost) = (0u64, false);
        for i in 0..200_000u64 {
            let (p, m) = pkt(0);
            pl.enqueue(p, m, i);
            let lost = pl.poll(i).packets.is_empty();
            runs += u64::from(lost && !prev_lost);
            prev_lost = lost;
        }
        let lost = pl.stats().drops.loss;
        (lost as f64 / 200_000.0, lost as f64 / runs as f64)
    };
    let (rate0, burst0) = bursts(0);
    let (rate1, burst1) = bursts(800_000);
    assert!(
        (rate0 - 0.02).abs() < 0.002 && (rate1 - 0.02).abs() < 0.002,
        "{rate0} {rate1}"
    );
    assert!(burst1 > 3.0 * burst0, "{burst0} vs {burst1}");
}

#[test]
fn duplicate_reorder_corrupt_counts() {
    let mut params = rate(0);
    params.delay_us = 1_000;
    params.duplicate_ppm = 50_000;
    params.reorder_ppm = 50_000;
    params.corrupt_ppm = 50_000;
    let mut pl = pipeline(&params);
    let n = 20_000u64;
    // Numbered in the IP identification field, which corruption never touches.
    let numbered = |i: u16| {
        let (mut p, m) = pkt(0);
        p[4..6].copy_from_slice(&i.to_be_bytes());
        (p, m)
    };
    let ip_id = |p: &Pkt| u16::from_be_bytes([p[4], p[5]]);
    let mut out = Vec::new();
    for i in 0..n {
        let (p, m) = numbered(i as u16);
        pl.enqueue(p, m, i * 10_000);
        pl.poll_into(i * 10_000, &mut out);
    }
    pl.poll_into(n * 10_000 + SEC, &mut out);
    let s = pl.stats().clone();
    let near = |x: u64, p: f64, of: u64| (x as f64 - p * of as f64).abs() < 0.15 * p * of as f64;
    assert!(near(s.duplicated, 0.05, n), "{s:?}");
    assert!(near(s.reordered, 0.05, n), "{s:?}");
    assert!(near(s.corrupted, 0.05, n + s.duplicated), "{s:?}");
    assert_eq!(out.len() as u64, n + s.duplicated);
    assert_eq!(s.sent_packets, out.len() as u64);
    let damaged = out.iter().filter(|p| **p != numbered(ip_id(p)).0).count();
    assert_eq!(damaged as u64, s.corrupted);
    // A packet 10 µs behind another overtakes it when reordered (1 ms delay).
    let ids: Vec<u16> = out.iter().map(ip_id).collect();
    assert!(ids.windows(2).any(|w| w[1] < w[0]));
}

#[test]
fn reconfigure_keeps_queued_packets_and_tokens() {
    let mut pl = pipeline(&rate(8_000_000)); // 1 ms per packet
    offer(&mut pl, 0..10, 0);
    let first = pl.poll(2 * MS);
    assert_eq!(first.packets.len(), 3);
    // Ten times faster from 2 ms on.
    pl.reconfigure_at(&rate(80_000_000), 2 * MS).expect("valid");
    assert_eq!(pl.stats().queued.packets, 7);
    let rest = run_to_idle(&mut pl, 2 * MS);
    let ids: Vec<u16> = rest.iter().map(|(_, i)| *i).collect();
    assert_eq!(ids, (3..10).collect::<Vec<_>>());
    // Packet 3 was due at 2.5 ms at the old rate; tokens since 2 ms come ten times
    // faster, so it leaves at 2.05 ms, then every 100 µs.
    assert_eq!(rest[0].0, 2 * MS + 50_000);
    assert_eq!(rest[6].0, 2 * MS + 650_000);
}

#[test]
fn reconfigure_changes_scheduler_and_merges_queues() {
    let mut params = with_scheduler(rate(8_000), Kind::Priority(pb::StrictPriority { bands: 3 }));
    params.classes = vec![class_by_port(0, 0), class_by_port(1, 1)];
    let mut pl = pipeline(&params);
    offer(&mut pl, [0, 2, 1, 2, 1, 0], 0);
    assert_eq!(pl.stats().queued.packets, 5);
    // Back to one FCFS queue: everything queued survives, in arrival order.
    pl.reconfigure(&rate(0)).expect("valid");
    assert_eq!(pl.queue_count(), 1);
    assert_eq!(
        pl.stats().per_queue,
        [QueueDepth {
            packets: 5,
            bytes: 5000
        }]
    );
    // Packet 0 was already on the wire; the rest follow in arrival order.
    let ids: Vec<u16> = pl.poll(0).packets.iter().map(id).collect();
    assert_eq!(ids, [0, 2, 1, 2, 1, 0]);
}

#[test]
fn reconfigure_rejects_bad_params_without_change() {
    let mut pl = pipeline(&rate(8_000));
    offer(&mut pl, 0..3, 0);
    let mut bad = rate(1);
    bad.loss_ppm = 2_000_000;
    let err = pl.reconfigure(&bad).expect_err("invalid");
    assert_eq!(err.field, "loss_ppm");
    // Still 8 kbit/s: the burst, then one packet 0.5 s later.
    assert_eq!(pl.poll(SEC).packets.len(), 2);
}

#[test]
fn reconfigured_delay_keeps_packets_in_flight_in_order() {
    let mut params = rate(0);
    params.delay_us = 50_000;
    let mut pl = pipeline(&params);
    offer(&mut pl, [1], 0);
    pl.poll(0);
    params.delay_us = 1_000;
    pl.reconfigure_at(&params, MS).expect("valid");
    offer(&mut pl, [2], MS);
    let out = run_to_idle(&mut pl, MS);
    assert_eq!(out, [(50 * MS, 1), (50 * MS, 2)]);
    assert_eq!(pl.stats().reordered, 0);
}

#[test]
fn seeds_make_runs_reproducible() {
    let run = |seed| {
        let mut params = rate(0);
        params.loss_ppm = 100_000;
        let mut pl: Pipeline<Pkt> = Pipeline::new(&params, 1500, seed).expect("valid");
        (0..1000u16)
            .map(|i| {
                let (p, m) = pkt(i);
                pl.enqueue(p, m, 0);
                pl.poll(0).packets.len()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}

#[test]
fn custom_parts_and_misbehaving_schemes_are_contained() {
    struct Nonsense;
    impl Classifier for Nonsense {
        fn classify(&mut self, _: &PacketMeta) -> usize {
            usize::MAX
        }
    }
    impl Scheduler for Nonsense {
        fn select(&mut self, _: &[QueueState]) -> Option<usize> {
            Some(17)
        }
    }
    let mut parts = Parts::from_params(&rate(8_000), 1500).expect("valid");
    parts.classifier = Box::new(Nonsense);
    parts.scheduler = Box::new(Nonsense);
    parts.aqms = vec![Box::new(aqm::TailDrop), Box::new(aqm::TailDrop)];
    let mut pl: Pipeline<Pkt> = Pipeline::with_parts(parts, 0).expect("valid");
    offer(&mut pl, 0..3, 0);
    // The first packet left at once; the others wait in the last queue.
    assert_eq!(pl.stats().per_queue[1].packets, 2);
    assert_eq!(pl.poll(10 * SEC).packets.len(), 3);

    let mut parts = Parts::from_params(&pb::LinkParams::default(), 1500).expect("valid");
    parts.aqms.clear();
    assert_eq!(
        Pipeline::<Pkt>::with_parts(parts, 0)
            .expect_err("no queues")
            .field,
        "aqms"
    );
}

#[test]
fn works_with_bytes_payloads() {
    let mut params = rate(8_000);
    params.queue = Some(pb::QueueConfig {
        aqm: Some(pb::queue_config::Aqm::Ecn(pb::EcnThreshold {
            threshold_packets: 1,
        })),
        ..Default::default()
    });
    let mut pl: Pipeline<bytes::Bytes> = Pipeline::new(&params, 1500, 0).expect("valid");
    for i in 0..4 {
        let (p, m) = pkt_with(1000, 0b10, i);
        pl.enqueue(bytes::Bytes::from(p), m, 0);
    }
    assert_eq!(pl.stats().ecn_marked, 1);
    let out = pl.poll(10 * SEC).packets;
    assert_eq!(out.iter().filter(|p| ecn_field(p) == Some(0b11)).count(), 1);
}

#[test]
fn packets_handed_out_late_are_counted_for_the_fidelity_guard() {
    let mut pl = pipeline(&pb::LinkParams {
        delay_us: 2_000,
        ..Default::default()
    });
    offer(&mut pl, [1, 2], 0);
    // Polled on time: nothing is late.
    let on_time = run_to_idle(&mut pl, 0);
    assert_eq!(on_time.len(), 2);
    assert_eq!(pl.stats().late, 0);
    assert_eq!(pl.take_max_lateness(), 0);
    // The owner comes back 5 ms after the release instant (it had no CPU).
    offer(&mut pl, [3], 10 * MS);
    let late = pl.poll(17 * MS);
    assert_eq!(late.packets.len(), 1);
    assert_eq!(pl.stats().late, 1);
    assert_eq!(pl.take_max_lateness(), 5 * MS);
    // A new window starts clean; lateness within the bound is not counted.
    assert_eq!(pl.take_max_lateness(), 0);
    offer(&mut pl, [4], 20 * MS);
    pl.poll(22 * MS + LATE_BOUND_NS);
    assert_eq!(pl.stats().late, 1);
    assert_eq!(pl.take_max_lateness(), LATE_BOUND_NS);
}

#[test]
fn time_behind_schedule_counts_a_stall_once_however_many_packets_it_caught() {
    let mut pl = pipeline(&pb::LinkParams {
        delay_us: 2_000,
        ..Default::default()
    });
    assert_eq!(pl.stats().behind_ns, 0);
    // Three packets released at 2, 3 and 4 ms, all handed out at 10 ms: the
    // link was behind from 2 ms to 10 ms, not 8 + 7 + 6 ms.
    offer(&mut pl, [1], 0);
    offer(&mut pl, [2], MS);
    offer(&mut pl, [3], 2 * MS);
    assert_eq!(pl.poll(10 * MS).packets.len(), 3);
    assert_eq!(pl.stats().late, 3);
    assert_eq!(pl.stats().behind_ns, 8 * MS);
    // A second stall later adds its own length.
    offer(&mut pl, [4], 20 * MS);
    assert_eq!(pl.poll(25 * MS).packets.len(), 1);
    assert_eq!(pl.stats().behind_ns, 8 * MS + 3 * MS);
    // On time adds nothing.
    offer(&mut pl, [5], 30 * MS);
    assert_eq!(pl.poll(32 * MS).packets.len(), 1);
    assert_eq!(pl.stats().behind_ns, 11 * MS);
}

/// One simulated run of a link task over a backlogged link: 1400-byte packets
/// offered every 40 µs (280 Mbit/s) while `count` last, the task polling at
/// every wake-up it is given with `slack`. Returns (release time, id, bytes)
/// and the number of timer wake-ups (polls not caused by an arrival).
fn release_run(
    params: &pb::LinkParams,
    slack: ReleaseSlack,
    count: u16,
) -> (Vec<(u64, u16, usize)>, usize) {
    const GAP: u64 = 40_000;
    let mut pl = pipeline(params);
    let mut out = Vec::new();
    let mut ready = Vec::new();
    let (mut next_id, mut wakeup, mut polls) = (0u16, None::<u64>, 0);
    loop {
        let arrival = (next_id < count).then(|| u64::from(next_id) * GAP);
        let now = match (arrival, wakeup) {
            (Some(a), Some(w)) => a.min(w),
            (Some(a), None) => a,
            (None, Some(w)) => w,
            (None, None) => return (out, polls),
        };
        if arrival == Some(now) {
            let (p, m) = pkt_with(1400, 0, next_id);
            assert_eq!(pl.enqueue(p, m, now), EnqueueOutcome::Queued);
            next_id += 1;
        } else {
            polls += 1;
        }
        wakeup = pl.poll_with_slack(now, slack, &mut ready);
        out.extend(ready.drain(..).map(|p| (now, id(&p), p.len())));
    }
}

#[test]
fn release_slack_hands_packets_out_early_by_at_most_the_slack_and_never_late() {
    let rate_bps = 200_000_000;
    for (delay_ms, jitter_ms) in [(0, 0), (5, 0), (5, 1)] {
        let params = pb::LinkParams {
            rate_bps,
            delay_us: delay_ms * 1000,
            jitter_us: jitter_ms * 1000,
            queue: Some(pb::QueueConfig {
                limit_packets: 100_000,
                ..Default::default()
            }),
            ..Default::default()
        };
        let count = 30_000;
        // The reference: every packet handed out at its exact instant.
        let (exact, exact_polls) = release_run(&params, ReleaseSlack::NONE, count);
        let (slack, slack_polls) = release_run(&params, RELEASE_SLACK, count);
        assert_eq!(exact.len(), usize::from(count));
        assert_eq!(slack.len(), exact.len(), "every packet handed out");
        let mut due = vec![0u64; usize::from(count)];
        for &(t, i, _) in &exact {
            due[usize::from(i)] = t;
        }
        for &(t, i, _) in &slack {
            let due = due[usize::from(i)];
            assert!(t <= due, "packet {i} handed out {} ns late", t - due);
            assert!(
                due - t <= RELEASE_SLACK.ahead_ns,
                "packet {i} handed out {} ns early",
                due - t
            );
        }
        // Order is kept: the wire's order, early or not.
        let order = |run: &[(u64, u16, usize)]| run.iter().map(|r| r.1).collect::<Vec<_>>();
        assert_eq!(order(&slack), order(&exact));
        // Throughput over a second of a backlogged link: the rate within 1%.
        let start = slack[0].0;
        let bytes: usize = slack
            .iter()
            .filter(|r| r.0 >= start && r.0 < start + SEC)
            .map(|r| r.2)
            .sum();
        let measured = bytes as f64 * 8.0;
        assert!(
            (measured - rate_bps as f64).abs() <= 0.01 * rate_bps as f64,
            "delay {delay_ms} ms, jitter {jitter_ms} ms: {measured:.0} bit/s over a second"
        );
        // The point: far fewer wake-ups than packets. Only a wake-up for a due
        // packet takes others along (a lone packet is never early), so with
        // jitter it is about 3.9 times fewer, not more.
        assert!(
            slack_polls * 3 < exact_polls,
            "delay {delay_ms} ms, jitter {jitter_ms} ms: {slack_polls} polls with slack, {exact_polls} without"
        );
    }
}

#[test]
fn a_lone_packet_is_never_handed_out_early() {
    // A ping on a 1 ms link, polled right after it was offered: the slack
    // must not cut its delay.
    let mut pl = pipeline(&pb::LinkParams {
        delay_us: 1_000,
        ..Default::default()
    });
    let mut out = Vec::new();
    offer(&mut pl, [1], 0);
    let next = pl.poll_with_slack(0, RELEASE_SLACK, &mut out);
    assert!(out.is_empty(), "handed out {} ms early", 1);
    assert_eq!(next, Some(MS));
    pl.poll_with_slack(MS, RELEASE_SLACK, &mut out);
    assert_eq!(out.len(), 1);
}

#[test]
fn a_trace_link_releases_at_its_opportunities_and_a_new_trace_starts_when_applied() {
    // One 1,500-byte opportunity every ms: 1,000-byte packets leave two for
    // every three opportunities, each as its last byte is carried.
    let trace = pb::LinkParams {
        trace_ms: (1..=10).collect(),
        ..Default::default()
    };
    let mut pl = pipeline(&trace);
    assert!(
        !LinkConfig::from_params(&trace, 1500)
            .expect("valid")
            .passes_aggregates(),
        "a trace link must see packets one by one"
    );
    offer(&mut pl, 0..9, 0);
    let times = |out: Vec<(u64, u16)>| out.iter().map(|(t, _)| *t / MS).collect::<Vec<_>>();
    let micros = |out: Vec<(u64, u16)>| out.iter().map(|(t, _)| *t / 1000).collect::<Vec<_>>();
    assert_eq!(times(run_to_idle(&mut pl, 0)), [1, 2, 2, 3, 4, 4, 5, 6, 6]);
    // A new trace applied at 20 ms starts there: its opportunities are 25, 30 ms.
    pl.reconfigure_at(
        &pb::LinkParams {
            trace_ms: vec![5, 10],
            ..Default::default()
        },
        20 * MS,
    )
    .expect("valid");
    offer(&mut pl, [20, 21], 20 * MS);
    assert_eq!(times(run_to_idle(&mut pl, 20 * MS)), [25, 30]);
    // Back to a rate: a full one-packet bucket, then 1 byte/µs.
    pl.reconfigure_at(&rate(8_000_000), 40 * MS).expect("valid");
    offer(&mut pl, [40, 41], 40 * MS);
    assert_eq!(micros(run_to_idle(&mut pl, 40 * MS)), [40_000, 40_500]);
}

#[test]
fn a_trace_with_a_rate_or_out_of_order_is_refused_with_the_field() {
    let err = |p: pb::LinkParams| {
        LinkConfig::from_params(&p, 1500)
            .expect_err("invalid")
            .to_string()
    };
    let both = pb::LinkParams {
        rate_bps: 1_000_000,
        trace_ms: vec![1],
        ..Default::default()
    };
    assert!(err(both).starts_with("trace_ms: a trace replaces the token bucket"));
    let backwards = pb::LinkParams {
        trace_ms: vec![3, 2],
        ..Default::default()
    };
    assert_eq!(
        err(backwards),
        "trace_ms: entry 1 (2 ms) is before the one above it (3 ms): offsets must not decrease"
    );
}

/// (port, verdict, enqueued, departed, delivered, depth in packets).
type Seen = (u16, TapVerdict, u64, Option<u64>, Option<u64>, u32);

/// Keeps every record a pipeline's tap gets, up to `limit`.
#[derive(Clone, Default)]
struct Recorder {
    seen: std::sync::Arc<std::sync::Mutex<Vec<Seen>>>,
    limit: usize,
}

impl Tap for Recorder {
    fn record(&mut self, bytes: &[u8], r: &PacketFate) -> bool {
        let mut seen = self.seen.lock().expect("not poisoned");
        let port = u16::from_be_bytes([bytes[22], bytes[23]]);
        seen.push((
            port,
            r.verdict,
            r.enqueued_ns,
            r.departed_ns,
            r.delivered_ns,
            r.depth_packets,
        ));
        seen.len() < self.limit
    }
}

#[test]
fn a_tap_sees_each_packets_times_depth_and_fate() {
    // 8 kbit/s: a 1000-byte packet takes 1 s; 5 ms delay; ECN marks above 2
    // queued, the queue holds 4.
    let mut params = rate(8_000);
    params.delay_us = 5_000;
    params.queue = Some(pb::QueueConfig {
        limit_packets: 4,
        aqm: Some(pb::queue_config::Aqm::Ecn(pb::EcnThreshold {
            threshold_packets: 2,
        })),
        ..Default::default()
    });
    let mut pl = pipeline(&params);
    let recorder = Recorder {
        limit: 100,
        ..Recorder::default()
    };
    pl.set_tap(Some(Box::new(recorder.clone())));
    for i in 0..7u16 {
        let (p, m) = pkt_with(1000, 0b10, i);
        pl.enqueue(p, m, 0);
    }
    run_to_idle(&mut pl, 0);
    let mut seen = recorder.seen.lock().expect("not poisoned").clone();
    seen.sort_by_key(|s| s.0);
    let sent = |marked| TapVerdict::Sent {
        ecn_marked: marked,
        corrupted: false,
        copies: 1,
    };
    let full = TapVerdict::Dropped(DropCause::QueueFull);
    // Packet 0 leaves at once and the default burst (half a second at this
    // rate) lets 1 follow it at 0.5 s; 2-4 wait behind them, 1 s each. Marks
    // come above 2 queued (4 found 3); 5 and 6 find the queue full.
    let half = SEC / 2;
    let expected = [
        (0, sent(false), 0, Some(0), Some(5 * MS), 0),
        (1, sent(false), 0, Some(half), Some(half + 5 * MS), 0),
        (
            2,
            sent(false),
            0,
            Some(half + SEC),
            Some(half + SEC + 5 * MS),
            1,
        ),
        (
            3,
            sent(false),
            0,
            Some(half + 2 * SEC),
            Some(half + 2 * SEC + 5 * MS),
            2,
        ),
        (
            4,
            sent(true),
            0,
            Some(half + 3 * SEC),
            Some(half + 3 * SEC + 5 * MS),
            3,
        ),
        (5, full, 0, None, None, 4),
        (6, full, 0, None, None, 4),
    ];
    assert_eq!(seen, expected);
}

#[test]
fn a_tap_that_has_enough_is_detached_and_losses_are_told() {
    let mut params = rate(0);
    params.loss_ppm = 1_000_000;
    let mut pl = pipeline(&params);
    let recorder = Recorder {
        limit: 3,
        ..Recorder::default()
    };
    pl.set_tap(Some(Box::new(recorder.clone())));
    offer(&mut pl, 0..10, 0);
    run_to_idle(&mut pl, 0);
    assert!(!pl.tapped());
    let seen = recorder.seen.lock().expect("not poisoned").clone();
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter()
            .all(|s| s.1 == TapVerdict::Dropped(DropCause::Loss) && s.4.is_none())
    );
}
