//! Flows: the rules a `Flow` must satisfy, and what it becomes in the plan.
//! Workload descriptions are resolved here, once: a built-in or CSV size
//! distribution becomes its points, and a Poisson load on a bottleneck link
//! becomes a mean gap between arrivals, so agents only draw numbers.

use super::assemble::{Draft, DraftLink, name_of};
use super::errors::ValidationErrors;
use super::model::{
    CongestionControl, DEFAULT_WINDOW, FlowAmount, FlowParams, FlowProtocol, PlannedFlow,
    PlannedLink, RelayMode,
};
use super::routes::Graph;
use crate::api::{self, FlowSpec};
use crate::units::Size;
use std::collections::{HashMap, HashSet};

/// The DCTCP web-search flow sizes, shipped with the repository.
pub const WEB_SEARCH_CSV: &str = include_str!("../../../data/workloads/websearch.csv");
/// Socket buffers a flow may ask for: at least a few segments, at most what an
/// agent can afford per connection.
const WINDOW_MIN: u64 = 4 * 1024;
const WINDOW_MAX: u64 = 64 * 1024 * 1024;
/// Points of a size distribution, at most.
const CDF_POINTS_MAX: usize = 10_000;

pub(crate) fn check(draft: &Draft, graph: &Graph, errors: &mut ValidationErrors) {
    let components = graph.components();
    let mut names: HashMap<&str, &str> = HashMap::new();
    for doc in &draft.flows {
        let origin = doc.origin.as_str();
        let name = name_of(&doc.object);
        if let Some(first) = names.insert(name, origin) {
            errors.push(
                origin,
                "metadata.name",
                format!("duplicate Flow {name:?} (also {first})"),
            );
        }
        let spec = &doc.object.spec;
        workload(origin, spec, errors);
        let unknown = |field: &str, node: &str, errors: &mut ValidationErrors| {
            errors.push(
                origin,
                field,
                format!("no node {node:?} in topology {:?}", draft.name),
            );
        };
        let src = graph.index_of(&spec.src);
        let dst = graph.index_of(&spec.dst);
        if src.is_none() {
            unknown("spec.src", &spec.src, errors);
        }
        if dst.is_none() {
            unknown("spec.dst", &spec.dst, errors);
        }
        if spec.src == spec.dst {
            errors.push(
                origin,
                "spec.dst",
                format!("src and dst are the same node {:?}", spec.dst),
            );
            continue;
        }
        let route_ok = match &spec.path {
            Some(path) => check_path(
                draft,
                graph,
                origin,
                "spec.path",
                (&spec.src, &spec.dst),
                path,
                errors,
            ),
            None => match (src, dst) {
                (Some(s), Some(d)) if components[s] != components[d] => {
                    errors.push(
                        origin,
                        "spec.dst",
                        format!(
                            "{:?} cannot be reached from {:?}: no links connect them",
                            spec.dst, spec.src
                        ),
                    );
                    false
                }
                (Some(_), Some(_)) => true,
                _ => false,
            },
        };
        if route_ok {
            poisson_link(draft, graph, origin, spec, errors);
        }
    }
}

