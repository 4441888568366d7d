//! Writes the seed inputs of every fuzz target into `corpus/<target>/seed-*`:
//! real encoded link frames, real IPv4/IPv6 packets and real encoded control
//! messages. Run from anywhere: `cargo run --manifest-path fuzz/Cargo.toml
//! --example gen_corpus`. Deterministic, so re-running changes nothing.

use bytes::{Bytes, BytesMut};
use nextmini_agent::frame::{Frame, FrameCodec, FrameHeader, FrameKind, LinkHello};
use nextmini_fuzz::packets::{self, V4};
use nextmini_proto::v1 as pb;
use pb::scheduler_config::Kind;
use prost::Message;
use std::path::{Path, PathBuf};
use tokio_util::codec::Encoder;

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut n = 0;
    for (target, seeds) in [
        ("frame_decoder", frame_seeds()),
        ("flow_key", flow_seeds()),
        ("control_messages", control_seeds()),
        ("socks5", socks_seeds()),
    ] {
        let dir: PathBuf = root.join(target);
        std::fs::create_dir_all(&dir)?;
        for (name, bytes) in seeds {
            std::fs::write(dir.join(format!("seed-{name}")), bytes)?;
            n += 1;
        }
    }
    println!("wrote {n} seeds under {}", root.display());
    Ok(())
}

// ---- frames ---------------------------------------------------------------

fn encode(frames: &[Frame]) -> Vec<u8> {
    let mut out = BytesMut::new();
    for f in frames {
        FrameCodec.encode(f.clone(), &mut out).expect("encodable");
    }
    out.to_vec()
}

fn hello() -> LinkHello {
    LinkHello::new("line3", "a-b", "a").expect("short names")
}

fn udp_packet() -> Vec<u8> {
    packets::ipv4(
        V4::new(packets::PROTO_UDP),
        &packets::udp(40_000, 5201, b"hello"),
    )
}

fn frame_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let data = Frame::new(FrameKind::Data, 0, Bytes::from(udp_packet()));
    let labelled = Frame {
        header: FrameHeader {
            kind: FrameKind::Data,
            hops: 3,
            flags: 0,
            label: 7,
            payload_len: 0,
        },
        payload: Bytes::from(packets::ipv6(
            0,
            &[],
            packets::PROTO_TCP,
            &packets::tcp(443, 40_001, &[]),
        )),
    };
    let hello_frame = Frame::new(FrameKind::Hello, 0, hello().encode());
    let probe = Frame::new(
        FrameKind::Keepalive,
        0,
        Bytes::copy_from_slice(&123_456_789u64.to_be_bytes()),
    );
    let reply = Frame {
        header: FrameHeader {
            flags: 1,
            ..probe.header
        },
        payload: probe.payload.clone(),
    };
    let empty = Frame::new(FrameKind::Keepalive, 0, Bytes::new());
    let stream = encode(&[
        hello_frame.clone(),
        data.clone(),
        probe.clone(),
        labelled.clone(),
        reply.clone(),
    ]);
    let mut truncated = encode(std::slice::from_ref(&data));
    truncated.truncate(truncated.len() - 3);
    let mut hello_future = hello().encode().to_vec();
    hello_future.extend_from_slice(b"\x00\x04next");
    vec![
        ("data-ipv4-udp", encode(std::slice::from_ref(&data))),
        (
            "data-labelled-ipv6",
            encode(std::slice::from_ref(&labelled)),
        ),
        ("hello-frame", encode(std::slice::from_ref(&hello_frame))),
        ("keepalive-probe", encode(std::slice::from_ref(&probe))),
        ("keepalive-reply", encode(std::slice::from_ref(&reply))),
        ("keepalive-empty", encode(std::slice::from_ref(&empty))),
        ("stream", stream),
        ("truncated", truncated),
        ("hello-payload", hello().encode().to_vec()),
        ("hello-payload-future-fields", hello_future),
    ]
}

// ---- packets --------------------------------------------------------------

