//! The dataplane's counters as Prometheus metric families, read at scrape time.

use super::Source;
use crate::counters::LinkCounters;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

type Labels<'a> = Vec<(&'static str, &'a str)>;

/// A metric family's descriptor. `name` excludes the unit, which the encoder
/// appends (and, for counters, `_total` after it).
struct Desc {
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
}

fn desc(name: &'static str, unit: Option<Unit>, help: &'static str) -> Desc {
    Desc { name, help, unit }
}

fn counters<'a>(
    encoder: &mut DescriptorEncoder,
    d: &Desc,
    series: impl IntoIterator<Item = (Labels<'a>, u64)>,
) -> fmt::Result {
    let mut family =
        encoder.encode_descriptor(d.name, d.help, d.unit.as_ref(), MetricType::Counter)?;
    for (labels, value) in series {
        family
            .encode_family(&labels)?
            .encode_counter::<NoLabelSet, _, u64>(&value, None)?;
    }
    Ok(())
}

fn gauges<'a>(
    encoder: &mut DescriptorEncoder,
    d: &Desc,
    series: impl IntoIterator<Item = (Labels<'a>, f64)>,
) -> fmt::Result {
    let mut family =
        encoder.encode_descriptor(d.name, d.help, d.unit.as_ref(), MetricType::Gauge)?;
    for (labels, value) in series {
        family.encode_family(&labels)?.encode_gauge(&value)?;
    }
    Ok(())
}

fn get(a: &AtomicU64) -> u64 {
    a.load(Relaxed)
}

/// Per-link families (bytes, packets, drops by cause, ECN marks, queue depth,
/// configured rate, RTT, state) and the agent's own (stream, generation, TUN
/// packets, drops outside links).
pub struct DataplaneCollector {
    source: Source,
}

impl DataplaneCollector {
    pub fn new(source: Source) -> DataplaneCollector {
        DataplaneCollector { source }
    }
}

impl fmt::Debug for DataplaneCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataplaneCollector").finish_non_exhaustive()
    }
}