/// Checks everything about what the flow sends and when.
fn workload(origin: &str, spec: &FlowSpec, errors: &mut ValidationErrors) {
    if spec.count == 0 {
        errors.push(origin, "spec.count", "must be at least 1");
    }
    if spec.parallelism == Some(0) {
        errors.push(origin, "spec.parallelism", "must be at least 1");
    }
    let amounts = [
        ("spec.size", spec.size.is_some()),
        ("spec.sizes", spec.sizes.is_some()),
        ("spec.duration", spec.duration.is_some()),
    ];
    if let Some((field, _)) = amounts.iter().filter(|(_, set)| *set).nth(1) {
        errors.push(origin, *field, "set at most one of size, sizes, duration");
    }
    match spec.size {
        Some(Size::Packets(_)) => errors.push(origin, "spec.size", "must be in bytes, e.g. 100MB"),
        Some(Size::Bytes(0)) => errors.push(origin, "spec.size", "must be greater than 0"),
        _ => {}
    }
    if let Some(sizes) = &spec.sizes {
        match (&sizes.builtin, &sizes.csv) {
            (Some(_), None) => {}
            (None, Some(csv)) => {
                if let Err(reason) = parse_csv(csv) {
                    errors.push(origin, "spec.sizes.csv", reason);
                }
            }
            _ => errors.push(origin, "spec.sizes", "set exactly one of builtin, csv"),
        }
    }
    if spec.duration.is_some_and(|d| d.as_std().is_zero()) {
        errors.push(origin, "spec.duration", "must be greater than 0");
    }
    match spec.rate {
        Some(r) if r.bps() == 0 => errors.push(origin, "spec.rate", "must be greater than 0"),
        None if spec.protocol == api::FlowProtocol::Udp => errors.push(
            origin,
            "spec.rate",
            "udp flows send at a constant rate: set one, e.g. 10Mbit",
        ),
        _ => {}
    }
    if spec.mode == api::FlowMode::Max {
        if spec.protocol == api::FlowProtocol::Udp {
            errors.push(
                origin,
                "spec.mode",
                "max mode relays TCP connections; a udp flow cannot use it (use protocol tcp or mode normal)",
            );
        }
        if spec.rate.is_some() {
            errors.push(
                origin,
                "spec.rate",
                "max mode runs at the speed of the machine; a rate does not apply (remove it or use mode normal)",
            );
        }
        // Max mode's instances are the kernel's own TCP connections, relayed
        // past the synthetic stack and the link pipeline: none of these reach them.
        for (field, set) in [
            ("spec.window", spec.window.is_some()),
            ("spec.congestionControl", spec.congestion_control.is_some()),
            ("spec.dscp", spec.dscp.is_some()),
            ("spec.dscpBySize", spec.dscp_by_size.is_some()),
        ] {
            if set {
                errors.push(
                    origin,
                    field,
                    "max mode relays kernel TCP connections past the emulated links; this does not apply (remove it or use mode normal)",
                );
            }
        }
    }
    match spec.window {
        None => {}
        Some(Size::Bytes(b)) if (WINDOW_MIN..=WINDOW_MAX).contains(&b) => {}
        Some(_) => errors.push(
            origin,
            "spec.window",
            "must be between 4KiB and 64MiB, in bytes",
        ),
    }
    if spec.dscp.is_some_and(|d| d > 63) {
        errors.push(origin, "spec.dscp", "must be between 0 and 63");
    }
    for (i, rule) in spec.dscp_by_size.iter().flatten().enumerate() {
        if rule.max_size.bytes().is_none() {
            errors.push(
                origin,
                format!("spec.dscpBySize[{i}].maxSize"),
                "must be in bytes, e.g. 100KB",
            );
        }
        if rule.dscp > 63 {
            errors.push(
                origin,
                format!("spec.dscpBySize[{i}].dscp"),
                "must be between 0 and 63",
            );
        }
    }
    if let Some(arrivals) = &spec.arrivals {
        let p = &arrivals.poisson;
        let field = "spec.arrivals.poisson";
        match (p.load, &p.link, p.mean_interval) {
            (Some(load), Some(_), None) => {
                if load.ppm() == 0 {
                    errors.push(origin, format!("{field}.load"), "must be greater than 0%");
                }
                if spec.size.is_none() && spec.sizes.is_none() {
                    errors.push(
                        origin,
                        format!("{field}.load"),
                        "a load becomes arrivals through the mean flow size: set size or sizes, or use meanInterval",
                    );
                }
            }
            (None, None, Some(gap)) => {
                if gap.as_std().is_zero() {
                    errors.push(
                        origin,
                        format!("{field}.meanInterval"),
                        "must be greater than 0",
                    );
                }
            }
            (Some(_), None, None) => errors.push(
                origin,
                format!("{field}.link"),
                "a load needs the link it loads",
            ),
            (None, Some(_), None) => errors.push(
                origin,
                format!("{field}.load"),
                "the link needs a load, e.g. 30%",
            ),
            _ => errors.push(origin, field, "set either load and link, or meanInterval"),
        }
    }
}

