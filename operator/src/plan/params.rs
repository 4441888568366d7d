//! Inheritance of link parameters: for one direction of a link the parameter sets
//! `linkDefaults`, the link's own fields and the direction override are layered, and
//! each field comes from the most specific layer that sets it. `queue.limit` and
//! `queue.aqm` are inherited separately; a scheduler and a class list each count as one
//! field, so a link never mixes two schedulers' settings.

use super::model::{Aqm, ClassRule, JitterDistribution, LinkParams, QueueParams, SchedulerKind};
use crate::api::{self, AqmSpec, ClassSpec, LinkParamsSpec, SchedulerSpec};
use crate::units::{Percent, Size};

/// The value of the most specific layer (the last one) that sets the field `f`, with
/// that layer's index.
pub(crate) fn pick<'a, T>(
    layers: &[&'a LinkParamsSpec],
    f: impl Fn(&'a LinkParamsSpec) -> Option<T>,
) -> Option<(T, usize)> {
    layers
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, layer)| f(layer).map(|v| (v, i)))
}

fn get<'a, T>(
    layers: &[&'a LinkParamsSpec],
    f: impl Fn(&'a LinkParamsSpec) -> Option<T>,
) -> Option<T> {
    pick(layers, f).map(|(v, _)| v)
}

pub(crate) fn limit_of(p: &LinkParamsSpec) -> Option<Size> {
    p.queue.as_ref().and_then(|q| q.limit)
}

pub(crate) fn aqm_of(p: &LinkParamsSpec) -> Option<&AqmSpec> {
    p.queue.as_ref().and_then(|q| q.aqm.as_ref())
}

/// The parameters of one direction. Runs after validation, so values are in range;
/// the saturating conversions only keep bad input from panicking.
pub(crate) fn resolve(layers: &[&LinkParamsSpec]) -> LinkParams {
    let ppm = |f: fn(&LinkParamsSpec) -> Option<Percent>| get(layers, f).map(|p| p.ppm());
    let limit = get(layers, limit_of);
    // A rate and a trace both decide when packets leave: the more specific wins
    // (one layer may not set both, `params_check`).
    let rate = pick(layers, |l| l.rate);
    let trace = pick(layers, |l| l.trace.as_ref())
        .filter(|(_, ti)| rate.is_none_or(|(_, ri)| ti > &ri))
        .and_then(|(t, _)| t.opportunities().ok());
    let traced = trace.is_some();
    LinkParams {
        rate_bps: rate.filter(|_| !traced).map(|(r, _)| r.bps()),
        trace_ms: trace.unwrap_or_default(),
        burst_bytes: get(layers, |l| l.burst)
            .filter(|_| !traced)
            .and_then(Size::bytes),
        delay: get(layers, |l| l.delay).map(|d| d.as_std()),
        jitter: get(layers, |l| l.jitter).map(|d| d.as_std()),
        jitter_distribution: get(layers, |l| l.jitter_distribution)
            .map_or(JitterDistribution::Uniform, distribution),
        loss_ppm: ppm(|l| l.loss),
        loss_correlation_ppm: ppm(|l| l.loss_correlation),
        reorder_ppm: ppm(|l| l.reorder),
        duplicate_ppm: ppm(|l| l.duplicate),
        corrupt_ppm: ppm(|l| l.corrupt),
        queue: QueueParams {
            limit_packets: limit.and_then(Size::packets).map(saturate_u32),
            limit_bytes: limit.and_then(Size::bytes),
            aqm: get(layers, aqm_of).map_or(Aqm::TailDrop, aqm),
        },
        scheduler: get(layers, |l| l.scheduler.as_ref()).map_or(SchedulerKind::Fcfs, scheduler),
        classes: get(layers, |l| l.classes.as_ref())
            .map(|classes| classes.iter().map(class).collect())
            .unwrap_or_default(),
    }
}

fn saturate_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

fn distribution(d: api::JitterDistribution) -> JitterDistribution {
    match d {
        api::JitterDistribution::Uniform => JitterDistribution::Uniform,
        api::JitterDistribution::Normal => JitterDistribution::Normal,
        api::JitterDistribution::Pareto => JitterDistribution::Pareto,
    }
}

fn aqm(a: &AqmSpec) -> Aqm {
    if let Some(red) = &a.red {
        Aqm::Red {
            min_packets: red.min,
            max_packets: red.max,
            max_p_ppm: red.max_p.ppm(),
            weight_ppm: red.weight.ppm(),
            ecn: red.ecn,
        }
    } else if let Some(ecn) = &a.ecn {
        Aqm::Ecn {
            threshold_packets: ecn.threshold,
        }
    } else if let Some(scheme) = &a.scheme {
        Aqm::Scheme {
            name: scheme.name.clone(),
            settings: scheme.settings.clone().unwrap_or_default(),
        }
    } else {
        Aqm::TailDrop
    }
}

fn scheduler(s: &SchedulerSpec) -> SchedulerKind {
    if let Some(wrr) = &s.wrr {
        SchedulerKind::Wrr {
            weights: wrr.weights.clone(),
        }
    } else if let Some(drr) = &s.drr {
        SchedulerKind::Drr {
            quantum_bytes: drr
                .quantum
                .iter()
                .map(|q| saturate_u32(q.bytes().unwrap_or(0)))
                .collect(),
        }
    } else if let Some(priority) = &s.priority {
        SchedulerKind::Priority {
            bands: priority.bands,
        }
    } else if let Some(scheme) = &s.scheme {
        SchedulerKind::Scheme {
            name: scheme.name.clone(),
            settings: scheme.settings.clone().unwrap_or_default(),
        }
    } else {
        SchedulerKind::Fcfs
    }
}

/// How many queues a scheduler spec serves; `None` when it names no single kind
/// (a problem reported on its own).
pub(crate) fn queue_count(s: Option<&SchedulerSpec>) -> Option<usize> {
    let Some(s) = s else {
        return Some(1);
    };
    if s.kinds_set() != 1 {
        return None;
    }
    Some(scheduler(s).queues()).filter(|&n| n > 0)
}

fn class(c: &ClassSpec) -> ClassRule {
    let narrow_u16 = |v: u32| u16::try_from(v).unwrap_or(u16::MAX);
    ClassRule {
        queue: c.queue,
        dscp: c.dscp.map(|d| u8::try_from(d).unwrap_or(u8::MAX)),
        src_port: c.src_port.map(narrow_u16),
        dst_port: c.dst_port.map(narrow_u16),
        protocol: c.protocol.map(|p| p.0),
        max_packet_bytes: c.max_packet_size.and_then(Size::bytes).map(saturate_u32),
    }
}
