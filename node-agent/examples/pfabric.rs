//! A pFabric-like scheduler written outside the core, against the public scheme
//! traits only, and plugged into a link pipeline with `Pipeline::with_parts`.
//!
//! pFabric (Alizadeh et al., SIGCOMM 2013) serves, at every port, the packet of
//! the flow with the least data left to send: shortest remaining processing time,
//! which minimises mean flow completion time. Hosts stamp the remaining size into
//! each packet; here the flow sizes are known up front and the scheduler counts
//! what each flow has sent, which is the same number.
//!
//! Run: `cargo run -p nextmini-agent --example pfabric`
//! Test: `cargo test -p nextmini-agent --example pfabric`

use nextmini_agent::sched::aqm::TailDrop;
use nextmini_agent::sched::{
    Aqm, Classifier, ConfigError, PacketMeta, Parts, Pipeline, QueueState, Scheduler,
};
use nextmini_proto::v1::LinkParams;
use nextmini_proto::v1::QueueConfig;

const MTU: u32 = 1500;
const PAYLOAD: usize = 1400;

/// A flow the scheduler knows the size of, identified by its destination port.
#[derive(Debug, Clone, Copy)]
struct Flow {
    name: &'static str,
    dst_port: u16,
    bytes: u64,
}

/// One queue per known flow, so the scheduler can pick flows; everything else
/// shares the last queue.
struct FlowClassifier {
    ports: Vec<u16>,
}

impl Classifier for FlowClassifier {
    fn classify(&mut self, meta: &PacketMeta) -> usize {
        self.ports
            .iter()
            .position(|&p| p == meta.dst_port)
            .unwrap_or(self.ports.len())
    }
}

/// Shortest remaining first: the busy queue whose flow has the fewest bytes left.
/// Unknown traffic counts as infinitely long, so it only fills idle time.
struct ShortestRemainingFirst {
    remaining: Vec<u64>,
}

impl ShortestRemainingFirst {
    fn new(flows: &[Flow]) -> Self {
        let mut remaining: Vec<u64> = flows.iter().map(|f| f.bytes).collect();
        remaining.push(u64::MAX);
        ShortestRemainingFirst { remaining }
    }
}

impl Scheduler for ShortestRemainingFirst {
    fn select(&mut self, queues: &[QueueState]) -> Option<usize> {
        queues
            .iter()
            .enumerate()
            .filter(|(_, q)| !q.is_empty())
            .min_by_key(|(i, _)| self.remaining.get(*i).copied().unwrap_or(u64::MAX))
            .map(|(i, _)| i)
    }

    fn on_dequeue(&mut self, queue: usize, meta: &PacketMeta, _: &[QueueState]) {
        if let Some(r) = self.remaining.get_mut(queue) {
            *r = r.saturating_sub(u64::from(meta.len));
        }
    }
}

/// The link: rate, delay and queue limits from ordinary `LinkParams`, with the
/// classifier, AQMs and scheduler replaced.
fn pfabric(params: &LinkParams, flows: &[Flow]) -> Result<Pipeline<Vec<u8>>, ConfigError> {
    let mut parts = Parts::from_params(params, MTU)?;
    parts.classifier = Box::new(FlowClassifier {
        ports: flows.iter().map(|f| f.dst_port).collect(),
    });
    parts.aqms = (0..=flows.len())
        .map(|_| Box::new(TailDrop) as Box<dyn Aqm>)
        .collect();
    parts.scheduler = Box::new(ShortestRemainingFirst::new(flows));
    Pipeline::with_parts(parts, 1)
}

/// A minimal IPv4/UDP packet to `dst_port` carrying `payload` bytes.
fn udp_packet(dst_port: u16, payload: usize) -> Vec<u8> {
    let len = 28 + payload;
    let mut p = vec![0u8; len];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&[198, 18, 0, 1]);
    p[16..20].copy_from_slice(&[198, 18, 0, 2]);
    p[20..22].copy_from_slice(&40_000u16.to_be_bytes());
    p[22..24].copy_from_slice(&dst_port.to_be_bytes());
    p
}

