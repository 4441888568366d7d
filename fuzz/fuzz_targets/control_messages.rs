//! Control messages: arbitrary bytes decoded (prost) as the hub's
//! `ControllerMessage`, a bare `Snapshot` or `Delta`, and the agent's
//! `AgentMessage`; whatever decodes is fed to the agent's pure config handling:
//! `RouteTable::from_proto` (any link name resolves), lookups in the table,
//! `synth::task::parse_all`, `sched::Pipeline::new` for every `LinkParams`, and
//! a short run of some pipelines (enqueue/poll with a fake clock, reconfigured
//! in place to the other links' parameters). Nothing may panic, and the
//! pipeline's books must balance (see `nextmini_fuzz::traffic`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use nextmini_agent::flow::{FlowKey, PROTO_TCP, PROTO_UDP};
use nextmini_agent::link::Outbound;
use nextmini_agent::routing::{Decision, DropReason, RouteTable};
use nextmini_agent::sched::Pipeline;
use nextmini_agent::synth::task;
use nextmini_agent::synth::workload::Amount;
use nextmini_fuzz::{Rng, traffic};
use nextmini_proto::v1 as pb;
use prost::Message;
use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};

/// MTU the agent uses when the snapshot's is not one it would accept.
const DEFAULT_MTU: u32 = 1400;
/// Pipelines run per input, and packets offered to each.
const RUNS: usize = 3;
const PACKETS: usize = 32;

fuzz_target!(|data: &[u8]| {
    let mut rng = Rng::from_bytes(data);
    if let Ok(msg) = pb::ControllerMessage::decode(data) {
        check_reencode(&msg);
        match msg.msg {
            Some(pb::controller_message::Msg::Snapshot(s)) => snapshot(&s, &mut rng),
            Some(pb::controller_message::Msg::Delta(d)) => delta(&d, DEFAULT_MTU, &mut rng),
            _ => {}
        }
    }
    if let Ok(s) = pb::Snapshot::decode(data) {
        check_reencode(&s);
        snapshot(&s, &mut rng);
    }
    if let Ok(d) = pb::Delta::decode(data) {
        check_reencode(&d);
        delta(&d, DEFAULT_MTU, &mut rng);
    }
    if let Ok(m) = pb::AgentMessage::decode(data) {
        check_reencode(&m);
        // No doubles in an AgentMessage, so it compares equal after a round trip.
        let again = pb::AgentMessage::decode(&m.encode_to_vec()[..]).expect("re-decodes");
        assert_eq!(again, m);
    }
});

/// Encoding is canonical: what decoded re-encodes to bytes that decode and
/// re-encode to the same bytes (unknown fields are dropped on the first pass).
fn check_reencode<M: Message + Default>(msg: &M) {
    let bytes = msg.encode_to_vec();
    assert_eq!(bytes.len(), msg.encoded_len());
    let again = M::decode(&bytes[..]).expect("re-decodes");
    assert_eq!(again.encode_to_vec(), bytes);
}

fn snapshot(s: &pb::Snapshot, rng: &mut Rng) {
    if let Ok(tasks) = task::parse_all(&s.flows) {
        for t in &tasks {
            if let task::Task::Source(src) = t
                && let Amount::Cdf(cdf) = &src.workload.amount
            {
                for u in [f64::MIN_POSITIVE, 1e-9, 0.25, 0.5, 0.999_999, 1.0] {
                    assert!(cdf.sample(u) >= 1, "a flow sends at least one byte");
                }
                let _ = cdf.mean();
            }
        }
    }
    // The agent refuses a snapshot whose MTU is not 576..=65535 before building
    // any link; the pipelines are still worth building with its default.
    let raw_mtu = s
        .node
        .as_ref()
        .and_then(|n| n.dataplane.as_ref())
        .map_or(0, |d| d.mtu);
    let mtu = if (576..=65_535).contains(&raw_mtu) {
        raw_mtu
    } else {
        DEFAULT_MTU
    };
    links(&s.links, mtu, rng);
    if let Some(routes) = &s.routes {
        route_table(routes, rng);
    }
}

fn delta(d: &pb::Delta, mtu: u32, rng: &mut Rng) {
    links(&d.upsert_links, mtu, rng);
    if let Some(routes) = &d.routes {
        route_table(routes, rng);
    }
}