/// Checks an explicit path from `src` to `dst` given at `field` (a flow's
/// `spec.path`, a route event's `...route.path`); true when it is usable.
pub(super) fn check_path(
    draft: &Draft,
    graph: &Graph,
    origin: &str,
    field: &str,
    (src, dst): (&str, &str),
    path: &[String],
    errors: &mut ValidationErrors,
) -> bool {
    let before = errors.len();
    let (Some(first), Some(last)) = (path.first(), path.last()) else {
        errors.push(
            origin,
            field,
            "must list the nodes from src to dst, both included",
        );
        return false;
    };
    if first != src {
        errors.push(
            origin,
            format!("{field}[0]"),
            format!("the path must start at src {src:?}, not {first:?}"),
        );
    }
    if last != dst {
        let i = path.len() - 1;
        errors.push(
            origin,
            format!("{field}[{i}]"),
            format!("the path must end at dst {dst:?}, not {last:?}"),
        );
    }
    let mut visited = HashSet::new();
    let mut previous: Option<(usize, &str)> = None;
    for (i, node) in path.iter().enumerate() {
        let field = format!("{field}[{i}]");
        let Some(index) = graph.index_of(node) else {
            errors.push(
                origin,
                field,
                format!("no node {node:?} in topology {:?}", draft.name),
            );
            previous = None;
            continue;
        };
        if !visited.insert(index) {
            errors.push(
                origin,
                &field,
                format!("node {node:?} appears twice: the path has a cycle"),
            );
        }
        if let Some((prev, prev_name)) = previous
            && graph.link_between(prev, index).is_none()
        {
            errors.push(
                origin,
                &field,
                format!("no link between {prev_name:?} and {node:?}"),
            );
        }
        previous = Some((index, node));
    }
    errors.len() == before
}

/// The node path a flow takes: its explicit path or the shortest one.
fn route<'g>(graph: &Graph<'g>, spec: &FlowSpec) -> Option<Vec<String>> {
    if let Some(path) = &spec.path {
        return Some(path.clone());
    }
    let src = graph.index_of(&spec.src)?;
    let dst = graph.index_of(&spec.dst)?;
    let nodes = graph.shortest_path(src, dst)?;
    Some(nodes.iter().map(|&i| graph.names[i].to_owned()).collect())
}

/// Whether the path crosses `link` and in which direction: `Some(true)` when
/// it goes from the link's first endpoint to its second (forward).
fn crossing(path: &[String], endpoints: &[String]) -> Option<bool> {
    let [a, b] = endpoints else {
        return None;
    };
    path.windows(2).find_map(|hop| {
        if hop[0] == *a && hop[1] == *b {
            Some(true)
        } else if hop[0] == *b && hop[1] == *a {
            Some(false)
        } else {
            None
        }
    })
}

/// The rate of one direction of a draft link after inheritance, as the plan
/// will have it.
fn draft_rate(draft: &Draft, link: &DraftLink, forward: bool) -> Option<u64> {
    let over = if forward {
        link.forward.as_ref()
    } else {
        link.backward.as_ref()
    };
    let layers = draft.layers(link, over, &[]);
    // A trace's mean counts as the rate.
    super::params::resolve(&layers).mean_rate_bps()
}

/// A Poisson load names a link on the flow's path that has a rate.
fn poisson_link(
    draft: &Draft,
    graph: &Graph,
    origin: &str,
    spec: &FlowSpec,
    errors: &mut ValidationErrors,
) {
    let Some(name) = spec.arrivals.as_ref().and_then(|a| a.poisson.link.as_ref()) else {
        return;
    };
    let field = "spec.arrivals.poisson.link";
    let Some(link) = draft.links.iter().find(|l| l.name == *name) else {
        errors.push(
            origin,
            field,
            format!("no link {name:?} in topology {:?}", draft.name),
        );
        return;
    };
    let Some(path) = route(graph, spec) else {
        return;
    };
    let Some(forward) = crossing(&path, &link.endpoints) else {
        errors.push(
            origin,
            field,
            format!(
                "link {name:?} is not on the flow's path {}",
                path.join(" → ")
            ),
        );
        return;
    };
    if draft_rate(draft, link, forward).is_none_or(|r| r == 0) {
        let (from, to) = if forward {
            (&link.endpoints[0], &link.endpoints[1])
        } else {
            (&link.endpoints[1], &link.endpoints[0])
        };
        errors.push(
            origin,
            field,
            format!(
                "link {name:?} has no rate from {from:?} to {to:?}, so a load of it means nothing: give it a rate or use meanInterval"
            ),
        );
    }
}

