//! The plan: what a validated topology becomes. Pure data, no Kubernetes types, no I/O.
//! Local mode and the Kubernetes controllers both build it with the same code.

use ipnet::Ipv4Net;
use nextmini_agent::sched::schemes;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::time::Duration;

/// TCP/UDP port on which every agent accepts link connections on its underlay address.
pub const LINK_PORT: u16 = 7100;
/// TCP port of every agent's max-mode relay on its underlay address.
pub const MAX_PORT: u16 = 7101;

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub topology: String,
    /// Pool of TUN (overlay) addresses; each node gets one host address from it.
    pub overlay: Ipv4Net,
    /// Pool of underlay addresses (namespace bridge or pod network in packed mode).
    pub underlay: Ipv4Net,
    pub placement: Placement,
    pub dataplane: Dataplane,
    /// How often agents report counters, in milliseconds (changes apply live).
    pub report_interval_ms: u32,
    /// `spec.seed`: the experiment's seed (None = derived from names alone).
    pub seed: Option<u64>,
    /// `spec.scenario`'s events, in order (empty without a scenario).
    pub scenario: Vec<PlannedEvent>,
    /// Sorted by `index`; `index` is the node's position in the topology.
    /// Shared: the hub makes a view for each change of links in place, and
    /// copying 10,000 nodes took a third of its time to the changed agents.
    pub nodes: std::sync::Arc<Vec<PlannedNode>>,
    /// Sorted by name. Each shared for the same reason: a change in place
    /// replaces one link and shares the rest with the view before.
    pub links: Vec<std::sync::Arc<PlannedLink>>,
    pub flows: Vec<PlannedFlow>,
}

/// One event of a timed scenario, as every agent it touches applies it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedEvent {
    /// Offset from the scenario's start.
    pub at: Duration,
    /// The link it changes, or the node it acts on (`EventChange::Node`).
    pub target: String,
    pub change: EventChange,
}

#[derive(Debug, Clone, PartialEq)]
pub enum EventChange {
    /// Both directions' parameters from now on, after inheritance (what the
    /// link's own layers and every earlier event of the link leave).
    /// Boxed: a pair of parameter sets is large beside `Up`.
    Params(Box<DirectionPair>),
    /// The link forwards (`true`) or stops forwarding.
    Up(bool),
    /// The node's agent is killed (`false`) or started again (`true`).
    Node { restart: bool },
    /// A route rule from the instant, applied by the agent of the event's
    /// target, the traffic's source node. Boxed: it is large beside `Up`.
    Route(Box<RouteChange>),
}

/// What a route event moves (traffic from the event's target to `dst`,
/// narrowed by protocol and ports) and where.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteChange {
    pub dst: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst_port: Option<u16>,
    /// From the target to `dst`; `None` ends the scenario's earlier rule for
    /// the same traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<Vec<String>>,
    /// The stored route of `path` (`routes` row `scenario/<index>`), known
    /// once the plan is written.
    #[serde(skip)]
    pub route_id: Option<u32>,
}

/// What each end of a link sends with.
#[derive(Debug, Clone, PartialEq)]
pub struct DirectionPair {
    pub forward: LinkParams,
    pub backward: LinkParams,
}

impl EventChange {
    /// The kind as stored (`scenario_events.kind`) and shown.
    pub fn kind(&self) -> &'static str {
        match self {
            EventChange::Params(_) => "set",
            EventChange::Up(true) => "up",
            EventChange::Up(false) => "down",
            EventChange::Node { restart: false } => "kill",
            EventChange::Node { restart: true } => "restart",
            EventChange::Route(_) => "route",
        }
    }

    /// Whether the event acts on a node (its target is a node's name).
    pub fn is_node(&self) -> bool {
        matches!(self, EventChange::Node { .. })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Whatever suits where the topology runs: namespaces locally, pods in a cluster.
    Auto,
    Netns,
    PodPerNode,
    /// Worker pods hosting many nodes each (a cluster); namespaces locally.
    Packed(Packing),
}