fn links(links: &[pb::LinkConfig], mtu: u32, rng: &mut Rng) {
    let params: Vec<pb::LinkParams> = links
        .iter()
        .map(|l| l.params.clone().unwrap_or_default())
        .collect();
    let mut runs = 0;
    for (i, p) in params.iter().enumerate() {
        // What `build_links` and `LinkHandle::set_params` check.
        let Ok(pipeline) = Pipeline::<Outbound>::new(p, mtu, i as u64) else {
            continue;
        };
        if runs < RUNS {
            runs += 1;
            // Reconfigured in place to the next links' parameters, valid or not.
            let changes: Vec<&pb::LinkParams> = params.iter().skip(i + 1).take(2).collect();
            traffic::run(pipeline, p, &changes, PACKETS, rng);
        }
    }
}

fn route_table(routes: &pb::RouteTable, rng: &mut Rng) {
    let Ok(table) = RouteTable::from_proto(routes, |name| Some(name.to_owned())) else {
        return;
    };
    // Every flow rule names a label route, so a rule never leads nowhere.
    let mut addrs: Vec<IpAddr> = routes
        .destinations
        .iter()
        .filter_map(|d| d.overlay_addr.parse().ok())
        .collect();
    addrs.extend(
        routes
            .ranges
            .iter()
            .flat_map(|r| [&r.first, &r.last])
            .filter_map(|a| a.parse::<IpAddr>().ok()),
    );
    addrs.extend(
        routes
            .flow_rules
            .iter()
            .flat_map(|r| [&r.src_addr, &r.dst_addr])
            .filter_map(|a| a.parse::<IpAddr>().ok()),
    );
    addrs.push(Ipv4Addr::new(198, 18, 0, 1).into());
    let ports: Vec<u16> = routes
        .flow_rules
        .iter()
        .flat_map(|r| [r.src_port, r.dst_port])
        .map(|p| p as u16)
        .chain([80, 61000])
        .collect();
    for _ in 0..16 {
        let key = FlowKey {
            src: *rng.pick(&addrs).expect("not empty"),
            dst: *rng.pick(&addrs).expect("not empty"),
            protocol: match routes.flow_rules.get(rng.below(8) as usize) {
                Some(r) => r.protocol as u8,
                None => *rng.pick(&[PROTO_TCP, PROTO_UDP]).expect("not empty"),
            },
            src_port: *rng.pick(&ports).expect("not empty"),
            dst_port: *rng.pick(&ports).expect("not empty"),
        };
        let decision = table.lookup(&key, 0);
        assert_ne!(
            decision,
            Decision::Drop(DropReason::UnknownLabel),
            "a flow rule led to a missing label route: {key:?}"
        );
        if let Decision::Forward { link, .. } = &decision {
            assert!(known_link(routes, link), "{link} is not in the table");
        }
        assert_eq!(table.lookup(&key, 0), decision, "lookups are stable");
    }
    // Labels: every label route is followed, others are unknown.
    for route in &routes.labels {
        let key = FlowKey {
            src: addrs[0],
            dst: addrs[0],
            protocol: PROTO_TCP,
            src_port: 1,
            dst_port: 2,
        };
        let expected = if route.next_link.is_empty() {
            Decision::Local
        } else {
            Decision::Forward {
                link: route.next_link.clone(),
                label: route.route_id,
            }
        };
        assert_eq!(table.lookup(&key, route.route_id), expected);
    }
    let ids: HashSet<u32> = routes.labels.iter().map(|l| l.route_id).collect();
    let unused = (1..=u32::MAX)
        .find(|id| !ids.contains(id))
        .expect("some id is free");
    let key = FlowKey {
        src: addrs[0],
        dst: addrs[0],
        protocol: PROTO_UDP,
        src_port: 1,
        dst_port: 2,
    };
    assert_eq!(
        table.lookup(&key, unused),
        Decision::Drop(DropReason::UnknownLabel)
    );
}

fn known_link(routes: &pb::RouteTable, link: &str) -> bool {
    routes
        .destinations
        .iter()
        .flat_map(|d| &d.next_hops)
        .chain(routes.ranges.iter().flat_map(|r| &r.next_hops))
        .any(|h| h.link == link)
        || routes.labels.iter().any(|l| l.next_link == link)
}