impl Collector for DataplaneCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let map = self.source.links.load();
        let mut links: Vec<(&str, &LinkCounters, u64)> = map
            .values()
            .map(|l| (l.spec.name.as_str(), &*l.counters, l.rate_bps()))
            .collect();
        links.sort_by_key(|l| l.0);
        let e = &mut encoder;
        let per_direction = |tx: fn(&LinkCounters) -> u64, rx: fn(&LinkCounters) -> u64| {
            links.iter().flat_map(move |(name, c, _)| {
                [
                    (vec![("link", *name), ("direction", "tx")], tx(c)),
                    (vec![("link", *name), ("direction", "rx")], rx(c)),
                ]
            })
        };
        counters(
            e,
            &desc(
                "nextmini_link",
                Some(Unit::Bytes),
                "Bytes of IP packets on the link: tx sent to the peer, rx received from it",
            ),
            per_direction(|c| get(&c.tx_bytes), |c| get(&c.rx_bytes)),
        )?;
        counters(
            e,
            &desc(
                "nextmini_link_packets",
                None,
                "Packets on the link: tx sent to the peer, rx received from it",
            ),
            per_direction(|c| get(&c.tx_packets), |c| get(&c.rx_packets)),
        )?;
        counters(
            e,
            &desc(
                "nextmini_link_drops",
                None,
                "Packets this node dropped on its way out over the link, by cause: handoff (full hand-off queue), queue (full emulated queue), aqm (RED), loss (emulated loss), loop (the topology's hop limit reached: a routing loop)",
            ),
            links.iter().flat_map(|(name, c, _)| {
                [
                    ("handoff", get(&c.drops)),
                    ("queue", get(&c.drops_queue)),
                    ("aqm", get(&c.drops_aqm)),
                    ("loss", get(&c.drops_loss)),
                    ("loop", get(&c.drops_loop)),
                ]
                .map(|(cause, v)| (vec![("link", *name), ("cause", cause)], v))
            }),
        )?;
        let per_link = |f: fn(&LinkCounters) -> u64| {
            links
                .iter()
                .map(move |(name, c, _)| (vec![("link", *name)], f(c)))
        };
        counters(
            e,
            &desc(
                "nextmini_link_ecn_marks",
                None,
                "Packets the link's AQM marked Congestion Experienced instead of dropping",
            ),
            per_link(|c| get(&c.ecn_marks)),
        )?;
        counters(
            e,
            &desc(
                "nextmini_link_connects",
                None,
                "Times the link's connection to the peer was (re)established",
            ),
            per_link(|c| get(&c.connects)),
        )?;
        counters(
            e,
            &desc(
                "nextmini_link_spliced",
                Some(Unit::Bytes),
                "Bytes of frames this node moved from another link's connection onto this one with splice(2), without copying them into user space (a cut-through transit hop)",
            ),
            per_link(|c| get(&c.spliced_bytes)),
        )?;
        counters(
            e,
            &desc(
                "nextmini_link_late_packets",
                None,
                "Packets handed to the connection more than 1 ms after the emulated link released them (the fidelity guard)",
            ),
            per_link(|c| get(&c.late_packets)),
        )?;
        let as_f64 = |f: fn(&LinkCounters) -> u64| per_link(f).map(|(l, v)| (l, v as f64));
        gauges(
            e,
            &desc(
                "nextmini_link_faithful",
                None,
                "0 when, in the last report window, the emulator rather than the emulated link limited the traffic this node sent on the link (late departures, hand-off drops); else 1",
            ),
            as_f64(|c| u64::from(!c.unfaithful.load(std::sync::atomic::Ordering::Relaxed))),
        )?;
        gauges(
            e,
            &desc(
                "nextmini_link_queue_packets",
                None,
                "Packets waiting in the link's emulated queue",
            ),
            as_f64(|c| get(&c.queue_packets)),
        )?;
        gauges(
            e,
            &desc(
                "nextmini_link_queue",
                Some(Unit::Bytes),
                "Bytes waiting in the link's emulated queue",
            ),
            as_f64(|c| get(&c.queue_bytes)),
        )?;
        gauges(
            e,
            &desc(
                "nextmini_link_rate",
                Some(Unit::Other("bits_per_second".into())),
                "Configured shaped rate of the direction this node sends (0 = unlimited)",
            ),
            links
                .iter()
                .map(|(name, _, rate)| (vec![("link", *name)], *rate as f64)),
        )?;
        gauges(
            e,
            &desc(
                "nextmini_link_rtt",
                Some(Unit::Seconds),
                "Latest keepalive round trip of the link's connection (absent until measured)",
            ),
            links.iter().filter_map(|(name, c, _)| {
                let us = get(&c.rtt_us);
                (us > 0).then(|| (vec![("link", *name)], us as f64 / 1e6))
            }),
        )?;
        gauges(
            e,
            &desc(
                "nextmini_link_up",
                None,
                "Whether the link's connection to the peer is up (1) or not (0)",
            ),
            links.iter().map(|(name, c, _)| {
                (
                    vec![("link", *name)],
                    f64::from(u8::from(c.connected.load(Relaxed))),
                )
            }),
        )?;

        let state = &self.source.state;
        let node = &self.source.node;
        gauges(
            e,
            &desc(
                "nextmini_agent_stream_connected",
                None,
                "Whether the agent's control stream to the hub is connected (1) or not (0)",
            ),
            [(vec![], f64::from(u8::from(state.stream_connected())))],
        )?;
        gauges(
            e,
            &desc(
                "nextmini_agent_generation",
                None,
                "Generation of the desired state the agent runs (0 before its first snapshot)",
            ),
            [(vec![], state.generation() as f64)],
        )?;
        counters(
            e,
            &desc(
                "nextmini_agent_tun_packets",
                None,
                "Packets through the node's TUN device: rx read from it (sent by applications), tx written to it (delivered to applications)",
            ),
            [
                (vec![("direction", "rx")], get(&node.tun_rx_packets)),
                (vec![("direction", "tx")], get(&node.tun_tx_packets)),
            ],
        )?;
        counters(
            e,
            &desc(
                "nextmini_agent_tun_super_packets",
                None,
                "TUN reads (rx) and writes (tx) that carried a TCP or UDP super-packet whole, with offload on; each also counts as its segments in nextmini_agent_tun_packets",
            ),
            [
                (vec![("direction", "rx")], get(&node.tun_rx_super)),
                (vec![("direction", "tx")], get(&node.tun_tx_super)),
            ],
        )?;
        counters(
            e,
            &desc(
                "nextmini_agent_drops",
                None,
                "Packets dropped outside any link, by cause: no_route, hop_limit (a routing loop), ttl_expired (TTL or hop limit ran out here, with ttl: decrement), malformed",
            ),
            [
                (vec![("cause", "no_route")], get(&node.no_route)),
                (vec![("cause", "hop_limit")], get(&node.hop_limit)),
                (vec![("cause", "ttl_expired")], get(&node.ttl_expired)),
                (vec![("cause", "malformed")], get(&node.malformed)),
            ],
        )?;
        let processed = node.processed();
        let names: Vec<String> = (0..processed.len()).map(|i| i.to_string()).collect();
        counters(
            e,
            &desc(
                "nextmini_agent_processor_packets",
                None,
                "Packets each processor task routed (spec.dataplane.processors); with mapping: sequential a flow stays on one processor, with concurrent every processor takes a share of every flow",
            ),
            names
                .iter()
                .zip(processed)
                .map(|(name, n)| (vec![("processor", name.as_str())], n)),
        )?;
        relay(e, &self.source.relay)
    }
}

