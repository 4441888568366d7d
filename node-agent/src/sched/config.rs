//! `LinkParams` from the control plane, checked once and turned into plain values
//! the schemes are built from. Every error names the offending field.

use super::classify::ClassRule;
use super::schemes::{SchemeError, find_aqm, find_scheduler};
use super::trace_shaper::{MAX_TRACE_ENTRIES, check_trace, trace_mean_rate_bps};
use nextmini_proto::v1 as pb;
use std::sync::Arc;
use thiserror::Error;

/// Queue limit when the control plane leaves it unset.
pub const DEFAULT_QUEUE_LIMIT_PACKETS: u32 = 1000;
/// More queues than this is a misconfiguration, not a discipline.
pub const MAX_QUEUES: usize = 256;
/// EWMA weight of RED's average when unset (0.002, as in Floyd & Jacobson).
pub const DEFAULT_RED_WEIGHT_PPM: u32 = 2000;
const PPM: u32 = 1_000_000;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{field}: {reason}")]
pub struct ConfigError {
    /// Path of the field in `LinkParams`, e.g. `queue.red.min_packets`.
    pub field: String,
    pub reason: String,
}

impl ConfigError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Per-queue limits; `bytes == 0` means no byte limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    pub packets: u32,
    pub bytes: u64,
}