/// Offers every flow's packets at time 0, in the order given (the first flow's
/// packets all arrive first), and returns each flow's completion time in ns.
fn completion_times(pipeline: &mut Pipeline<Vec<u8>>, flows: &[Flow]) -> Vec<u64> {
    for flow in flows {
        let mut left = flow.bytes;
        while left > 0 {
            // Full packets, then whatever is left (headers count towards the size).
            let total = usize::try_from(left).map_or(PAYLOAD + 28, |l| l.min(PAYLOAD + 28));
            let packet = udp_packet(flow.dst_port, total.saturating_sub(28).max(1));
            left = left.saturating_sub(packet.len() as u64);
            let meta = PacketMeta::from_ip(&packet);
            pipeline.enqueue(packet, meta, 0);
        }
    }
    let mut done = vec![0u64; flows.len()];
    let mut now = 0;
    let mut out = Vec::new();
    loop {
        out.clear();
        let next = pipeline.poll_into(now, &mut out);
        for packet in &out {
            let port = u16::from_be_bytes([packet[22], packet[23]]);
            if let Some(i) = flows.iter().position(|f| f.dst_port == port) {
                done[i] = now;
            }
        }
        match next {
            Some(t) => now = t.max(now),
            None => return done,
        }
    }
}

fn link() -> LinkParams {
    LinkParams {
        rate_bps: 100_000_000,
        delay_us: 1_000,
        queue: Some(QueueConfig {
            limit_packets: 10_000,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn flows() -> [Flow; 3] {
    [
        Flow {
            name: "elephant",
            dst_port: 5001,
            bytes: 1_000_000,
        },
        Flow {
            name: "medium",
            dst_port: 5002,
            bytes: 100_000,
        },
        Flow {
            name: "mouse",
            dst_port: 5003,
            bytes: 10_000,
        },
    ]
}

fn main() -> Result<(), ConfigError> {
    let flows = flows();
    let mut fcfs: Pipeline<Vec<u8>> = Pipeline::new(&link(), MTU, 1)?;
    let mut srf = pfabric(&link(), &flows)?;
    let fcfs_fct = completion_times(&mut fcfs, &flows);
    let srf_fct = completion_times(&mut srf, &flows);
    println!("100 Mbit/s, 1 ms; all flows start at 0, the elephant's packets first");
    println!(
        "{:<10} {:>10} {:>12} {:>12}",
        "flow", "bytes", "FCFS ms", "pFabric ms"
    );
    for (i, f) in flows.iter().enumerate() {
        println!(
            "{:<10} {:>10} {:>12.3} {:>12.3}",
            f.name,
            f.bytes,
            fcfs_fct[i] as f64 / 1e6,
            srf_fct[i] as f64 / 1e6
        );
    }
    let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len() as f64 / 1e6;
    println!(
        "{:<10} {:>10} {:>12.3} {:>12.3}",
        "mean",
        "",
        mean(&fcfs_fct),
        mean(&srf_fct)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortest_flow_finishes_first_and_mean_fct_drops() {
        let flows = flows();
        let mut fcfs: Pipeline<Vec<u8>> = Pipeline::new(&link(), MTU, 1).expect("valid");
        let mut srf = pfabric(&link(), &flows).expect("valid");
        let fcfs_fct = completion_times(&mut fcfs, &flows);
        let srf_fct = completion_times(&mut srf, &flows);
        // FCFS serves in arrival order: the elephant first.
        assert!(fcfs_fct[0] < fcfs_fct[1] && fcfs_fct[1] < fcfs_fct[2]);
        // Shortest remaining first: mouse, then medium, then elephant.
        assert!(srf_fct[2] < srf_fct[1] && srf_fct[1] < srf_fct[0]);
        // The mouse needs ~0.8 ms on the wire plus 1 ms delay.
        assert!(srf_fct[2] < 2_000_000, "{srf_fct:?}");
        // Same work, same link: the last completion is the same either way.
        assert_eq!(srf_fct[0], fcfs_fct[2]);
        let (fcfs_sum, srf_sum): (u64, u64) = (fcfs_fct.iter().sum(), srf_fct.iter().sum());
        assert!(srf_sum * 2 < fcfs_sum, "{srf_fct:?} vs {fcfs_fct:?}");
    }

    #[test]
    fn unknown_traffic_waits_for_known_flows() {
        let flows = flows();
        let mut srf = pfabric(
            // A one-byte bucket: no burst, so packets queue behind the first.
            &LinkParams {
                rate_bps: 8_000_000,
                burst_bytes: 1,
                ..link()
            },
            &flows,
        )
        .expect("valid");
        for port in [9, 5001, 9, 5003] {
            let p = udp_packet(port, 100);
            let meta = PacketMeta::from_ip(&p);
            srf.enqueue(p, meta, 0);
        }
        let order: Vec<u16> = srf
            .poll(10_000_000_000)
            .packets
            .iter()
            .map(|p| u16::from_be_bytes([p[22], p[23]]))
            .collect();
        // The first packet had the idle link; then mouse, elephant, unknown.
        assert_eq!(order, [9, 5003, 5001, 9]);
    }
}
