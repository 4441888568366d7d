//! pFabric's scheduling (Alizadeh et al., SIGCOMM 2013): every port serves the
//! packet of the flow with the least data left to send, shortest remaining
//! processing time first, which minimises mean flow completion time.
//!
//! Hosts in pFabric stamp the remaining size into each packet. Unmodified
//! applications do not, so here the experiment names its flows (by the server's
//! port: packets from or to it, so uploads and downloads alike) and their sizes,
//! and the scheduler counts what each has sent: the same number. Traffic of no listed flow counts as infinitely long and only fills idle
//! time.
//!
//! ```yaml
//! scheduler:
//!   scheme:
//!     name: pfabric
//!     settings:
//!       flows:
//!         - {port: 5001, bytes: 1000000}
//!         - {port: 5003, bytes: 10000}
//! ```

use super::{LinkContext, SchedulerScheme, SettingsError};
use crate::sched::{Classifier, PacketMeta, QueueState, Scheduler};
use serde::Deserialize;

pub struct Pfabric;

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Settings {
    /// The flows whose sizes are known, one queue each; everything else shares
    /// one more queue, the last.
    pub flows: Vec<FlowSize>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FlowSize {
    /// The flow's server port: its packets come from or go to it.
    pub port: u16,
    /// Bytes on the wire (IP packets, headers included) the flow will send.
    pub bytes: u64,
}

impl SchedulerScheme for Pfabric {
    const NAME: &'static str = "pfabric";
    const SUMMARY: &'static str =
        "shortest remaining flow first; settings.flows lists {port, bytes}";
    type Settings = Settings;
    const CLASSIFIES: bool = true;

    fn queues(settings: &Settings) -> Result<usize, SettingsError> {
        for (i, flow) in settings.flows.iter().enumerate() {
            if flow.bytes == 0 {
                return Err(SettingsError::new(
                    format!("flows[{i}].bytes"),
                    "must be greater than 0",
                ));
            }
            if let Some(j) = settings.flows[..i].iter().position(|f| f.port == flow.port) {
                return Err(SettingsError::new(
                    format!("flows[{i}].port"),
                    format!("port {} is already flows[{j}]", flow.port),
                ));
            }
        }
        Ok(settings.flows.len() + 1)
    }

    fn build(settings: &Settings, _: &LinkContext) -> Box<dyn Scheduler> {
        let mut remaining: Vec<u64> = settings.flows.iter().map(|f| f.bytes).collect();
        remaining.push(u64::MAX);
        Box::new(ShortestRemainingFirst {
            ports: settings.flows.iter().map(|f| f.port).collect(),
            remaining,
        })
    }
}

/// Queue `i` holds the flow of `ports[i]`; the last queue everything else.
struct ShortestRemainingFirst {
    ports: Vec<u16>,
    remaining: Vec<u64>,
}

impl Scheduler for ShortestRemainingFirst {
    fn classifier(&self) -> Option<Box<dyn Classifier>> {
        Some(Box::new(PortClassifier {
            ports: self.ports.clone(),
        }))
    }

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

struct PortClassifier {
    ports: Vec<u16>,
}

impl Classifier for PortClassifier {
    fn classify(&mut self, meta: &PacketMeta) -> usize {
        let of = |port: u16| self.ports.iter().position(|&p| p == port);
        of(meta.dst_port)
            .or_else(|| of(meta.src_port))
            .unwrap_or(self.ports.len())
    }
}

#[cfg(test)]
mod tests {
    use crate::sched::{PacketMeta, Pipeline};
    use nextmini_proto::v1 as pb;

    const MTU: u32 = 1500;
    const PAYLOAD: usize = 1400;

    /// (name, destination port, bytes)
    const FLOWS: [(&str, u16, u64); 3] = [
        ("elephant", 5001, 1_000_000),
        ("medium", 5002, 100_000),
        ("mouse", 5003, 10_000),
    ];

    /// 100 Mbit/s, 1 ms, room for every packet; `scheme` is the scheduler.
    fn link(scheduler: Option<pb::scheduler_config::Kind>) -> pb::LinkParams {
        pb::LinkParams {
            rate_bps: 100_000_000,
            delay_us: 1_000,
            queue: Some(pb::QueueConfig {
                limit_packets: 10_000,
                ..Default::default()
            }),
            scheduler: Some(pb::SchedulerConfig { kind: scheduler }),
            ..Default::default()
        }
    }

    /// The scheduler as a link names it: through the proto, as the hub sends it.
    fn pfabric() -> Option<pb::scheduler_config::Kind> {
        let flows: Vec<_> = FLOWS
            .iter()
            .map(|(_, port, bytes)| serde_json::json!({"port": port, "bytes": bytes}))
            .collect();
        Some(pb::scheduler_config::Kind::Scheme(pb::SchemeConfig {
            name: "pfabric".into(),
            settings_json: serde_json::json!({ "flows": flows }).to_string(),
        }))
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

    /// Offers every flow's packets at time 0, the elephant's first, and returns each
    /// flow's completion time in ns.
    fn completion_times(pipeline: &mut Pipeline<Vec<u8>>) -> Vec<u64> {
        for (_, port, bytes) in FLOWS {
            let mut left = bytes;
            while left > 0 {
                let total = usize::try_from(left).map_or(PAYLOAD + 28, |l| l.min(PAYLOAD + 28));
                let packet = udp_packet(port, total.saturating_sub(28).max(1));
                left = left.saturating_sub(packet.len() as u64);
                let meta = PacketMeta::from_ip(&packet);
                pipeline.enqueue(packet, meta, 0);
            }
        }
        let mut done = vec![0u64; FLOWS.len()];
        let mut now = 0;
        let mut out = Vec::new();
        loop {
            out.clear();
            let next = pipeline.poll_into(now, &mut out);
            for packet in &out {
                let port = u16::from_be_bytes([packet[22], packet[23]]);
                if let Some(i) = FLOWS.iter().position(|f| f.1 == port) {
                    done[i] = now;
                }
            }
            match next {
                Some(t) => now = t.max(now),
                None => return done,
            }
        }
    }

    #[test]
    fn shortest_flow_finishes_first_and_mean_fct_drops() {
        let mut fcfs: Pipeline<Vec<u8>> = Pipeline::new(&link(None), MTU, 1).expect("valid");
        let mut srf: Pipeline<Vec<u8>> = Pipeline::new(&link(pfabric()), MTU, 1).expect("valid");
        let fcfs_fct = completion_times(&mut fcfs);
        let srf_fct = completion_times(&mut srf);
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
        // A one-byte bucket: no burst, so packets queue behind the first.
        let params = pb::LinkParams {
            rate_bps: 8_000_000,
            burst_bytes: 1,
            ..link(pfabric())
        };
        let mut srf: Pipeline<Vec<u8>> = Pipeline::new(&params, MTU, 1).expect("valid");
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

    #[test]
    fn settings_that_make_no_sense_are_refused_by_field() {
        let bad = |settings: serde_json::Value| {
            let kind = pb::scheduler_config::Kind::Scheme(pb::SchemeConfig {
                name: "pfabric".into(),
                settings_json: settings.to_string(),
            });
            Pipeline::<Vec<u8>>::new(&link(Some(kind)), MTU, 1)
                .expect_err("refused")
                .to_string()
        };
        assert_eq!(
            bad(serde_json::json!({"flows": [{"port": 1, "bytes": 0}]})),
            "scheduler.scheme.settings.flows[0].bytes: must be greater than 0"
        );
        assert_eq!(
            bad(serde_json::json!({"flows": [{"port": 1, "bytes": 5}, {"port": 1, "bytes": 9}]})),
            "scheduler.scheme.settings.flows[1].port: port 1 is already flows[0]"
        );
        assert!(
            bad(serde_json::json!({}))
                .starts_with("scheduler.scheme.settings: missing field `flows`")
        );
        let classes = pb::LinkParams {
            classes: vec![pb::ClassRule::default()],
            ..link(pfabric())
        };
        assert_eq!(
            Pipeline::<Vec<u8>>::new(&classes, MTU, 1)
                .expect_err("refused")
                .to_string(),
            "classes: the pfabric scheduler sorts packets into its queues itself; remove classes"
        );
    }
}
