//! A snapshot's flow tasks, checked and turned into what the driver runs. A bad
//! task refuses the whole snapshot, naming the field, like a bad link does.

use super::cdf::SizeCdf;
use super::stack::{Congestion, FlowRef, Protocol};
use super::workload::{Amount, WorkloadSpec};
use nextmini_proto::v1 as pb;
use std::net::Ipv4Addr;
use std::time::Duration;
use thiserror::Error;

/// Largest socket buffer: smoltcp refuses more than 1 GiB, and a window this
/// large already covers 1 Gbit/s over half a second.
pub const MAX_WINDOW: u32 = 64 << 20;

#[derive(Debug, Error, PartialEq)]
#[error("flows[{index}] ({name}).{field}: {reason}")]
pub struct TaskError {
    pub index: usize,
    pub name: String,
    pub field: &'static str,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SourceTask {
    pub flow: FlowRef,
    pub peer: Ipv4Addr,
    pub protocol: Protocol,
    pub workload: WorkloadSpec,
    pub rate_bps: Option<u64>,
    pub start_delay: Duration,
    pub label: u32,
    pub window: usize,
    pub congestion: Congestion,
    pub dscp: u8,
    /// (largest size, DSCP), first match wins.
    pub dscp_by_size: Vec<(u64, u8)>,
    /// Max: each instance is a kernel TCP connection through the max-mode relays.
    pub mode: crate::relay::Mode,
}

