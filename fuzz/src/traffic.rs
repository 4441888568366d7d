//! Runs a link-emulation pipeline the way a link task does (enqueue packets as
//! they arrive, poll at every wake-up, reconfigure in place), with a fake clock,
//! and checks its books after every step.

use crate::Rng;
use crate::packets::{self, V4};
use bytes::Bytes;
use nextmini_agent::link::Outbound;
use nextmini_agent::sched::{DropCause, EnqueueOutcome, PacketMeta, Pipeline};
use nextmini_proto::v1 as pb;

/// Values worth sending to hit a link's class rules: without them random
/// packets would almost never match a port or DSCP rule.
#[derive(Debug, Clone, Default)]
pub struct Hints {
    pub ports: Vec<u16>,
    pub dscps: Vec<u8>,
    pub protocols: Vec<u8>,
    pub sizes: Vec<usize>,
}

impl Hints {
    pub fn from_params(params: &pb::LinkParams) -> Hints {
        let mut h = Hints::default();
        for c in &params.classes {
            h.ports.extend(
                [c.src_port, c.dst_port]
                    .into_iter()
                    .flatten()
                    .map(|p| p as u16),
            );
            h.dscps.extend(c.dscp.map(|d| d as u8));
            h.protocols.extend(c.protocol.map(|p| p as u8));
            if let Some(max) = c.max_packet_bytes {
                let max = max as usize;
                h.sizes.extend([max.saturating_sub(1), max, max + 1]);
            }
        }
        h
    }
}

/// A packet as it reaches a link: mostly real IPv4/IPv6 TCP, UDP, ICMP, SCTP
/// or GRE packets, sometimes arbitrary bytes (a peer may forward anything).
pub fn packet(rng: &mut Rng, hints: &Hints) -> Vec<u8> {
    let kind = rng.below(10);
    if kind == 0 {
        let len = rng.below(64) as usize;
        return (0..len).map(|_| rng.next_u64() as u8).collect();
    }
    let protocol = match rng.pick(&hints.protocols) {
        Some(&p) if rng.chance(2, 3) => p,
        _ => *rng
            .pick(&[
                packets::PROTO_TCP,
                packets::PROTO_UDP,
                packets::PROTO_ICMP,
                packets::PROTO_SCTP,
                packets::PROTO_GRE,
            ])
            .unwrap_or(&packets::PROTO_UDP),
    };
    let port = |rng: &mut Rng| match rng.pick(&hints.ports) {
        Some(&p) if rng.chance(1, 2) => p,
        _ => *rng.pick(&[80, 443, 53, 5201, 61000]).unwrap_or(&80),
    };
    let (src, dst) = (port(rng), port(rng));
    let dscp = match rng.pick(&hints.dscps) {
        Some(&d) if rng.chance(2, 3) => d,
        _ => (rng.below(64)) as u8,
    };
    let tos = (dscp << 2) | rng.below(4) as u8;
    let size = match rng.pick(&hints.sizes) {
        Some(&s) if rng.chance(1, 2) => s,
        _ => match rng.below(40) {
            0 => rng.below(65_000) as usize,
            1..=8 => 1400,
            _ => rng.below(1500) as usize,
        },
    };
    // Payload such that the whole packet is about `size` bytes.
    let payload = vec![0x5a; size.saturating_sub(48).min(65_000)];
    let v6 = kind == 1 || kind == 2;
    let transport = match protocol {
        packets::PROTO_TCP => packets::tcp(src, dst, &payload),
        packets::PROTO_UDP => packets::udp(src, dst, &payload),
        packets::PROTO_ICMP | packets::PROTO_ICMPV6 => {
            // Checksum over the header only: nothing here checks it, and summing
            // 64 KB per packet would dominate the run.
            let msg_type = if v6 { 128 } else { 8 };
            let mut t = packets::icmp(msg_type, src, dst, &[]);
            t.extend_from_slice(&payload);
            t
        }
        packets::PROTO_SCTP => packets::sctp(src, dst, &payload),
        _ => payload,
    };
    if v6 {
        let protocol = if protocol == packets::PROTO_ICMP {
            packets::PROTO_ICMPV6
        } else {
            protocol
        };
        packets::ipv6(tos, &[], protocol, &transport)
    } else {
        packets::ipv4(
            V4 {
                tos,
                ..V4::new(protocol)
            },
            &transport,
        )
    }
}

/// A pipeline under test with everything the driver counted itself.
pub struct Driver {
    pub pipeline: Pipeline<Outbound>,
    now: u64,
    next_wakeup: Option<u64>,
    offered: u64,
    queued: u64,
    marked: u64,
    dropped_full: u64,
    dropped_aqm: u64,
    released: u64,
    released_bytes: u64,
    polls: u32,
}

/// Polls per driver at most, so an input cannot make a run slow.
const MAX_POLLS: u32 = 2_000;
/// The fake clock never passes this (146 years of agent uptime): a link task's
/// clock counts nanoseconds since the link started, so later instants never come.
pub const HORIZON: u64 = 1 << 62;

impl Driver {
    pub fn new(pipeline: Pipeline<Outbound>) -> Driver {
        Driver {
            pipeline,
            now: 0,
            next_wakeup: None,
            offered: 0,
            queued: 0,
            marked: 0,
            dropped_full: 0,
            dropped_aqm: 0,
            released: 0,
            released_bytes: 0,
            polls: 0,
        }
    }

    pub fn now(&self) -> u64 {
        self.now
    }