fn flow_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use packets::*;
    let v4 = |protocol, transport: Vec<u8>| ipv4(V4::new(protocol), &transport);
    let ecn_ef = V4 {
        tos: (46 << 2) | 0b10,
        ..V4::new(PROTO_UDP)
    };
    vec![
        (
            "ipv4-tcp",
            v4(PROTO_TCP, tcp(40_000, 80, b"GET / HTTP/1.1\r\n")),
        ),
        ("ipv4-udp", v4(PROTO_UDP, udp(5353, 53, b"\x12\x34"))),
        ("ipv4-udp-ef-ect0", ipv4(ecn_ef, &udp(1000, 2000, &[0; 32]))),
        (
            "ipv4-icmp-echo",
            v4(PROTO_ICMP, icmp(8, 0x1234, 1, &[0xab; 16])),
        ),
        (
            "ipv4-icmp-reply",
            v4(PROTO_ICMP, icmp(0, 0x1234, 1, &[0xab; 16])),
        ),
        (
            "ipv4-icmp-unreachable",
            v4(PROTO_ICMP, icmp(3, 0, 0, &udp_packet()[..28])),
        ),
        ("ipv4-sctp", v4(PROTO_SCTP, sctp(36_412, 36_412, &[0; 16]))),
        ("ipv4-gre", v4(PROTO_GRE, vec![0, 0, 0x08, 0, 1, 2, 3, 4])),
        (
            "ipv4-options-tcp",
            ipv4(
                V4 {
                    options: 12,
                    ..V4::new(PROTO_TCP)
                },
                &tcp(1, 2, &[]),
            ),
        ),
        (
            "ipv4-first-fragment",
            ipv4(
                V4 {
                    frag: 0x2000,
                    ..V4::new(PROTO_UDP)
                },
                &udp(7, 9, &[0; 24]),
            ),
        ),
        (
            "ipv4-later-fragment",
            ipv4(
                V4 {
                    frag: 3,
                    ..V4::new(PROTO_UDP)
                },
                &[0xcc; 24],
            ),
        ),
        ("ipv6-tcp", ipv6(0, &[], PROTO_TCP, &tcp(443, 40_000, &[]))),
        (
            "ipv6-udp-tclass",
            ipv6((10 << 2) | 1, &[], PROTO_UDP, &udp(4789, 4789, &[0; 8])),
        ),
        (
            "ipv6-icmpv6-echo",
            ipv6(0, &[], PROTO_ICMPV6, &icmp(128, 77, 1, &[0; 8])),
        ),
        (
            "ipv6-ext-chain-udp",
            ipv6(
                0,
                &[
                    ext_opts(IPV6_HOP_BY_HOP, 0),
                    ext_opts(IPV6_ROUTING, 1),
                    ext_fragment(0, true),
                    ext_ah(4),
                    ext_opts(IPV6_DEST_OPTS, 0),
                ],
                PROTO_UDP,
                &udp(1, 2, &[0; 4]),
            ),
        ),
        (
            "ipv6-later-fragment",
            ipv6(0, &[ext_fragment(185, false)], PROTO_TCP, &[0xdd; 16]),
        ),
    ]
}

// ---- control messages -------------------------------------------------------

fn node(name: &str, last: u8) -> pb::NodeConfig {
    pb::NodeConfig {
        name: name.into(),
        topology: "line3".into(),
        seed: 7,
        overlay_addr: format!("198.18.0.{last}"),
        overlay_prefix_len: 16,
        listen_addr: format!("198.19.0.{last}:7000"),
        dataplane: Some(pb::DataplaneConfig {
            processors: 2,
            mtu: 1400,
            mapping: "sequential".into(),
            ttl: "decrement".into(),
        }),
        peers: ["a", "b", "c"]
            .iter()
            .zip(1..)
            .map(|(n, i)| pb::PeerAddress {
                node: (*n).into(),
                overlay_addr: format!("198.18.0.{i}"),
            })
            .collect(),
        link_cert_der: Vec::new(),
        link_key_der: Vec::new(),
        // Unset, so the seeds stay the bytes they were before max mode.
        max_port: 0,
        socks: Vec::new(),
    }
}

fn link(name: &str, peer: &str, role: pb::LinkRole, params: pb::LinkParams) -> pb::LinkConfig {
    pb::LinkConfig {
        name: name.into(),
        peer_node: peer.into(),
        peer_addr: if role == pb::LinkRole::Dial {
            "198.19.0.3:7000".into()
        } else {
            String::new()
        },
        role: role as i32,
        transport: "tcp".into(),
        params: Some(params),
    }
}

fn dest(node: &str, last: u8, hops: &[(&str, u32)]) -> pb::DestinationRoute {
    pb::DestinationRoute {
        node: node.into(),
        overlay_addr: format!("198.18.0.{last}"),
        next_hops: hops
            .iter()
            .map(|&(link, weight)| pb::NextHop {
                link: link.into(),
                weight,
            })
            .collect(),
    }
}