/// Parses a size distribution: `bytes,probability` lines; `#` comments, blank
/// lines and a header line are skipped. Probabilities in percent (last = 100)
/// are scaled to 0..1.
pub fn parse_csv(text: &str) -> Result<Vec<(u64, f64)>, String> {
    let mut points = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |reason: String| format!("line {}: {reason}", i + 1);
        let fields: Vec<&str> = line
            .split([',', ';', '\t', ' '])
            .filter(|f| !f.is_empty())
            .collect();
        let [bytes, p] = fields.as_slice() else {
            return Err(at(format!("expected `bytes,probability`, found {line:?}")));
        };
        let (Ok(bytes), Ok(p)) = (bytes.parse::<f64>(), p.parse::<f64>()) else {
            if points.is_empty() && bytes.parse::<f64>().is_err() {
                continue; // a header line
            }
            return Err(at(format!("{line:?} is not two numbers")));
        };
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 || !p.is_finite() || p < 0.0
        {
            return Err(at(format!("{line:?} is out of range")));
        }
        points.push((bytes.round() as u64, p));
        if points.len() > CDF_POINTS_MAX {
            return Err(format!("more than {CDF_POINTS_MAX} points"));
        }
    }
    let last = points.last().map(|&(_, p)| p).ok_or("no points")?;
    let scale = if (last - 100.0).abs() < 1e-9 {
        100.0
    } else {
        1.0
    };
    for p in &mut points {
        p.1 /= scale;
    }
    for (i, pair) in points.windows(2).enumerate() {
        if pair[1].0 < pair[0].0 || pair[1].1 < pair[0].1 {
            return Err(format!(
                "point {}: sizes and probabilities must not decrease",
                i + 2
            ));
        }
    }
    if points.iter().any(|&(_, p)| p > 1.0) {
        return Err("probabilities must be between 0 and 1 (or 0 and 100)".into());
    }
    if (points[points.len() - 1].1 - 1.0).abs() > 1e-9 {
        return Err(format!(
            "the last probability is {last}, not 1 (or 100): the distribution must be complete"
        ));
    }
    Ok(points)
}

/// Mean size of a distribution: the first point's mass plus each segment at its
/// midpoint (linear interpolation, as the agents draw).
pub fn cdf_mean(points: &[(u64, f64)]) -> f64 {
    let first = points.first().map_or(0.0, |&(b, p)| b as f64 * p);
    first
        + points
            .windows(2)
            .map(|w| (w[1].1 - w[0].1) * (w[0].0 + w[1].0) as f64 / 2.0)
            .sum::<f64>()
}

/// Turns validated Flows into planned ones; `links` are the planned links, whose
/// rates Poisson loads refer to.
pub(crate) fn build(draft: &Draft, links: &[PlannedLink]) -> Vec<PlannedFlow> {
    let graph = Graph::new(
        draft.nodes.iter().map(|n| n.name.as_str()),
        links
            .iter()
            .map(|l| (l.name.as_str(), l.dialer.as_str(), l.acceptor.as_str())),
    );
    let mut flows: Vec<PlannedFlow> = draft
        .flows
        .iter()
        .map(|doc| {
            let spec = &doc.object.spec;
            let name = name_of(&doc.object);
            let mut params = params(spec, &graph, links);
            if spec.seed.is_none() {
                params.seed = flow_seed(draft.doc.object.spec.seed, name);
            }
            PlannedFlow {
                name: name.to_owned(),
                src: spec.src.clone(),
                dst: spec.dst.clone(),
                path: spec.path.clone(),
                params,
                defined_generation: 0,
                route_id: None,
            }
        })
        .collect();
    flows.sort_by(|a, b| a.name.cmp(&b.name));
    flows
}

