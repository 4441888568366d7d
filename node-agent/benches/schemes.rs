//! Enqueue + dequeue throughput of the link pipeline per scheme, in packets per
//! second (criterion's "elem/s"; a plain Mpps table is printed first).
//!
//! `cargo bench -p nextmini-agent --bench schemes -- --quick`

use bytes::Bytes;
use criterion::{BatchSize, Criterion, Throughput, criterion_group};
use nextmini_agent::sched::{PacketMeta, Pipeline};
use nextmini_proto::v1 as pb;
use pb::scheduler_config::Kind;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Packets offered between two polls, as an actor draining its channel would.
const BATCH: usize = 256;
const PORTS: [u16; 4] = [5001, 5002, 5003, 5004];

/// A 64-byte IPv4/UDP packet to `dst_port`, ECN-capable so AQMs may mark it.
fn packet(dst_port: u16) -> Bytes {
    let mut p = vec![0u8; 64];
    p[0] = 0x45;
    p[1] = 0b10;
    p[2..4].copy_from_slice(&64u16.to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&[198, 18, 0, 1]);
    p[16..20].copy_from_slice(&[198, 18, 0, 2]);
    p[20..22].copy_from_slice(&40_000u16.to_be_bytes());
    p[22..24].copy_from_slice(&dst_port.to_be_bytes());
    Bytes::from(p)
}

fn four_classes(mut params: pb::LinkParams, kind: Kind) -> pb::LinkParams {
    params.scheduler = Some(pb::SchedulerConfig { kind: Some(kind) });
    params.classes = PORTS
        .iter()
        .enumerate()
        .map(|(i, &port)| pb::ClassRule {
            queue: i as u32,
            dst_port: Some(u32::from(port)),
            ..Default::default()
        })
        .collect();
    params
}

/// 64-byte packets at 512 Gbit/s: one per nanosecond. A batch offered at one
/// instant queues up behind the first packet and drains over the next `BATCH` ns,
/// so the scheduler and the AQM decide over real backlogs, not empty queues.
const BACKLOGGED: pb::LinkParams = pb::LinkParams {
    rate_bps: 512_000_000_000,
    burst_bytes: 64,
    delay_us: 0,
    jitter_us: 0,
    loss_ppm: 0,
    queue_packets: 0,
    jitter_distribution: 0,
    loss_correlation_ppm: 0,
    reorder_ppm: 0,
    duplicate_ppm: 0,
    corrupt_ppm: 0,
    queue: None,
    scheduler: None,
    classes: Vec::new(),
    trace_ms: Vec::new(),
};

fn schemes() -> Vec<(&'static str, pb::LinkParams)> {
    let red = pb::LinkParams {
        queue: Some(pb::QueueConfig {
            aqm: Some(pb::queue_config::Aqm::Red(pb::Red {
                // Backlogs of 0..BATCH keep the average between the thresholds, so
                // packets take the random-drop path.
                min_packets: 32,
                max_packets: 1000,
                max_p_ppm: 100_000,
                weight_ppm: 2000,
                ecn: false,
            })),
            ..Default::default()
        }),
        ..BACKLOGGED
    };
    vec![
        ("fcfs", BACKLOGGED),
        (
            "wrr",
            four_classes(
                BACKLOGGED,
                Kind::Wrr(pb::Wrr {
                    weights: vec![4, 3, 2, 1],
                }),
            ),
        ),
        (
            "drr",
            four_classes(
                BACKLOGGED,
                Kind::Drr(pb::Drr {
                    quantum_bytes: vec![1500],
                }),
            ),
        ),
        (
            "priority",
            four_classes(BACKLOGGED, Kind::Priority(pb::StrictPriority { bands: 4 })),
        ),
        ("red", red),
        // A bucket that never runs dry: packets pass on arrival, through the
        // token arithmetic.
        (
            "token_bucket",
            pb::LinkParams {
                rate_bps: 1_000_000_000_000_000,
                burst_bytes: 1_000_000_000,
                ..Default::default()
            },
        ),
        ("unlimited", pb::LinkParams::default()),
    ]
}

struct Bench {
    pipeline: Pipeline<Bytes>,
    packets: Vec<(Bytes, PacketMeta)>,
    out: Vec<Bytes>,
    now: u64,
}

impl Bench {
    fn new(params: &pb::LinkParams) -> Bench {
        let packets = (0..BATCH)
            .map(|i| {
                let p = packet(PORTS[i % PORTS.len()]);
                let meta = PacketMeta::from_ip(&p);
                (p, meta)
            })
            .collect();
        Bench {
            pipeline: Pipeline::new(params, 1500, 7).expect("valid scheme parameters"),
            packets,
            out: Vec::with_capacity(BATCH),
            now: 0,
        }
    }

    /// One batch in at once, then everything out once due: `BATCH` packets of work.
    fn round(&mut self) {
        self.now += 10 * BATCH as u64;
        for (p, meta) in &self.packets {
            black_box(self.pipeline.enqueue(p.clone(), *meta, self.now));
        }
        black_box(
            self.pipeline
                .poll_into(self.now + BATCH as u64, &mut self.out),
        );
        self.out.clear();
    }
}

fn throughput(c: &mut Criterion) {
    let mut group = c.benchmark_group("enqueue_dequeue");
    group.throughput(Throughput::Elements(BATCH as u64));
    for (name, params) in schemes() {
        let mut bench = Bench::new(&params);
        group.bench_function(name, |b| b.iter(|| bench.round()));
    }
    group.finish();

    let raw: Vec<u8> = packet(5001).to_vec();
    let mut parse = c.benchmark_group("parse");
    parse.throughput(Throughput::Elements(1));
    parse.bench_function("PacketMeta::from_ip", |b| {
        b.iter_batched_ref(
            || raw.clone(),
            |p| PacketMeta::from_ip(black_box(p)),
            BatchSize::SmallInput,
        )
    });
    parse.finish();
}

/// A plain table in Mpps, so the figures need no conversion.
fn print_mpps() {
    println!("{:<14} {:>8}", "scheme", "Mpps");
    for (name, params) in schemes() {
        let mut bench = Bench::new(&params);
        for _ in 0..1000 {
            bench.round();
        }
        let start = Instant::now();
        let mut rounds = 0u64;
        while start.elapsed() < Duration::from_millis(500) {
            for _ in 0..100 {
                bench.round();
            }
            rounds += 100;
        }
        let mpps = (rounds * BATCH as u64) as f64 / start.elapsed().as_secs_f64() / 1e6;
        let s = bench.pipeline.stats();
        println!(
            "{name:<14} {mpps:>8.2}   (sent {}, aqm drops {}, left queued {})",
            s.sent_packets, s.drops.aqm, s.queued.packets
        );
    }
}

criterion_group!(benches, throughput);

fn main() {
    // Only under `cargo bench`, not when `cargo test --benches` smoke-runs this.
    if std::env::args().any(|a| a == "--bench") {
        print_mpps();
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