/// Node b of line3 (a - b - c), plain links.
fn line3_b() -> pb::Snapshot {
    pb::Snapshot {
        generation: 3,
        node: Some(node("b", 2)),
        links: vec![
            link("a-b", "a", pb::LinkRole::Accept, pb::LinkParams::default()),
            link("b-c", "c", pb::LinkRole::Dial, pb::LinkParams::default()),
        ],
        routes: Some(pb::RouteTable {
            destinations: vec![
                dest("a", 1, &[("a-b", 0)]),
                dest("b", 2, &[]),
                dest("c", 3, &[("b-c", 0)]),
            ],
            ..Default::default()
        }),
        report_interval_ms: 1000,
        idle_report_interval_ms: 5000,
        flows: Vec::new(),
    }
}

/// Every impairment, RED with ECN, WRR over classes.
fn netem_wrr() -> pb::LinkParams {
    pb::LinkParams {
        rate_bps: 10_000_000,
        trace_ms: Vec::new(),
        delay_us: 5_000,
        jitter_us: 1_000,
        loss_ppm: 10_000,
        queue_packets: 0,
        burst_bytes: 3_000,
        jitter_distribution: pb::JitterDistribution::Normal as i32,
        loss_correlation_ppm: 250_000,
        reorder_ppm: 20_000,
        duplicate_ppm: 5_000,
        corrupt_ppm: 1_000,
        queue: Some(pb::QueueConfig {
            limit_packets: 100,
            limit_bytes: 150_000,
            aqm: Some(pb::queue_config::Aqm::Red(pb::Red {
                min_packets: 5,
                max_packets: 15,
                max_p_ppm: 100_000,
                weight_ppm: 2_000,
                ecn: true,
            })),
        }),
        scheduler: Some(pb::SchedulerConfig {
            kind: Some(Kind::Wrr(pb::Wrr {
                weights: vec![4, 2, 1],
            })),
        }),
        classes: vec![
            pb::ClassRule {
                queue: 0,
                dscp: Some(46),
                ..Default::default()
            },
            pb::ClassRule {
                queue: 1,
                dst_port: Some(5201),
                protocol: Some(17),
                ..Default::default()
            },
            pb::ClassRule {
                queue: 1,
                max_packet_bytes: Some(200),
                ..Default::default()
            },
        ],
    }
}