/// A flow without a seed of its own: 1 as before when the topology has none,
/// else a stream of the experiment's seed per flow name (FNV-1a over both), so
/// flows of one experiment do not draw the same sizes.
fn flow_seed(experiment: Option<u64>, flow: &str) -> u64 {
    let Some(seed) = experiment else {
        return 1;
    };
    seed.to_le_bytes()
        .iter()
        .chain(flow.as_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        })
}

fn params(spec: &FlowSpec, graph: &Graph, links: &[PlannedLink]) -> FlowParams {
    let amount = if let Some(b) = spec.size.and_then(Size::bytes) {
        FlowAmount::Bytes(b)
    } else if let Some(sizes) = &spec.sizes {
        let points = match (&sizes.builtin, &sizes.csv) {
            (Some(api::BuiltinSizes::WebSearch), _) => parse_csv(WEB_SEARCH_CSV),
            (None, Some(csv)) => parse_csv(csv),
            (None, None) => Ok(Vec::new()),
        };
        FlowAmount::Cdf(points.unwrap_or_default())
    } else if let Some(d) = spec.duration {
        FlowAmount::DurationUs(micros(d.as_std()))
    } else {
        FlowAmount::Unbounded
    };
    let mean_size = match &amount {
        FlowAmount::Bytes(b) => Some(*b as f64),
        FlowAmount::Cdf(points) => Some(cdf_mean(points)),
        _ => None,
    };
    let mean_interarrival_us = spec.arrivals.as_ref().and_then(|a| {
        let p = &a.poisson;
        if let Some(gap) = p.mean_interval {
            return Some(micros(gap.as_std()).max(1));
        }
        let (load, name) = (p.load?, p.link.as_ref()?);
        let link = links.iter().find(|l| l.name == *name)?;
        let path = route(graph, spec)?;
        let forward = crossing(&path, &[link.dialer.clone(), link.acceptor.clone()])?;
        let rate = if forward {
            &link.forward
        } else {
            &link.backward
        }
        .mean_rate_bps()?;
        // Arrivals per second = load × rate / (8 × mean size).
        let per_second = f64::from(load.ppm()) / 1e6 * rate as f64 / (8.0 * mean_size?);
        (per_second > 0.0).then(|| ((1e6 / per_second).round() as u64).max(1))
    });
    FlowParams {
        protocol: match spec.protocol {
            api::FlowProtocol::Tcp => FlowProtocol::Tcp,
            api::FlowProtocol::Udp => FlowProtocol::Udp,
        },
        amount,
        rate_bps: spec.rate.map(|r| r.bps()),
        start_delay_us: spec.start_delay.map_or(0, |d| micros(d.as_std())),
        count: spec.count,
        parallelism: spec.parallelism.unwrap_or(0),
        mean_interarrival_us,
        seed: spec.seed.unwrap_or(1),
        window_bytes: spec
            .window
            .and_then(Size::bytes)
            .map_or(DEFAULT_WINDOW, |b| u32::try_from(b).unwrap_or(u32::MAX)),
        congestion_control: match spec.congestion_control {
            None | Some(api::CongestionControl::Cubic) => CongestionControl::Cubic,
            Some(api::CongestionControl::Reno) => CongestionControl::Reno,
            Some(api::CongestionControl::None) => CongestionControl::None,
        },
        dscp: spec.dscp.map_or(0, |d| d.min(63) as u8),
        dscp_by_size: spec
            .dscp_by_size
            .iter()
            .flatten()
            .map(|r| (r.max_size.bytes().unwrap_or(0), r.dscp.min(63) as u8))
            .collect(),
        mode: match spec.mode {
            api::FlowMode::Normal => RelayMode::Normal,
            api::FlowMode::Max => RelayMode::Max,
        },
    }
}

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
