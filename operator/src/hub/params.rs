//! One direction's link parameters as the agent protocol carries them. In the proto,
//! zero or an unset message means "unlimited / none / the agent's default", which is
//! what `None` means in the plan.

use crate::plan::{Aqm, ClassRule, JitterDistribution, LinkParams, SchedulerKind};
use nextmini_proto::v1 as pb;
use std::time::Duration;

pub fn to_proto(p: &LinkParams) -> pb::LinkParams {
    let queue = &p.queue;
    pb::LinkParams {
        rate_bps: p.rate_bps.unwrap_or(0),
        trace_ms: p.trace_ms.clone(),
        burst_bytes: p.burst_bytes.unwrap_or(0),
        delay_us: p.delay.map_or(0, micros),
        jitter_us: p.jitter.map_or(0, micros),
        jitter_distribution: distribution(p.jitter_distribution) as i32,
        loss_ppm: p.loss_ppm.unwrap_or(0),
        loss_correlation_ppm: p.loss_correlation_ppm.unwrap_or(0),
        reorder_ppm: p.reorder_ppm.unwrap_or(0),
        duplicate_ppm: p.duplicate_ppm.unwrap_or(0),
        corrupt_ppm: p.corrupt_ppm.unwrap_or(0),
        // Superseded by queue.limit_packets; still filled for agents that read only it.
        queue_packets: queue.limit_packets.unwrap_or(0),
        queue: Some(pb::QueueConfig {
            limit_packets: queue.limit_packets.unwrap_or(0),
            limit_bytes: queue.limit_bytes.unwrap_or(0),
            aqm: Some(aqm(&queue.aqm)),
        }),
        scheduler: Some(pb::SchedulerConfig {
            kind: Some(scheduler(&p.scheduler)),
        }),
        classes: p.classes.iter().map(class).collect(),
    }
}

/// Validation keeps durations far below u64 microseconds; saturate rather than wrap.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn distribution(d: JitterDistribution) -> pb::JitterDistribution {
    match d {
        JitterDistribution::Uniform => pb::JitterDistribution::Uniform,
        JitterDistribution::Normal => pb::JitterDistribution::Normal,
        JitterDistribution::Pareto => pb::JitterDistribution::Pareto,
    }
}

/// A scheme's settings as the agent reads them: JSON, empty when unset.
fn scheme(name: &str, settings: &serde_json::Value) -> pb::SchemeConfig {
    pb::SchemeConfig {
        name: name.to_owned(),
        settings_json: if settings.is_null() {
            String::new()
        } else {
            settings.to_string()
        },
    }
}

fn aqm(a: &Aqm) -> pb::queue_config::Aqm {
    match *a {
        Aqm::Scheme {
            ref name,
            ref settings,
        } => pb::queue_config::Aqm::Scheme(scheme(name, settings)),
        Aqm::TailDrop => pb::queue_config::Aqm::Taildrop(pb::TailDrop {}),
        Aqm::Red {
            min_packets,
            max_packets,
            max_p_ppm,
            weight_ppm,
            ecn,
        } => pb::queue_config::Aqm::Red(pb::Red {
            min_packets,
            max_packets,
            max_p_ppm,
            weight_ppm,
            ecn,
        }),
        Aqm::Ecn { threshold_packets } => {
            pb::queue_config::Aqm::Ecn(pb::EcnThreshold { threshold_packets })
        }
    }
}

fn scheduler(s: &SchedulerKind) -> pb::scheduler_config::Kind {
    use pb::scheduler_config::Kind;
    match s {
        SchedulerKind::Fcfs => Kind::Fcfs(pb::Fcfs {}),
        SchedulerKind::Wrr { weights } => Kind::Wrr(pb::Wrr {
            weights: weights.clone(),
        }),
        SchedulerKind::Drr { quantum_bytes } => Kind::Drr(pb::Drr {
            quantum_bytes: quantum_bytes.clone(),
        }),
        SchedulerKind::Priority { bands } => Kind::Priority(pb::StrictPriority { bands: *bands }),
        SchedulerKind::Scheme { name, settings } => Kind::Scheme(scheme(name, settings)),
    }
}

fn class(c: &ClassRule) -> pb::ClassRule {
    pb::ClassRule {
        queue: c.queue,
        dscp: c.dscp.map(u32::from),
        src_port: c.src_port.map(u32::from),
        dst_port: c.dst_port.map(u32::from),
        protocol: c.protocol.map(u32::from),
        max_packet_bytes: c.max_packet_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::QueueParams;

    #[test]
    fn unset_means_zero_and_defaults_are_explicit() {
        let p = to_proto(&LinkParams::default());
        assert_eq!((p.rate_bps, p.delay_us, p.loss_ppm), (0, 0, 0));
        assert_eq!(
            p.queue.and_then(|q| q.aqm),
            Some(pb::queue_config::Aqm::Taildrop(pb::TailDrop {}))
        );
        assert_eq!(
            p.scheduler.and_then(|s| s.kind),
            Some(pb::scheduler_config::Kind::Fcfs(pb::Fcfs {}))
        );
    }

    #[test]
    fn every_field_is_carried() {
        let params = LinkParams {
            rate_bps: Some(10_000_000),
            trace_ms: vec![1, 1, 2],
            burst_bytes: Some(15_000),
            delay: Some(Duration::from_millis(20)),
            jitter: Some(Duration::from_micros(2_500)),
            jitter_distribution: JitterDistribution::Pareto,
            loss_ppm: Some(1),
            loss_correlation_ppm: Some(2),
            reorder_ppm: Some(3),
            duplicate_ppm: Some(4),
            corrupt_ppm: Some(5),
            queue: QueueParams {
                limit_packets: None,
                limit_bytes: Some(64_000),
                aqm: Aqm::Ecn {
                    threshold_packets: 30,
                },
            },
            scheduler: SchedulerKind::Drr {
                quantum_bytes: vec![1500, 3000],
            },
            classes: vec![ClassRule {
                queue: 1,
                dscp: Some(46),
                src_port: Some(5001),
                dst_port: Some(443),
                protocol: Some(17),
                max_packet_bytes: Some(128),
            }],
        };
        let expected = pb::LinkParams {
            rate_bps: 10_000_000,
            trace_ms: vec![1, 1, 2],
            delay_us: 20_000,
            jitter_us: 2_500,
            loss_ppm: 1,
            queue_packets: 0,
            burst_bytes: 15_000,
            jitter_distribution: pb::JitterDistribution::Pareto as i32,
            loss_correlation_ppm: 2,
            reorder_ppm: 3,
            duplicate_ppm: 4,
            corrupt_ppm: 5,
            queue: Some(pb::QueueConfig {
                limit_packets: 0,
                limit_bytes: 64_000,
                aqm: Some(pb::queue_config::Aqm::Ecn(pb::EcnThreshold {
                    threshold_packets: 30,
                })),
            }),
            scheduler: Some(pb::SchedulerConfig {
                kind: Some(pb::scheduler_config::Kind::Drr(pb::Drr {
                    quantum_bytes: vec![1500, 3000],
                })),
            }),
            classes: vec![pb::ClassRule {
                queue: 1,
                dscp: Some(46),
                src_port: Some(5001),
                dst_port: Some(443),
                protocol: Some(17),
                max_packet_bytes: Some(128),
            }],
        };
        assert_eq!(to_proto(&params), expected);
    }
}