/// SOCKS and max-mode relay families.
fn relay(e: &mut DescriptorEncoder, r: &crate::counters::RelayCounters) -> fmt::Result {
    let by_mode = |normal: &AtomicU64, max: &AtomicU64| {
        [
            (vec![("mode", "normal")], get(normal)),
            (vec![("mode", "max")], get(max)),
        ]
    };
    counters(
        e,
        &desc(
            "nextmini_relay",
            Some(Unit::Bytes),
            "Bytes this agent relayed between two TCP sockets (both directions), by mode: normal (SOCKS clients to connections made inside the node, whose packets then cross the emulated links) and max (spliced hop by hop past the link emulation)",
        ),
        by_mode(&r.normal_bytes, &r.max_bytes),
    )?;
    counters(
        e,
        &desc(
            "nextmini_relay_connections",
            None,
            "Relayed connections this agent set up (as SOCKS server, max-mode transit or destination), by mode",
        ),
        by_mode(&r.normal_connections, &r.max_connections),
    )?;
    gauges(
        e,
        &desc(
            "nextmini_relay_active_connections",
            None,
            "Relayed connections running now, by mode",
        ),
        by_mode(&r.normal_active, &r.max_active)
            .into_iter()
            .map(|(l, v)| (l, v as f64)),
    )?;
    counters(
        e,
        &desc(
            "nextmini_relay_splice_fallbacks",
            None,
            "Directions of relayed connections that splice() refused and a copy loop moved instead (each is also logged as a warning)",
        ),
        [(vec![], get(&r.splice_fallbacks))],
    )?;
    counters(
        e,
        &desc(
            "nextmini_relay_refused",
            None,
            "Connections refused, by reason: socks_auth (no acceptable method or a wrong password), socks_request (malformed, unsupported or unknown destination), socks_connect (the destination could not be reached), max_hop (a max-mode hop with a bad header or tag, no route or too many hops)",
        ),
        [
            (vec![("reason", "socks_auth")], get(&r.socks_refused_auth)),
            (
                vec![("reason", "socks_request")],
                get(&r.socks_refused_request),
            ),
            (
                vec![("reason", "socks_connect")],
                get(&r.socks_refused_connect),
            ),
            (vec![("reason", "max_hop")], get(&r.max_refused)),
        ],
    )
}