    /// A packet arrives now; the link task polls right after.
    pub fn enqueue(&mut self, data: Vec<u8>) {
        let meta = PacketMeta::from_ip(&data);
        assert_eq!(meta.len as usize, data.len());
        let packet = Outbound {
            data: Bytes::from(data),
            label: 0,
            hops: 0,
            offload: Default::default(),
        };
        self.offered += 1;
        match self.pipeline.enqueue(packet, meta, self.now) {
            EnqueueOutcome::Queued => self.queued += 1,
            EnqueueOutcome::Marked => self.marked += 1,
            EnqueueOutcome::Dropped(DropCause::QueueFull) => self.dropped_full += 1,
            EnqueueOutcome::Dropped(DropCause::Aqm) => self.dropped_aqm += 1,
            EnqueueOutcome::Dropped(DropCause::Loss) => {
                panic!("loss is decided at departure, never at enqueue")
            }
        }
        self.check();
        self.poll();
    }

    /// Lets `gap` nanoseconds pass, polling at every wake-up in between.
    pub fn wait(&mut self, gap: u64) {
        let until = self.now.saturating_add(gap).min(HORIZON);
        while let Some(t) = self.next_wakeup {
            if t > until || self.polls >= MAX_POLLS {
                break;
            }
            self.now = self.now.max(t);
            self.poll();
        }
        self.now = until;
        self.poll();
    }

    /// Polls at every wake-up until nothing is pending (or the poll budget is spent).
    pub fn drain(&mut self) {
        while let Some(t) = self.next_wakeup {
            if t > HORIZON || self.polls >= MAX_POLLS {
                break;
            }
            self.now = self.now.max(t);
            self.poll();
        }
    }

    /// New parameters in place, as `LinkHandle::set_params` makes the task do.
    pub fn reconfigure(&mut self, params: &pb::LinkParams) {
        let before = self.pipeline.stats().clone();
        match self.pipeline.reconfigure_at(params, self.now) {
            Ok(()) => {
                let after = self.pipeline.stats();
                // Nothing queued or in flight is lost by a reconfiguration.
                assert_eq!(before.queued.packets, after.queued.packets);
                assert_eq!(before.in_flight, after.in_flight);
            }
            Err(_) => assert_eq!(
                &before,
                self.pipeline.stats(),
                "a failed change changes nothing"
            ),
        }
        self.check();
        self.poll();
    }

    fn poll(&mut self) {
        self.polls += 1;
        let out = self.pipeline.poll(self.now);
        self.released += out.packets.len() as u64;
        self.released_bytes += out.packets.iter().map(|p| p.data.len() as u64).sum::<u64>();
        if let Some(t) = out.next_wakeup {
            assert!(
                t > self.now,
                "wake-up {t} is not after the poll at {}: the link task would spin",
                self.now
            );
        }
        self.next_wakeup = out.next_wakeup;
        self.check();
        let s = self.pipeline.stats();
        assert_eq!(
            self.next_wakeup.is_some(),
            s.queued.packets > 0 || s.in_flight > 0,
            "a wake-up exactly when something is pending: {s:?}"
        );
    }

    /// The pipeline's counters agree with each other and with what was seen.
    fn check(&self) {
        let s = self.pipeline.stats();
        assert_eq!(s.enqueued, self.queued + self.marked, "{s:?}");
        assert_eq!(s.ecn_marked, self.marked, "{s:?}");
        assert_eq!(s.drops.queue_full, self.dropped_full, "{s:?}");
        assert_eq!(s.drops.aqm, self.dropped_aqm, "{s:?}");
        assert_eq!(
            self.offered,
            s.enqueued + s.drops.queue_full + s.drops.aqm,
            "{s:?}"
        );
        assert_eq!(s.enqueued, s.dequeued + s.queued.packets, "{s:?}");
        assert_eq!(
            s.dequeued - s.drops.loss + s.duplicated,
            s.sent_packets + s.in_flight,
            "every departure is lost, or on the wire, or sent: {s:?}"
        );
        assert_eq!(s.sent_packets, self.released, "{s:?}");
        assert_eq!(s.sent_bytes, self.released_bytes, "{s:?}");
        assert_eq!(s.per_queue.len(), self.pipeline.queue_count(), "{s:?}");
        assert_eq!(
            s.per_queue.iter().map(|q| q.packets).sum::<u64>(),
            s.queued.packets,
            "{s:?}"
        );
        assert_eq!(
            s.per_queue.iter().map(|q| q.bytes).sum::<u64>(),
            s.queued.bytes,
            "{s:?}"
        );
    }
}

/// A short run: `packets` arrivals at random gaps, reconfigured to each of
/// `changes` in turn part-way through, then drained.
pub fn run(
    pipeline: Pipeline<Outbound>,
    params: &pb::LinkParams,
    changes: &[&pb::LinkParams],
    packets: usize,
    rng: &mut Rng,
) {
    let mut driver = Driver::new(pipeline);
    let mut hints = Hints::from_params(params);
    let mut changes = changes.iter();
    for i in 0..packets {
        if i > 0
            && i % 16 == 0
            && let Some(next) = changes.next()
        {
            driver.reconfigure(next);
            let more = Hints::from_params(next);
            hints.ports.extend(more.ports);
            hints.dscps.extend(more.dscps);
            hints.protocols.extend(more.protocols);
            hints.sizes.extend(more.sizes);
        }
        let most = if rng.chance(1, 4) { 32 } else { 3 };
        let burst = 1 + rng.below(most);
        for _ in 0..burst {
            driver.enqueue(packet(rng, &hints));
        }
        let gap = match rng.below(16) {
            0 => 0,
            1 => rng.below(1_000_000_000),
            2 => rng.next_u64() >> rng.below(64),
            _ => rng.below(2_000_000),
        };
        driver.wait(gap);
    }
    driver.drain();
}