/// How a packed topology's nodes are dealt to worker pods. A node's worker and
/// slot follow from its index alone, so the hub and the operator agree without
/// talking, and nodes added at the end move no other node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    /// Node i runs in worker i / n, slot i mod n.
    NodesPerWorker(u32),
    /// Node i runs in worker i mod n, slot i / n.
    Workers(u32),
}

/// Nodes per worker when a packed topology sets neither `nodesPerWorker` nor `workers`.
pub const DEFAULT_NODES_PER_WORKER: u32 = 50;
/// At most this many nodes share a worker: each takes two ports of the pod's
/// own (from [`LINK_PORT`] up), which must stay below the ephemeral range.
pub const MAX_NODES_PER_WORKER: u32 = 1000;

impl Default for Packing {
    fn default() -> Self {
        Packing::NodesPerWorker(DEFAULT_NODES_PER_WORKER)
    }
}

/// Where a node of a packed topology runs: its worker and its place in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Seat {
    pub worker: u32,
    pub slot: u32,
}

impl Seat {
    /// The port the node's links are accepted on, in its worker pod.
    pub fn link_port(self) -> u16 {
        let offset = self.slot.min(MAX_NODES_PER_WORKER - 1) * 2;
        LINK_PORT + u16::try_from(offset).unwrap_or(0)
    }

    /// The port of the node's max-mode relay, in its worker pod.
    pub fn relay_port(self) -> u16 {
        self.link_port() + 1
    }
}

impl Packing {
    pub fn seat(self, index: u32) -> Seat {
        match self {
            Packing::NodesPerWorker(n) => {
                let n = n.max(1);
                Seat {
                    worker: index / n,
                    slot: index % n,
                }
            }
            Packing::Workers(n) => {
                let n = n.max(1);
                Seat {
                    worker: index % n,
                    slot: index / n,
                }
            }
        }
    }