/// DRR, an ECN threshold, Pareto jitter.
fn drr_ecn() -> pb::LinkParams {
    pb::LinkParams {
        rate_bps: 1_000_000,
        delay_us: 20_000,
        jitter_us: 5_000,
        jitter_distribution: pb::JitterDistribution::Pareto as i32,
        queue: Some(pb::QueueConfig {
            limit_packets: 20,
            limit_bytes: 0,
            aqm: Some(pb::queue_config::Aqm::Ecn(pb::EcnThreshold {
                threshold_packets: 4,
            })),
        }),
        scheduler: Some(pb::SchedulerConfig {
            kind: Some(Kind::Drr(pb::Drr {
                quantum_bytes: vec![1500, 300],
            })),
        }),
        classes: vec![pb::ClassRule {
            queue: 0,
            src_port: Some(80),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Strict priority by DSCP, tail drop, a tiny byte limit.
fn priority() -> pb::LinkParams {
    pb::LinkParams {
        rate_bps: 100_000_000,
        queue: Some(pb::QueueConfig {
            limit_packets: 0,
            limit_bytes: 1_000,
            aqm: Some(pb::queue_config::Aqm::Taildrop(pb::TailDrop {})),
        }),
        scheduler: Some(pb::SchedulerConfig {
            kind: Some(Kind::Priority(pb::StrictPriority { bands: 3 })),
        }),
        classes: vec![
            pb::ClassRule {
                queue: 0,
                dscp: Some(46),
                ..Default::default()
            },
            pb::ClassRule {
                queue: 1,
                protocol: Some(6),
                ..Default::default()
            },
        ],
        ..Default::default()
    }
}

/// Weighted multipath, explicit paths and flow rules at a source node.
fn multipath_routes() -> pb::RouteTable {
    pb::RouteTable {
        hop_limit: 300,
        destinations: vec![
            dest("a", 1, &[]),
            dest("d", 4, &[("a-b", 3), ("a-c", 1)]),
            pb::DestinationRoute {
                node: "v6".into(),
                overlay_addr: "2001:db8::2".into(),
                next_hops: vec![
                    pb::NextHop {
                        link: "a-b".into(),
                        weight: 0,
                    },
                    pb::NextHop {
                        link: "a-c".into(),
                        weight: 0,
                    },
                ],
            },
        ],
        ranges: vec![pb::DestinationRange {
            first: "198.18.0.10".into(),
            last: "198.18.0.200".into(),
            next_hops: vec![pb::NextHop {
                link: "a-c".into(),
                weight: 1,
            }],
        }],
        labels: vec![
            pb::LabelRoute {
                route_id: 7,
                next_link: "a-c".into(),
            },
            pb::LabelRoute {
                route_id: 8,
                next_link: "a-b".into(),
            },
            pb::LabelRoute {
                route_id: 9,
                next_link: String::new(),
            },
        ],
        flow_rules: vec![
            pb::FlowRule {
                src_addr: "198.18.0.1".into(),
                dst_addr: "198.18.0.4".into(),
                dst_port: 5201,
                protocol: 6,
                route_id: 7,
                ..Default::default()
            },
            pb::FlowRule {
                dst_addr: "198.18.0.4".into(),
                protocol: 17,
                choices: vec![
                    pb::RouteChoice {
                        route_id: 7,
                        weight: 1,
                    },
                    pb::RouteChoice {
                        route_id: 8,
                        weight: 3,
                    },
                ],
                ..Default::default()
            },
        ],
    }
}

fn flows() -> Vec<pb::FlowTask> {
    vec![
        pb::FlowTask {
            name: "web".into(),
            defined_generation: 2,
            role: pb::FlowRole::Source as i32,
            peer_addr: "198.18.0.4".into(),
            protocol: pb::FlowProtocol::Tcp as i32,
            count: 10,
            parallelism: 2,
            size_cdf: vec![
                pb::CdfPoint {
                    bytes: 1_000,
                    probability: 0.5,
                },
                pb::CdfPoint {
                    bytes: 100_000,
                    probability: 0.9,
                },
                pb::CdfPoint {
                    bytes: 10_000_000,
                    probability: 1.0,
                },
            ],
            mean_interarrival_us: 10_000,
            seed: 42,
            route_id: 7,
            window_bytes: 65_536,
            dscp: 10,
            dscp_by_size: vec![pb::DscpBySize {
                max_bytes: 10_000,
                dscp: 46,
            }],
            congestion_control: "reno".into(),
            ..Default::default()
        },
        pb::FlowTask {
            name: "cbr".into(),
            defined_generation: 2,
            role: pb::FlowRole::Source as i32,
            peer_addr: "198.18.0.4".into(),
            protocol: pb::FlowProtocol::Udp as i32,
            count: 1,
            duration_us: 5_000_000,
            rate_bps: 1_000_000,
            ..Default::default()
        },
        pb::FlowTask {
            name: "back".into(),
            defined_generation: 2,
            role: pb::FlowRole::Sink as i32,
            protocol: pb::FlowProtocol::Tcp as i32,
            ..Default::default()
        },
    ]
}

/// Node a of a diamond with shaped, impaired, multi-queue links and flows.
fn shaped_a() -> pb::Snapshot {
    pb::Snapshot {
        generation: 9,
        node: Some(node("a", 1)),
        links: vec![
            link("a-b", "b", pb::LinkRole::Dial, netem_wrr()),
            link("a-c", "c", pb::LinkRole::Dial, drr_ecn()),
            link("a-d", "d", pb::LinkRole::Accept, priority()),
        ],
        routes: Some(multipath_routes()),
        report_interval_ms: 100,
        idle_report_interval_ms: 100,
        flows: flows(),
    }
}

fn delta() -> pb::Delta {
    pb::Delta {
        generation: 10,
        base_generation: 9,
        upsert_links: vec![link("a-b", "b", pb::LinkRole::Dial, drr_ecn())],
        remove_links: vec!["a-c".into()],
        routes: Some(multipath_routes()),
    }
}

fn controller(msg: pb::controller_message::Msg) -> Vec<u8> {
    pb::ControllerMessage { msg: Some(msg) }.encode_to_vec()
}

fn agent(msg: pb::agent_message::Msg) -> Vec<u8> {
    pb::AgentMessage { msg: Some(msg) }.encode_to_vec()
}

fn control_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use pb::agent_message::Msg as A;
    use pb::controller_message::Msg as C;
    vec![
        ("snapshot-line3-b", controller(C::Snapshot(line3_b()))),
        ("snapshot-shaped-a", controller(C::Snapshot(shaped_a()))),
        ("bare-snapshot-shaped-a", shaped_a().encode_to_vec()),
        ("delta", controller(C::Delta(delta()))),
        ("bare-delta", delta().encode_to_vec()),
        (
            "reject",
            controller(C::Reject(pb::Reject {
                reason: "bad credential".into(),
            })),
        ),
        (
            "flows-ready",
            controller(C::FlowsReady(pb::FlowsReady { generation: 9 })),
        ),
        (
            "results-stored",
            controller(C::ResultsStored(pb::ResultsStored { sequence: 4 })),
        ),
        (
            "agent-hello",
            agent(A::Hello(pb::Hello {
                topology: "line3".into(),
                node: "b".into(),
                credential: "0123456789abcdef".into(),
                protocol_version: nextmini_proto::PROTOCOL_VERSION,
                capabilities: vec!["tcp".into(), "smoltcp".into()],
                running_generation: 3,
                pid: 4242,
            })),
        ),
        (
            "agent-ack-error",
            agent(A::Ack(pb::Ack {
                generation: 9,
                error: "links[0].params.queue.red.max_packets: must be set".into(),
            })),
        ),
        (
            "agent-report",
            agent(A::Report(pb::Report {
                sequence: 17,
                generation: 9,
                links: vec![pb::LinkCounters {
                    link: "a-b".into(),
                    connected: true,
                    tx_bytes: 1_000_000,
                    tx_packets: 1_000,
                    rx_bytes: 2_000,
                    rx_packets: 20,
                    drops: 1,
                    connects: 2,
                    drops_queue: 3,
                    drops_aqm: 4,
                    drops_loss: 5,
                    ecn_marks: 6,
                    queue_packets: 7,
                    queue_bytes: 8_000,
                    rtt_us: 250,
                    drops_loop: 9,
                    late_packets: 10,
                    max_late_us: 2_500,
                    behind_us: 4_000,
                    drops_down: 11,
                    unfaithful:
                        "12 of 1000 packets (1%) left more than 1 ms after the link released them"
                            .into(),
                }],
                unix_ms: 1_700_000_000_000,
            })),
        ),
        (
            "agent-flow-report",
            agent(A::FlowReport(pb::FlowReport {
                sequence: 3,
                results: vec![pb::FlowResult {
                    flow: "web".into(),
                    defined_generation: 2,
                    instance: 0,
                    protocol: pb::FlowProtocol::Tcp as i32,
                    size_bytes: 1_000,
                    bytes: 1_000,
                    started_unix_us: 1_700_000_000_000_000,
                    finished_unix_us: 1_700_000_000_100_000,
                    fct_us: 100_000,
                    retransmissions: 1,
                    error: String::new(),
                    from_sink: false,
                    received_bytes: 0,
                }],
            })),
        ),
    ]
}

// ---- SOCKS5 and max-mode headers ---------------------------------------------

fn socks_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use nextmini_agent::maxmode::header::MaxHeader;
    use nextmini_agent::socks::handshake::{Request, Target, encode_request};
    let request =
        |target: Target| encode_request(&Request { command: 1, target }).expect("short name");
    let by_name = request(Target::Domain("c".into(), 8000));
    let by_v4 = request(Target::Addr("198.18.0.3:8000".parse().expect("addr")));
    let by_v6 = request(Target::Addr("[2001:db8::3]:443".parse().expect("addr")));
    let credentials = [&[1u8, 5][..], b"alice", &[6], b"secret"].concat();
    let key = nextmini_agent::link_auth::LinkKey::from_identity(b"fuzz topology").expect("key");
    let header = MaxHeader {
        hops: 1,
        label: 3,
        src: "198.18.0.1:40000".parse().expect("addr"),
        dst: "198.18.0.3:8000".parse().expect("addr"),
    };
    vec![
        ("greeting", vec![5, 2, 0, 2]),
        ("credentials", credentials.clone()),
        ("request-name", by_name.clone()),
        ("request-v4", by_v4),
        ("request-v6", by_v6),
        (
            "session-noauth",
            [&[5, 1, 0][..], &by_name, b"GET / HTTP/1.1"].concat(),
        ),
        (
            "session-userpass",
            [&[5, 1, 2][..], &credentials, &by_name].concat(),
        ),
        ("max-header", header.seal(&key, 1_000_000).to_vec()),
    ]
}