impl Default for QueueLimits {
    fn default() -> Self {
        QueueLimits {
            packets: DEFAULT_QUEUE_LIMIT_PACKETS,
            bytes: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AqmConfig {
    TailDrop,
    Red(RedConfig),
    Ecn {
        threshold_packets: u32,
    },
    /// A registered scheme ([`super::schemes::AQMS`]) whose settings were checked.
    Scheme(SchemeSettings),
}

/// A registered scheme by name and its settings, as JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemeSettings {
    pub name: String,
    pub settings: serde_json::Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedConfig {
    pub min_packets: u32,
    pub max_packets: u32,
    pub max_p_ppm: u32,
    pub weight_ppm: u32,
    pub ecn: bool,
}

/// Scheduler with its per-queue parameters expanded to one entry per queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchedulerConfig {
    Fcfs,
    Wrr {
        weights: Vec<u32>,
    },
    Drr {
        quanta: Vec<u32>,
    },
    Priority,
    /// A registered scheme ([`super::schemes::SCHEDULERS`]) whose settings were
    /// checked.
    Scheme(SchemeSettings),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JitterDistribution {
    #[default]
    Uniform,
    Normal,
    Pareto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImpairmentConfig {
    pub delay_ns: u64,
    pub jitter_ns: u64,
    pub distribution: JitterDistribution,
    pub loss_ppm: u32,
    pub loss_correlation_ppm: u32,
    pub reorder_ppm: u32,
    pub duplicate_ppm: u32,
    pub corrupt_ppm: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShaperConfig {
    /// 0 = unlimited.
    pub rate_bps: u64,
    pub burst_bytes: u64,
    /// A delivery trace instead of the token bucket (`trace_shaper.rs`).
    pub trace: Option<Arc<[u32]>>,
}

impl ShaperConfig {
    /// The rate the link offers on average (0 = unlimited), for the parts that
    /// size themselves by it.
    pub fn mean_rate_bps(&self) -> u64 {
        match &self.trace {
            Some(ms) => trace_mean_rate_bps(ms),
            None => self.rate_bps,
        }
    }
}

/// A validated `LinkParams`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkConfig {
    pub mtu: u32,
    pub queues: usize,
    pub limits: QueueLimits,
    pub aqm: AqmConfig,
    pub scheduler: SchedulerConfig,
    pub classes: Vec<ClassRule>,
    pub shaper: ShaperConfig,
    pub impairment: ImpairmentConfig,
}

impl LinkConfig {
    /// True when no stage can tell one 64 KiB burst of back-to-back packets from
    /// one super-packet of the same bytes: the rate is unlimited (so no queue
    /// ever builds, and limits and AQMs never act) and the only impairment is a
    /// fixed delay, the same for every packet. Such a link may carry TUN
    /// super-packets whole; any other link gets them cut into segments first.
    pub fn passes_aggregates(&self) -> bool {
        let i = &self.impairment;
        self.shaper.rate_bps == 0
            && self.shaper.trace.is_none()
            && i.jitter_ns == 0
            && i.loss_ppm == 0
            && i.reorder_ppm == 0
            && i.duplicate_ppm == 0
            && i.corrupt_ppm == 0
    }

    /// True when the link does nothing to what it carries: no rate, no delay,
    /// no impairment. A transit hop may move such a link's frames from one
    /// connection to the next without its pipeline (`crate::cut_through`).
    pub fn is_transparent(&self) -> bool {
        self.passes_aggregates() && self.impairment.delay_ns == 0
    }

    /// True when the link acts on packets only through a token bucket, a
    /// tail-drop FIFO and a fixed delay: the stages that charge by bytes and
    /// count packets, and would treat a burst of back-to-back segments as a
    /// block anyway. Such a link may carry a super-packet as trains of a few
    /// segments (`Pipeline::train_segments`) instead of one entry per segment,
    /// which is most of a shaped hop's CPU. An AQM, a scheduler with classes,
    /// a trace or any random impairment decides per packet and gets packets.
    pub fn passes_trains(&self) -> bool {
        let i = &self.impairment;
        self.shaper.rate_bps > 0
            && self.shaper.trace.is_none()
            && self.queues == 1
            && self.classes.is_empty()
            && matches!(self.aqm, AqmConfig::TailDrop)
            && matches!(self.scheduler, SchedulerConfig::Fcfs)
            && i.jitter_ns == 0
            && i.loss_ppm == 0
            && i.reorder_ppm == 0
            && i.duplicate_ppm == 0
            && i.corrupt_ppm == 0
    }

    pub fn from_params(params: &pb::LinkParams, mtu: u32) -> Result<LinkConfig, ConfigError> {
        if mtu == 0 {
            return Err(ConfigError::new("mtu", "must be above 0"));
        }
        let classes = params
            .classes
            .iter()
            .enumerate()
            .map(|(i, rule)| class_rule(i, rule))
            .collect::<Result<Vec<_>, _>>()?;
        let kind = params.scheduler.as_ref().and_then(|s| s.kind.as_ref());
        let scheme = match kind {
            Some(pb::scheduler_config::Kind::Scheme(s)) => Some(scheduler_scheme(s, &classes)?),
            _ => None,
        };
        let queues = [
            match kind {
                Some(pb::scheduler_config::Kind::Wrr(w)) => w.weights.len(),
                Some(pb::scheduler_config::Kind::Drr(d)) => d.quantum_bytes.len(),
                Some(pb::scheduler_config::Kind::Priority(p)) => p.bands as usize,
                _ => scheme.as_ref().map_or(1, |(_, queues)| *queues),
            },
            classes.iter().map(|c| c.queue + 1).max().unwrap_or(1),
        ]
        .into_iter()
        .max()
        .unwrap_or(1);
        if queues > MAX_QUEUES {
            return Err(ConfigError::new(
                "scheduler",
                format!("{queues} queues; at most {MAX_QUEUES} are supported"),
            ));
        }
        Ok(LinkConfig {
            mtu,
            queues,
            limits: limits(params),
            aqm: aqm(params.queue.as_ref().and_then(|q| q.aqm.as_ref()))?,
            scheduler: match scheme {
                Some((settings, _)) => SchedulerConfig::Scheme(settings),
                None => scheduler(kind, queues, mtu)?,
            },
            classes,
            shaper: ShaperConfig {
                rate_bps: params.rate_bps,
                burst_bytes: if params.burst_bytes == 0 {
                    u64::from(mtu)
                } else {
                    params.burst_bytes
                },
                trace: trace(params)?,
            },
            impairment: impairment(params)?,
        })
    }

    /// The queue unclassified packets go to: the last one, which under strict
    /// priority is the lowest band (best effort).
    pub fn default_queue(&self) -> usize {
        self.queues - 1
    }
}

fn limits(params: &pb::LinkParams) -> QueueLimits {
    let queue = params.queue.clone().unwrap_or_default();
    // `queue_packets` is the older field; the newer one wins when both are set.
    let packets = [queue.limit_packets, params.queue_packets]
        .into_iter()
        .find(|&n| n != 0)
        .unwrap_or(DEFAULT_QUEUE_LIMIT_PACKETS);
    QueueLimits {
        packets,
        bytes: queue.limit_bytes,
    }
}

/// Reads a registered scheme's settings; the error names the field from the
/// `scheme` mapping down.
fn scheme_settings(at: &str, s: &pb::SchemeConfig) -> Result<SchemeSettings, ConfigError> {
    let settings = if s.settings_json.trim().is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_str(&s.settings_json)
            .map_err(|e| ConfigError::new(format!("{at}.settings"), format!("is not JSON: {e}")))?
    };
    Ok(SchemeSettings {
        name: s.name.clone(),
        settings,
    })
}

fn scheme_error(at: &str, e: &SchemeError) -> ConfigError {
    ConfigError::new(format!("{at}.{}", e.field()), e.reason())
}

/// A registered scheduler's settings and the number of queues they give.
fn scheduler_scheme(
    s: &pb::SchemeConfig,
    classes: &[ClassRule],
) -> Result<(SchemeSettings, usize), ConfigError> {
    const AT: &str = "scheduler.scheme";
    let settings = scheme_settings(AT, s)?;
    let entry = find_scheduler(&settings.name).map_err(|e| scheme_error(AT, &e))?;
    let queues = entry
        .queues(&settings.settings)
        .map_err(|e| scheme_error(AT, &e))?;
    if entry.classifies && !classes.is_empty() {
        return Err(ConfigError::new(
            "classes",
            format!(
                "the {} scheduler sorts packets into its queues itself; remove classes",
                entry.name
            ),
        ));
    }
    Ok((settings, queues))
}

fn aqm(aqm: Option<&pb::queue_config::Aqm>) -> Result<AqmConfig, ConfigError> {
    use pb::queue_config::Aqm;
    match aqm {
        None | Some(Aqm::Taildrop(_)) => Ok(AqmConfig::TailDrop),
        Some(Aqm::Scheme(s)) => {
            const AT: &str = "queue.aqm.scheme";
            let settings = scheme_settings(AT, s)?;
            find_aqm(&settings.name)
                .and_then(|entry| entry.check(&settings.settings))
                .map_err(|e| scheme_error(AT, &e))?;
            Ok(AqmConfig::Scheme(settings))
        }
        Some(Aqm::Ecn(e)) => {
            if e.threshold_packets == 0 {
                return Err(ConfigError::new(
                    "queue.ecn.threshold_packets",
                    "must be at least 1",
                ));
            }
            Ok(AqmConfig::Ecn {
                threshold_packets: e.threshold_packets,
            })
        }
        Some(Aqm::Red(r)) => {
            if r.max_packets == 0 {
                return Err(ConfigError::new("queue.red.max_packets", "must be set"));
            }
            if r.min_packets >= r.max_packets {
                return Err(ConfigError::new(
                    "queue.red.min_packets",
                    format!(
                        "must be below max_packets ({} >= {})",
                        r.min_packets, r.max_packets
                    ),
                ));
            }
            ppm("queue.red.max_p_ppm", r.max_p_ppm)?;
            ppm("queue.red.weight_ppm", r.weight_ppm)?;
            Ok(AqmConfig::Red(RedConfig {
                min_packets: r.min_packets,
                max_packets: r.max_packets,
                max_p_ppm: r.max_p_ppm,
                weight_ppm: if r.weight_ppm == 0 {
                    DEFAULT_RED_WEIGHT_PPM
                } else {
                    r.weight_ppm
                },
                ecn: r.ecn,
            }))
        }
    }
}

fn scheduler(
    kind: Option<&pb::scheduler_config::Kind>,
    queues: usize,
    mtu: u32,
) -> Result<SchedulerConfig, ConfigError> {
    use pb::scheduler_config::Kind;
    Ok(match kind {
        None | Some(Kind::Fcfs(_)) => SchedulerConfig::Fcfs,
        Some(Kind::Scheme(s)) => SchedulerConfig::Scheme(scheduler_scheme(s, &[])?.0),
        Some(Kind::Priority(_)) => SchedulerConfig::Priority,
        Some(Kind::Wrr(w)) => {
            if let Some(i) = w.weights.iter().position(|&x| x == 0) {
                return Err(ConfigError::new(
                    format!("scheduler.wrr.weights[{i}]"),
                    "must be at least 1 (a zero weight starves its queue)",
                ));
            }
            // Queues that only classes name get weight 1.
            let mut weights = w.weights.clone();
            weights.resize(queues, 1);
            SchedulerConfig::Wrr { weights }
        }
        Some(Kind::Drr(d)) => {
            // One value applies to every queue; zero means one MTU.
            let fill = match d.quantum_bytes.as_slice() {
                [one] => *one,
                _ => 0,
            };
            let mut quanta = d.quantum_bytes.clone();
            quanta.resize(queues, fill);
            for q in &mut quanta {
                if *q == 0 {
                    *q = mtu;
                }
            }
            SchedulerConfig::Drr { quanta }
        }
    })
}

fn class_rule(i: usize, rule: &pb::ClassRule) -> Result<ClassRule, ConfigError> {
    let field = |name: &str| format!("classes[{i}].{name}");
    let queue = rule.queue as usize;
    if queue >= MAX_QUEUES {
        return Err(ConfigError::new(
            field("queue"),
            format!("must be below {MAX_QUEUES}"),
        ));
    }
    let narrow = |name: &str, value: Option<u32>, max: u32| match value {
        Some(v) if v > max => Err(ConfigError::new(
            field(name),
            format!("must be at most {max}"),
        )),
        _ => Ok(value),
    };
    Ok(ClassRule {
        queue,
        dscp: narrow("dscp", rule.dscp, 63)?.map(|v| v as u8),
        src_port: narrow("src_port", rule.src_port, 65_535)?.map(|v| v as u16),
        dst_port: narrow("dst_port", rule.dst_port, 65_535)?.map(|v| v as u16),
        protocol: narrow("protocol", rule.protocol, 255)?.map(|v| v as u8),
        max_packet_bytes: rule.max_packet_bytes,
    })
}

fn trace(params: &pb::LinkParams) -> Result<Option<Arc<[u32]>>, ConfigError> {
    if params.trace_ms.is_empty() {
        return Ok(None);
    }
    if params.rate_bps != 0 || params.burst_bytes != 0 {
        return Err(ConfigError::new(
            "trace_ms",
            "a trace replaces the token bucket: rate_bps and burst_bytes must be 0",
        ));
    }
    if params.trace_ms.len() > MAX_TRACE_ENTRIES {
        return Err(ConfigError::new(
            "trace_ms",
            format!(
                "{} entries; at most {MAX_TRACE_ENTRIES}",
                params.trace_ms.len()
            ),
        ));
    }
    check_trace(&params.trace_ms).map_err(|e| ConfigError::new("trace_ms", e.to_string()))?;
    Ok(Some(params.trace_ms.as_slice().into()))
}

fn impairment(params: &pb::LinkParams) -> Result<ImpairmentConfig, ConfigError> {
    let micros = |name: &str, us: u64| {
        us.checked_mul(1000)
            .ok_or_else(|| ConfigError::new(name, "too large"))
    };
    let distribution = match pb::JitterDistribution::try_from(params.jitter_distribution) {
        Ok(pb::JitterDistribution::Uniform) => JitterDistribution::Uniform,
        Ok(pb::JitterDistribution::Normal) => JitterDistribution::Normal,
        Ok(pb::JitterDistribution::Pareto) => JitterDistribution::Pareto,
        Err(_) => {
            return Err(ConfigError::new(
                "jitter_distribution",
                format!("unknown value {}", params.jitter_distribution),
            ));
        }
    };
    Ok(ImpairmentConfig {
        delay_ns: micros("delay_us", params.delay_us)?,
        jitter_ns: micros("jitter_us", params.jitter_us)?,
        distribution,
        loss_ppm: ppm("loss_ppm", params.loss_ppm)?,
        loss_correlation_ppm: ppm("loss_correlation_ppm", params.loss_correlation_ppm)?,
        reorder_ppm: ppm("reorder_ppm", params.reorder_ppm)?,
        duplicate_ppm: ppm("duplicate_ppm", params.duplicate_ppm)?,
        corrupt_ppm: ppm("corrupt_ppm", params.corrupt_ppm)?,
    })
}

fn ppm(field: &str, value: u32) -> Result<u32, ConfigError> {
    if value > PPM {
        return Err(ConfigError::new(
            field,
            format!("{value} exceeds 1000000 (100%)"),
        ));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::scheduler_config::Kind;

    fn with_scheduler(kind: Kind) -> pb::LinkParams {
        pb::LinkParams {
            scheduler: Some(pb::SchedulerConfig { kind: Some(kind) }),
            ..Default::default()
        }
    }

    fn err(params: &pb::LinkParams) -> String {
        LinkConfig::from_params(params, 1500)
            .expect_err("invalid")
            .to_string()
    }

    #[test]
    fn defaults() {
        let c = LinkConfig::from_params(&pb::LinkParams::default(), 1500).expect("valid");
        assert_eq!(c.queues, 1);
        assert_eq!(c.limits, QueueLimits::default());
        assert_eq!(c.aqm, AqmConfig::TailDrop);
        assert_eq!(c.scheduler, SchedulerConfig::Fcfs);
        assert_eq!(c.shaper.burst_bytes, 1500, "burst defaults to one MTU");
        assert_eq!(c.impairment, ImpairmentConfig::default());
    }

    #[test]
    fn queue_count_is_the_largest_hint() {
        let mut p = with_scheduler(Kind::Wrr(pb::Wrr {
            weights: vec![3, 1],
        }));
        assert_eq!(LinkConfig::from_params(&p, 1500).expect("valid").queues, 2);
        p.classes.push(pb::ClassRule {
            queue: 3,
            ..Default::default()
        });
        let c = LinkConfig::from_params(&p, 1500).expect("valid");
        assert_eq!(c.queues, 4);
        assert_eq!(
            c.scheduler,
            SchedulerConfig::Wrr {
                weights: vec![3, 1, 1, 1]
            }
        );
        assert_eq!(c.default_queue(), 3);
        let p = with_scheduler(Kind::Priority(pb::StrictPriority { bands: 3 }));
        assert_eq!(LinkConfig::from_params(&p, 1500).expect("valid").queues, 3);
        let p = with_scheduler(Kind::Priority(pb::StrictPriority { bands: 10_000 }));
        assert!(err(&p).starts_with("scheduler: "));
    }

    #[test]
    fn drr_quanta_expand() {
        let p = with_scheduler(Kind::Drr(pb::Drr {
            quantum_bytes: vec![500],
        }));
        let mut p2 = p.clone();
        p2.classes.push(pb::ClassRule {
            queue: 2,
            ..Default::default()
        });
        let c = LinkConfig::from_params(&p2, 1500).expect("valid");
        assert_eq!(
            c.scheduler,
            SchedulerConfig::Drr {
                quanta: vec![500; 3]
            }
        );
        let p = with_scheduler(Kind::Drr(pb::Drr {
            quantum_bytes: vec![0, 300],
        }));
        let c = LinkConfig::from_params(&p, 1400).expect("valid");
        assert_eq!(
            c.scheduler,
            SchedulerConfig::Drr {
                quanta: vec![1400, 300]
            }
        );
    }

    #[test]
    fn errors_name_the_field() {
        let red = |min, max| pb::LinkParams {
            queue: Some(pb::QueueConfig {
                aqm: Some(pb::queue_config::Aqm::Red(pb::Red {
                    min_packets: min,
                    max_packets: max,
                    max_p_ppm: 100_000,
                    ..Default::default()
                })),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            err(&red(20, 10)),
            "queue.red.min_packets: must be below max_packets (20 >= 10)"
        );
        assert_eq!(err(&red(0, 0)), "queue.red.max_packets: must be set");
        let p = pb::LinkParams {
            loss_ppm: 1_000_001,
            ..Default::default()
        };
        assert_eq!(err(&p), "loss_ppm: 1000001 exceeds 1000000 (100%)");
        let p = with_scheduler(Kind::Wrr(pb::Wrr {
            weights: vec![1, 0],
        }));
        assert!(err(&p).starts_with("scheduler.wrr.weights[1]: "));
        let p = pb::LinkParams {
            classes: vec![
                pb::ClassRule::default(),
                pb::ClassRule {
                    dscp: Some(64),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(err(&p), "classes[1].dscp: must be at most 63");
        let p = pb::LinkParams {
            jitter_distribution: 9,
            ..Default::default()
        };
        assert_eq!(err(&p), "jitter_distribution: unknown value 9");
        let p = pb::LinkParams {
            delay_us: u64::MAX,
            ..Default::default()
        };
        assert_eq!(err(&p), "delay_us: too large");
        assert_eq!(
            LinkConfig::from_params(&pb::LinkParams::default(), 0)
                .expect_err("mtu")
                .field,
            "mtu"
        );
    }

    #[test]
    fn legacy_queue_packets_is_a_fallback() {
        let p = pb::LinkParams {
            queue_packets: 50,
            ..Default::default()
        };
        assert_eq!(limits(&p).packets, 50);
        let p = pb::LinkParams {
            queue_packets: 50,
            queue: Some(pb::QueueConfig {
                limit_packets: 70,
                limit_bytes: 9000,
                aqm: None,
            }),
            ..Default::default()
        };
        assert_eq!(
            limits(&p),
            QueueLimits {
                packets: 70,
                bytes: 9000
            }
        );
    }
}