    /// The most nodes one worker hosts when the topology has `nodes` nodes.
    pub fn busiest_worker(self, nodes: u32) -> u32 {
        match self {
            Packing::NodesPerWorker(n) => n.min(nodes),
            Packing::Workers(n) => nodes.div_ceil(n.max(1)),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    Sequential,
    Concurrent,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Dataplane {
    pub processors: u32,
    pub mapping: Mapping,
    pub mtu: u32,
    /// Transit nodes decrement the IP TTL and answer expiry (`ttl: decrement`).
    pub ttl_decrement: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PlannedNode {
    pub name: String,
    pub index: u32,
    /// The MemberCluster the node runs in (None: where the topology is).
    pub cluster: Option<String>,
    /// The node's region (`spec.nodes[].region`, `spec.spread`, or its cluster's).
    pub region: Option<String>,
    pub overlay: Ipv4Addr,
    pub underlay: Ipv4Addr,
    pub resources: Resources,
    /// SOCKS5 servers of the node's agent (stored as JSON; a change restarts the node).
    pub socks: Vec<PlannedSocks>,
}

/// A SOCKS5 server as the node's agent runs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlannedSocks {
    pub listen: std::net::SocketAddr,
    #[serde(default)]
    pub mode: RelayMode,
    /// Empty: no authentication.
    #[serde(default)]
    pub users: Vec<SocksUser>,
}

/// How a relayed connection travels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RelayMode {
    /// Through TUN, processors and the emulated links.
    #[default]
    Normal,
    /// Spliced hop by hop between the agents' max-mode relays.
    Max,
}

/// A SOCKS5 account; only a salted hash of the password leaves the planner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SocksUser {
    pub name: String,
    /// Hex of [`socks_password_sha256`].
    pub password_sha256: String,
}

/// SHA-256 of `"nextmini socks v1\0" + name + "\0" + password`: what the agents
/// compare a client's password against (the same function is in the agent).
pub fn socks_password_sha256(name: &str, password: &str) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"nextmini socks v1\0");
    h.update(name.as_bytes());
    h.update(b"\0");
    h.update(password.as_bytes());
    h.finalize().into()
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resources {
    pub cpu_millis: Option<u32>,
    pub memory_bytes: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Quic,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PlannedLink {
    pub name: String,
    /// The endpoint that opens the connection (`endpoints[0]`).
    pub dialer: String,
    /// The endpoint that accepts it (`endpoints[1]`).
    pub acceptor: String,
    pub transport: Transport,
    /// What the dialer enforces on the packets it sends to the acceptor.
    pub forward: LinkParams,
    /// What the acceptor enforces on the packets it sends to the dialer.
    pub backward: LinkParams,
}

/// Emulation parameters of one direction of a link, after inheritance; `None` means
/// unlimited / no impairment / the agent's default.
///
/// The store keeps this as JSON that control scripts may edit (`jsonb_set(params_forward,
/// '{rate_bps}', ...)`), so the keys are the proto's names and durations are whole
/// microseconds (`delay_us`), like everything else an agent sees. Missing keys read as
/// unset; unknown keys are refused so that a typo in a script is an error.
///
/// The JSON Schema derived here, with its limits, is what the database checks a
/// control script's write against and what the hub checks every row it loads against
/// (`store::rules`): the YAML's limits are the constants named in the attributes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
#[schemars(extend("x-classes-fit-scheduler" = true))]
pub struct LinkParams {
    #[schemars(range(min = 1, max = crate::units::Rate::MAX_BPS))]
    pub rate_bps: Option<u64>,
    /// A delivery trace (ms offsets) instead of `rate_bps` and `burst_bytes`;
    /// empty: none. Absent from rows without one, so older rows read the same.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = nextmini_agent::sched::trace_shaper::MAX_TRACE_ENTRIES))]
    pub trace_ms: Vec<u32>,
    /// Token bucket depth.
    #[schemars(extend("x-minimum-mtu" = true))]
    pub burst_bytes: Option<u64>,
    #[serde(rename = "delay_us", with = "micros")]
    #[schemars(with = "Option<u64>", range(max = MAX_DELAY_US))]
    pub delay: Option<Duration>,
    #[serde(rename = "jitter_us", with = "micros")]
    #[schemars(with = "Option<u64>", range(max = MAX_DELAY_US))]
    pub jitter: Option<Duration>,
    pub jitter_distribution: JitterDistribution,
    /// Probabilities in parts per million.
    #[schemars(range(max = crate::units::Percent::MAX_PPM))]
    pub loss_ppm: Option<u32>,
    #[schemars(range(max = crate::units::Percent::MAX_PPM))]
    pub loss_correlation_ppm: Option<u32>,
    #[schemars(range(max = crate::units::Percent::MAX_PPM))]
    pub reorder_ppm: Option<u32>,
    #[schemars(range(max = crate::units::Percent::MAX_PPM))]
    pub duplicate_ppm: Option<u32>,
    #[schemars(range(max = crate::units::Percent::MAX_PPM))]
    pub corrupt_ppm: Option<u32>,
    pub queue: QueueParams,
    pub scheduler: SchedulerKind,
    /// Matched in order; unmatched packets join the scheduler's last queue.
    #[schemars(length(max = crate::api::MAX_CLASSES))]
    pub classes: Vec<ClassRule>,
}

impl LinkParams {
    /// What the stored rules cannot see, as (`key`, reason): a registered scheme's
    /// settings (they check its name only) and a trace's order and its conflict with
    /// a rate. The hub holds every row it loads to this, so a SQL write no agent can
    /// build runs the last good state.
    /// What the link delivers on average: its rate, or its trace's mean.
    pub fn mean_rate_bps(&self) -> Option<u64> {
        if self.trace_ms.is_empty() {
            self.rate_bps
        } else {
            Some(nextmini_agent::sched::trace_shaper::trace_mean_rate_bps(
                &self.trace_ms,
            ))
        }
    }

    pub fn problem_beyond_rules(&self) -> Option<(String, String)> {
        self.trace_problem().or_else(|| self.scheme_problem())
    }

    fn trace_problem(&self) -> Option<(String, String)> {
        if self.trace_ms.is_empty() {
            return None;
        }
        if self.rate_bps.is_some() || self.burst_bytes.is_some() {
            return Some((
                "trace_ms".into(),
                "a trace replaces the token bucket: remove rate_bps and burst_bytes".into(),
            ));
        }
        nextmini_agent::sched::trace_shaper::check_trace(&self.trace_ms)
            .err()
            .map(|e| ("trace_ms".into(), e.to_string()))
    }

    fn scheme_problem(&self) -> Option<(String, String)> {
        if let SchedulerKind::Scheme { name, settings } = &self.scheduler {
            let entry = match schemes::find_scheduler(name) {
                Ok(entry) => entry,
                Err(e) => return Some((format!("scheduler.scheme.{}", e.field()), e.reason())),
            };
            let queues = match entry.queues(settings) {
                Ok(queues) => queues,
                Err(e) => return Some((format!("scheduler.scheme.{}", e.field()), e.reason())),
            };
            if entry.classifies && !self.classes.is_empty() {
                return Some((
                    "classes".into(),
                    format!(
                        "the {name} scheduler sorts packets into its queues itself; remove classes"
                    ),
                ));
            }
            if let Some((i, c)) = self
                .classes
                .iter()
                .enumerate()
                .find(|(_, c)| usize::try_from(c.queue).map_or(true, |q| q >= queues))
            {
                return Some((
                    format!("classes[{i}].queue"),
                    format!(
                        "queue {} does not exist: the scheduler has {queues} queue(s)",
                        c.queue
                    ),
                ));
            }
        }
        if let Aqm::Scheme { name, settings } = &self.queue.aqm
            && let Err(e) = schemes::find_aqm(name).and_then(|a| a.check(settings))
        {
            return Some((format!("queue.aqm.scheme.{}", e.field()), e.reason()));
        }
        None
    }
}

/// The longest delay or jitter a link may have: 60 s, far beyond any real path
/// (a geostationary hop is 0.3 s), short enough that a typo in the unit is refused
/// rather than holding every packet for a day.
pub const MAX_DELAY: Duration = Duration::from_secs(60);
/// [`MAX_DELAY`] in the stored unit.
pub const MAX_DELAY_US: u64 = 60_000_000;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum JitterDistribution {
    #[default]
    Uniform,
    Normal,
    Pareto,
}

/// Limits of each of the scheduler's queues: at most one of the two is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
#[schemars(extend("x-at-most-one" = ["limit_packets", "limit_bytes"], "x-thresholds-fit-limit" = true))]
pub struct QueueParams {
    #[schemars(range(min = 1))]
    pub limit_packets: Option<u32>,
    #[schemars(extend("x-minimum-mtu" = true))]
    pub limit_bytes: Option<u64>,
    pub aqm: Aqm,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Aqm {
    #[default]
    TailDrop,
    #[schemars(extend("x-less-than" = ["red.min_packets", "red.max_packets"]))]
    Red {
        /// Average queue length thresholds in packets.
        min_packets: u32,
        max_packets: u32,
        /// Drop (or mark) probability at `max_packets`.
        #[schemars(range(min = 1, max = crate::units::Percent::MAX_PPM))]
        max_p_ppm: u32,
        /// EWMA weight of the average queue length in millionths.
        #[schemars(range(min = 1, max = crate::units::Fraction::ONE_PPM))]
        weight_ppm: u32,
        /// Mark ECN-capable packets instead of dropping them.
        ecn: bool,
    },
    Ecn {
        #[schemars(range(min = 1))]
        threshold_packets: u32,
    },
    /// A registered AQM (`node-agent/src/sched/schemes`); the hub holds its
    /// settings to the scheme's own types.
    Scheme {
        #[schemars(schema_with = "registered_aqm_name")]
        name: String,
        #[serde(default)]
        settings: serde_json::Value,
    },
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum SchedulerKind {
    #[default]
    Fcfs,
    /// One queue per weight; weights count packets.
    Wrr {
        #[schemars(length(min = 1, max = crate::api::MAX_QUEUES), inner(range(min = 1)))]
        weights: Vec<u32>,
    },
    /// One queue per quantum.
    Drr {
        #[schemars(length(min = 1, max = crate::api::MAX_QUEUES), inner(range(min = 1)))]
        quantum_bytes: Vec<u32>,
    },
    /// Queue 0 first.
    Priority {
        #[schemars(range(min = 1, max = crate::api::MAX_BANDS))]
        bands: u32,
    },
    /// A registered scheduler (`node-agent/src/sched/schemes`); the hub holds its
    /// settings to the scheme's own types.
    Scheme {
        #[schemars(schema_with = "registered_scheduler_name")]
        name: String,
        #[serde(default)]
        settings: serde_json::Value,
    },
}

/// The stored rules accept only the names the agent's registry has, so a SQL
/// write cannot name a scheme no agent can build.
fn registered_scheduler_name(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let names: Vec<&str> = schemes::SCHEDULERS.iter().map(|e| e.name).collect();
    schemars::json_schema!({ "type": "string", "enum": names })
}

fn registered_aqm_name(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let names: Vec<&str> = schemes::AQMS.iter().map(|e| e.name).collect();
    schemars::json_schema!({ "type": "string", "enum": names })
}

impl SchedulerKind {
    /// How many queues the scheduler serves, so classes know which indices exist.
    pub fn queues(&self) -> usize {
        match self {
            SchedulerKind::Fcfs => 1,
            SchedulerKind::Wrr { weights } => weights.len(),
            SchedulerKind::Drr { quantum_bytes } => quantum_bytes.len(),
            SchedulerKind::Priority { bands } => usize::try_from(*bands).unwrap_or(usize::MAX),
            // Checked before it gets here; an unknown scheme serves nothing.
            SchedulerKind::Scheme { name, settings } => schemes::find_scheduler(name)
                .and_then(|e| e.queues(settings))
                .unwrap_or(0),
        }
    }
}

/// Sends matching packets to `queue`; unset matchers match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ClassRule {
    pub queue: u32,
    #[schemars(range(max = 63))]
    pub dscp: Option<u8>,
    #[schemars(range(min = 1))]
    pub src_port: Option<u16>,
    #[schemars(range(min = 1))]
    pub dst_port: Option<u16>,
    /// IP protocol number.
    pub protocol: Option<u8>,
    /// Matches packets smaller than this.
    #[schemars(range(min = 1))]
    pub max_packet_bytes: Option<u32>,
}

/// `Option<Duration>` as a whole number of microseconds.
mod micros {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            // Validation keeps durations to whole microseconds that fit in a u64.
            Some(d) => s.serialize_some(&u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_micros))
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlannedFlow {
    pub name: String,
    pub src: String,
    pub dst: String,
    /// Explicit node path (src .. dst) when the user gave one.
    pub path: Option<Vec<String>>,
    /// What the source generates.
    pub params: FlowParams,
    /// Set by the store: the generation in which the flow got this definition
    /// (0 in a plan fresh from a manifest). Flows start once every agent runs it.
    pub defined_generation: i64,
    /// Set by the store: the route row carrying `path` (its id is the packets' label).
    pub route_id: Option<u32>,
}

impl PlannedFlow {
    /// Whether `other` defines the same traffic (store-assigned fields aside), so
    /// a re-applied manifest leaves a running flow alone.
    pub fn same_definition(&self, other: &PlannedFlow) -> bool {
        self.name == other.name
            && self.src == other.src
            && self.dst == other.dst
            && self.path == other.path
            && self.params == other.params
    }
}

/// What a flow's source generates, after validation: everything an agent needs,
/// with Poisson loads already turned into a mean gap. The store keeps it as JSON
/// (keys as in the agent protocol, durations in whole microseconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FlowParams {
    pub protocol: FlowProtocol,
    pub amount: FlowAmount,
    /// Per-instance cap (udp: the rate), payload bit/s.
    pub rate_bps: Option<u64>,
    pub start_delay_us: u64,
    pub count: u32,
    /// 0: all instances at once.
    pub parallelism: u32,
    /// Poisson arrivals with this mean gap; `None`: as parallelism allows.
    pub mean_interarrival_us: Option<u64>,
    pub seed: u64,
    pub window_bytes: u32,
    pub congestion_control: CongestionControl,
    pub dscp: u8,
    /// (largest size in bytes, DSCP), first match wins.
    pub dscp_by_size: Vec<(u64, u8)>,
    /// Max: spliced hop by hop by the agents' relays instead of smoltcp over the links.
    pub mode: RelayMode,
}

/// Default socket buffer of a synthetic connection.
pub const DEFAULT_WINDOW: u32 = 64 * 1024;

impl Default for FlowParams {
    fn default() -> Self {
        FlowParams {
            protocol: FlowProtocol::Tcp,
            amount: FlowAmount::Unbounded,
            rate_bps: None,
            start_delay_us: 0,
            count: 1,
            parallelism: 0,
            mean_interarrival_us: None,
            seed: 1,
            window_bytes: DEFAULT_WINDOW,
            congestion_control: CongestionControl::Cubic,
            dscp: 0,
            dscp_by_size: Vec::new(),
            mode: RelayMode::Normal,
        }
    }
}

impl FlowParams {
    /// The fixed size of every instance, when there is one.
    pub fn size_bytes(&self) -> Option<u64> {
        match self.amount {
            FlowAmount::Bytes(b) => Some(b),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlowProtocol {
    #[default]
    Tcp,
    Udp,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CongestionControl {
    #[default]
    Cubic,
    Reno,
    None,
}

impl CongestionControl {
    pub fn as_str(self) -> &'static str {
        match self {
            CongestionControl::Cubic => "cubic",
            CongestionControl::Reno => "reno",
            CongestionControl::None => "none",
        }
    }
}

/// What each instance sends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum FlowAmount {
    /// Until the flow is removed.
    #[default]
    Unbounded,
    Bytes(u64),
    /// Sizes drawn from these (bytes, P(size <= bytes)) points, linear in between.
    Cdf(Vec<(u64, f64)>),
    /// Sends for this many microseconds.
    DurationUs(u64),
}

/// Nodes to stop and nodes to start to go from one plan to another; every
/// other node keeps running.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeChanges {
    pub removed: Vec<String>,
    pub added: Vec<String>,
}

impl NodeChanges {
    pub fn is_empty(&self) -> bool {
        self.removed.is_empty() && self.added.is_empty()
    }
}

/// One entry of a node's destination routing table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextHop {
    /// Destination node.
    pub dst: String,
    /// Link to send on; `None` when `dst` is the node itself.
    pub link: Option<String>,
}

impl Plan {
    /// The packing of a topology whose nodes run in worker pods.
    pub fn packing(&self) -> Option<Packing> {
        match self.placement {
            Placement::Packed(p) => Some(p),
            _ => None,
        }
    }

    pub fn node(&self, name: &str) -> Option<&PlannedNode> {
        self.nodes.iter().find(|n| n.name == name)
    }

    pub fn link(&self, name: &str) -> Option<&PlannedLink> {
        self.links.iter().find(|l| l.name == name).map(|l| &**l)
    }

    /// One link to change, copied first if a view still shares it.
    pub fn link_mut(&mut self, i: usize) -> &mut PlannedLink {
        std::sync::Arc::make_mut(&mut self.links[i])
    }

    /// The nodes to change, copied first if a view still shares them.
    pub fn nodes_mut(&mut self) -> &mut Vec<PlannedNode> {
        std::sync::Arc::make_mut(&mut self.nodes)
    }

    /// How the nodes change from `self` (running) to `new`, or `None` when the
    /// topology-wide settings differ and every node must be recreated. A node
    /// whose addresses or resources change counts as removed and added.
    pub fn node_changes(&self, new: &Plan) -> Option<NodeChanges> {
        let same_settings = self.topology == new.topology
            && self.overlay == new.overlay
            && self.underlay == new.underlay
            && self.placement == new.placement
            && self.dataplane == new.dataplane;
        if !same_settings {
            return None;
        }
        let kept = |n: &PlannedNode, other: &Plan| other.node(&n.name).is_some_and(|o| o == n);
        Some(NodeChanges {
            removed: self
                .nodes
                .iter()
                .filter(|n| !kept(n, new))
                .map(|n| n.name.clone())
                .collect(),
            added: new
                .nodes
                .iter()
                .filter(|n| !kept(n, self))
                .map(|n| n.name.clone())
                .collect(),
        })
    }

    /// Links that touch `node`, with the peer on the other end.
    pub fn links_of<'a>(
        &'a self,
        node: &'a str,
    ) -> impl Iterator<Item = (&'a PlannedLink, &'a str)> {
        self.links.iter().filter_map(move |l| {
            if l.dialer == node {
                Some((&**l, l.acceptor.as_str()))
            } else if l.acceptor == node {
                Some((&**l, l.dialer.as_str()))
            } else {
                None
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::plan::fixtures::line3;

    #[test]
    fn link_changes_keep_the_nodes_but_node_changes_do_not() {
        let base = line3();
        let mut relinked = base.clone();
        relinked.link_mut(0).forward.rate_bps = Some(20_000_000);
        relinked.links.pop();
        assert!(
            base.node_changes(&relinked)
                .expect("same settings")
                .is_empty(),
            "a link change needs no node restart"
        );

        let mut renumbered = base.clone();
        renumbered.nodes_mut()[1].overlay = std::net::Ipv4Addr::new(198, 18, 9, 9);
        assert_eq!(
            base.node_changes(&renumbered).expect("same settings").added,
            ["b"]
        );
        let mut limited = base.clone();
        limited.nodes_mut()[0].resources.cpu_millis = Some(100);
        assert_eq!(
            base.node_changes(&limited).expect("same settings").removed,
            ["a"]
        );
        let mut wider = base.clone();
        wider.dataplane.processors = 4;
        assert_eq!(
            base.node_changes(&wider),
            None,
            "dataplane changes recreate every node"
        );
    }

    #[test]
    fn node_changes_name_what_to_start_and_stop() {
        let base = line3();
        assert!(base.node_changes(&base).expect("same settings").is_empty());
        let mut grown = base.clone();
        let mut d = grown.nodes[2].clone();
        d.name = "d".into();
        d.index = 3;
        d.overlay = std::net::Ipv4Addr::new(198, 18, 0, 4);
        grown.nodes_mut().push(d);
        grown.nodes_mut()[0].resources.cpu_millis = Some(200);
        let changes = base.node_changes(&grown).expect("same settings");
        assert_eq!(changes.added, ["a", "d"]);
        assert_eq!(
            changes.removed,
            ["a"],
            "a's limits changed: it is recreated"
        );
        let shrunk = Plan {
            nodes: base.nodes[..2].to_vec().into(),
            ..base.clone()
        };
        assert_eq!(
            base.node_changes(&shrunk).expect("same settings"),
            NodeChanges {
                removed: vec!["c".into()],
                added: vec![]
            }
        );
    }
}