impl SourceTask {
    /// The DSCP of an instance of `size` bytes (`None`: no size).
    pub fn dscp_for(&self, size: Option<u64>) -> u8 {
        size.and_then(|s| {
            self.dscp_by_size
                .iter()
                .find(|(max, _)| s <= *max)
                .map(|(_, d)| *d)
        })
        .unwrap_or(self.dscp)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SinkTask {
    pub flow: FlowRef,
    pub protocol: Protocol,
    pub window: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Task {
    Source(SourceTask),
    Sink(SinkTask),
}

impl Task {
    pub fn flow(&self) -> &FlowRef {
        match self {
            Task::Source(s) => &s.flow,
            Task::Sink(s) => &s.flow,
        }
    }
}

pub fn parse_all(tasks: &[pb::FlowTask]) -> Result<Vec<Task>, TaskError> {
    tasks.iter().enumerate().map(|(i, t)| parse(i, t)).collect()
}

fn parse(index: usize, t: &pb::FlowTask) -> Result<Task, TaskError> {
    let err = |field: &'static str, reason: String| TaskError {
        index,
        name: t.name.clone(),
        field,
        reason,
    };
    if t.name.is_empty() {
        return Err(err("name", "must not be empty".into()));
    }
    let flow = FlowRef {
        name: t.name.as_str().into(),
        defined_generation: t.defined_generation,
    };
    let protocol = match pb::FlowProtocol::try_from(t.protocol) {
        Ok(pb::FlowProtocol::Tcp) => Protocol::Tcp,
        Ok(pb::FlowProtocol::Udp) => Protocol::Udp,
        Err(_) => return Err(err("protocol", format!("unknown protocol {}", t.protocol))),
    };
    if t.window_bytes > MAX_WINDOW {
        return Err(err(
            "windowBytes",
            format!("{} is more than {MAX_WINDOW}", t.window_bytes),
        ));
    }
    let window = (t.window_bytes as usize).max(1024);
    match pb::FlowRole::try_from(t.role) {
        Ok(pb::FlowRole::Sink) => {
            return Ok(Task::Sink(SinkTask {
                flow,
                protocol,
                window,
            }));
        }
        Ok(pb::FlowRole::Source) => {}
        _ => return Err(err("role", "must be source or sink".into())),
    }
    let peer: Ipv4Addr = t
        .peer_addr
        .parse()
        .map_err(|e| err("peerAddr", format!("{:?}: {e}", t.peer_addr)))?;
    let set = [t.size_bytes > 0, !t.size_cdf.is_empty(), t.duration_us > 0];
    if set.iter().filter(|s| **s).count() > 1 {
        return Err(err(
            "sizeBytes",
            "set at most one of sizeBytes, sizeCdf, durationUs".into(),
        ));
    }
    let amount = if t.size_bytes > 0 {
        Amount::Bytes(t.size_bytes)
    } else if !t.size_cdf.is_empty() {
        let points = t
            .size_cdf
            .iter()
            .map(|p| (p.bytes, p.probability))
            .collect();
        Amount::Cdf(SizeCdf::new(points).map_err(|e| err("sizeCdf", e.to_string()))?)
    } else if t.duration_us > 0 {
        Amount::For(Duration::from_micros(t.duration_us))
    } else {
        Amount::Forever
    };
    if protocol == Protocol::Udp && t.rate_bps == 0 {
        return Err(err(
            "rateBps",
            "udp flows send at a rate, which must be set".into(),
        ));
    }
    let congestion = match t.congestion_control.as_str() {
        "" | "cubic" => Congestion::Cubic,
        "reno" => Congestion::Reno,
        "none" => Congestion::None,
        other => {
            return Err(err(
                "congestionControl",
                format!("{other:?} is not cubic, reno or none"),
            ));
        }
    };
    let dscp = |d: u32, field| {
        u8::try_from(d)
            .ok()
            .filter(|d| *d < 64)
            .ok_or_else(|| err(field, format!("{d} is not a DSCP (0-63)")))
    };
    let mode = match pb::RelayMode::try_from(t.mode) {
        Ok(pb::RelayMode::Normal) => crate::relay::Mode::Normal,
        Ok(pb::RelayMode::Max) if protocol == Protocol::Tcp => crate::relay::Mode::Max,
        Ok(pb::RelayMode::Max) => {
            return Err(err("mode", "max mode relays TCP connections only".into()));
        }
        Err(_) => return Err(err("mode", format!("unknown mode {}", t.mode))),
    };
    Ok(Task::Source(SourceTask {
        mode,
        flow,
        peer,
        protocol,
        workload: WorkloadSpec {
            count: t.count,
            parallelism: t.parallelism,
            amount,
            mean_interarrival: (t.mean_interarrival_us > 0)
                .then(|| Duration::from_micros(t.mean_interarrival_us)),
            seed: t.seed,
        },
        rate_bps: (t.rate_bps > 0).then_some(t.rate_bps),
        start_delay: Duration::from_micros(t.start_delay_us),
        label: t.route_id,
        window,
        congestion,
        dscp: dscp(t.dscp, "dscp")?,
        dscp_by_size: t
            .dscp_by_size
            .iter()
            .map(|r| Ok((r.max_bytes, dscp(r.dscp, "dscpBySize")?)))
            .collect::<Result<_, TaskError>>()?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> pb::FlowTask {
        pb::FlowTask {
            name: "bulk".into(),
            defined_generation: 4,
            role: pb::FlowRole::Source as i32,
            peer_addr: "198.18.0.3".into(),
            count: 2,
            size_bytes: 1000,
            window_bytes: 65536,
            dscp_by_size: vec![pb::DscpBySize {
                max_bytes: 100_000,
                dscp: 46,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_source_task_becomes_a_workload() {
        let Ok(Task::Source(s)) = parse(0, &source()) else {
            panic!("a source");
        };
        assert_eq!(s.workload.amount, Amount::Bytes(1000));
        assert_eq!(s.congestion, Congestion::Cubic);
        assert_eq!(
            (
                s.dscp_for(Some(1000)),
                s.dscp_for(Some(200_000)),
                s.dscp_for(None)
            ),
            (46, 0, 0)
        );
    }

    #[test]
    fn bad_tasks_name_their_field() {
        let bad = pb::FlowTask {
            duration_us: 5,
            ..source()
        };
        assert_eq!(parse(3, &bad).map_err(|e| e.field), Err("sizeBytes"));
        let udp = pb::FlowTask {
            protocol: pb::FlowProtocol::Udp as i32,
            ..source()
        };
        let e = parse(1, &udp)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(
            e,
            "flows[1] (bulk).rateBps: udp flows send at a rate, which must be set"
        );
        let cdf = pb::FlowTask {
            size_bytes: 0,
            size_cdf: vec![pb::CdfPoint {
                bytes: 10,
                probability: 0.5,
            }],
            ..source()
        };
        assert_eq!(parse(0, &cdf).map_err(|e| e.field), Err("sizeCdf"));
        let addr = pb::FlowTask {
            peer_addr: "c".into(),
            ..source()
        };
        assert_eq!(parse(0, &addr).map_err(|e| e.field), Err("peerAddr"));
        let udp_max = pb::FlowTask {
            protocol: pb::FlowProtocol::Udp as i32,
            rate_bps: 1000,
            mode: pb::RelayMode::Max as i32,
            ..source()
        };
        assert_eq!(parse(0, &udp_max).map_err(|e| e.field), Err("mode"));
    }

    #[test]
    fn max_mode_is_carried() {
        let max = pb::FlowTask {
            mode: pb::RelayMode::Max as i32,
            ..source()
        };
        let Ok(Task::Source(s)) = parse(0, &max) else {
            panic!("a source");
        };
        assert_eq!(s.mode, crate::relay::Mode::Max);
        let Ok(Task::Source(s)) = parse(0, &source()) else {
            panic!("a source");
        };
        assert_eq!(s.mode, crate::relay::Mode::Normal);
    }
}
