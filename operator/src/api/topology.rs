//! The `Topology` kind: nodes, dataplane settings, address pools and link defaults.

use super::common::{Condition, DNS_LABEL_PATTERN, Ipv4Cidr, Transport};
use super::params::{LinkDefaultsSpec, LinkParamsSpec, with_link_params};
use crate::units::{Cpu, Size};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An emulated network: its nodes, how they are run, and defaults for its links.
///
/// Links usually come as separate `Link` objects naming this topology; small topologies
/// may list them inline under `links`, and `generator` can produce regular shapes.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "nextmini.io",
    version = "v1alpha1",
    kind = "Topology",
    namespaced,
    status = "TopologyStatus",
    derive = "PartialEq",
    shortname = "topo",
    category = "nextmini",
    doc = "An emulated network of Nextmini nodes.",
    printcolumn = r#"{"name": "Nodes", "type": "integer", "description": "Nodes whose agent is connected", "jsonPath": ".status.nodesReady"}"#,
    printcolumn = r#"{"name": "Links", "type": "integer", "description": "Links that are up", "jsonPath": ".status.linksUp"}"#,
    printcolumn = r#"{"name": "Ready", "type": "string", "description": "Ready condition", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name": "Faithful", "type": "string", "description": "False while the emulator, not the emulated links, limited traffic (the fidelity guard)", "jsonPath": ".status.conditions[?(@.type==\"Faithful\")].status"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "description": "Time since creation", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("!(has(self.nodesPerWorker) && has(self.workers))").message("set nodesPerWorker or workers, not both"))]
#[x_kube(validation = Rule::new("self.placement in ['packed', 'netns'] || !(has(self.nodesPerWorker) || has(self.workers) || has(self.workerImage))").message("nodesPerWorker, workers and workerImage need placement: packed"))]
pub struct TopologySpec {
    /// Where virtual nodes run: `auto` (the default: network namespaces on one
    /// machine, one pod per node in a cluster), `packed` (in a cluster, a few
    /// worker pods each hosting many nodes as network namespaces; on one
    /// machine the same as `netns`), `netns` (network namespaces; packed pods in
    /// a cluster) or `pod-per-node`.
    #[serde(default)]
    pub placement: Placement,
    /// Packed placement: how many nodes each worker pod hosts, 1 to 1000 (default
    /// 50). Node i runs in worker i / nodesPerWorker, so nodes added at the end
    /// leave the other workers alone. Set this or `workers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub nodes_per_worker: Option<u32>,
    /// Packed placement: the number of worker pods; node i runs in worker
    /// i mod workers. At most 1000 nodes may share a worker. Set this or
    /// `nodesPerWorker`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65534))]
    pub workers: Option<u32>,
    /// Packed placement: the image of the worker pods (default: the operator's
    /// agent image). Build it `FROM` the Nextmini image and add the tools your
    /// nodes run (`kubectl exec <worker> -- nextmini exec <node> -- <command>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub worker_image: Option<String>,
    /// Settings of every node's dataplane.
    #[serde(default)]
    pub dataplane: DataplaneSpec,
    /// Parameters every link inherits for the fields it leaves unset (in both directions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_defaults: Option<LinkDefaultsSpec>,
    /// Address pools for the overlay (TUN) and underlay (bridge / pod) networks.
    #[serde(default)]
    pub addressing: AddressingSpec,
    /// How the agents report their counters; changes apply live.
    #[serde(default)]
    pub telemetry: TelemetrySpec,
    /// The experiment's seed: every random draw of the dataplane (loss, jitter,
    /// reordering, duplication, corruption, RED) and of synthetic flows without a
    /// seed of their own comes from a stream derived from it and the link's or
    /// flow's name, so two runs with the same seed and the same traffic drop the
    /// same packets. Unset: streams derived from the names alone (also
    /// reproducible). Links take it when they are built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// A timed scenario: link changes (parameters, down, up) at offsets from
    /// the moment the topology first runs, applied by each agent at the
    /// instant with its own timer and recorded with the time each took effect
    /// (`nextmini status`, table `scenario_applied`). It runs once per
    /// creation of the topology.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<super::scenario::ScenarioSpec>,
    /// The nodes, in order; a node's position decides its addresses.
    #[serde(default)]
    #[schemars(length(max = 65534))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub nodes: Vec<NodeSpec>,
    /// Links listed inline, for small topologies; `Link` objects may add more.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10000))]
    pub links: Vec<InlineLinkSpec>,
    /// Generates nodes `n0..n{N-1}` (or fat-tree nodes) and their links; nodes listed
    /// under `nodes` and links from `links` or `Link` objects are added to them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator: Option<GeneratorSpec>,
    /// Spreads the generated nodes over regions or member clusters in equal
    /// contiguous blocks, in generation order (so a ring or line crosses each
    /// boundary once). Listed nodes keep their own `cluster` or `region`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<SpreadSpec>,
    /// Link parameters between two regions (or inside one, when both names are the
    /// same), e.g. a WAN delay: a link whose ends are in those regions inherits
    /// them before its own fields, after `linkDefaults`. In a cluster the real
    /// round trip between the two ends' clusters is subtracted from the delay
    /// (half of it per direction), and a delay shorter than that is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024))]
    pub region_links: Vec<RegionLinkSpec>,
}

/// How generated nodes are spread; set exactly one field.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("has(self.regions) != has(self.clusters)").message("set exactly one of regions, clusters"))]
pub struct SpreadSpec {
    /// Regions, in order: the first block of generated nodes goes to the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 256),
        inner(pattern(DNS_LABEL_PATTERN), length(max = 63))
    )]
    pub regions: Option<Vec<String>>,
    /// MemberCluster names, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256), inner(length(min = 1, max = 253)))]
    pub clusters: Option<Vec<String>>,
}

with_link_params! {
    /// Parameters of the links between two regions.
    #[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct RegionLinkSpec {
        /// The two regions; the same name twice means links inside that region.
        /// Both directions get the parameters.
        #[schemars(
            length(min = 2, max = 2),
            inner(pattern(DNS_LABEL_PATTERN), length(max = 63))
        )]
        pub regions: Vec<String>,
        /// `tcp` or `quic` for these links; the link's own `transport` wins.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub transport: Option<Transport>,
    }
}

/// Where virtual nodes run.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Network namespaces on one machine (`nextmini up`), one pod per node in a cluster.
    #[default]
    Auto,
    /// One network namespace and agent process per node (locally, or packed into pods).
    Netns,
    /// One Kubernetes pod per node.
    PodPerNode,
    /// A few worker pods, each hosting many nodes as network namespaces (a
    /// cluster); network namespaces on one machine.
    Packed,
}

/// How the agents report counters to the control plane.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TelemetrySpec {
    /// Interval between two reports of every agent, from 100ms to 60s (default 1s).
    /// Each report is stored in the metrics history.
    #[serde(default = "default_report_interval")]
    pub interval: crate::units::Duration,
}

fn default_report_interval() -> crate::units::Duration {
    crate::units::Duration::from_std(std::time::Duration::from_secs(1))
}

impl Default for TelemetrySpec {
    fn default() -> Self {
        TelemetrySpec {
            interval: default_report_interval(),
        }
    }
}

/// Dataplane settings applied to every node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataplaneSpec {
    /// Number of packet-processing tasks per node (1-64).
    #[serde(default = "default_processors")]
    #[schemars(range(min = 1, max = 64))]
    pub processors: u32,
    /// How flows are spread over processors: `sequential` or `concurrent`.
    #[serde(default)]
    pub mapping: Mapping,
    /// MTU of the TUN device in bytes (576-9000).
    #[serde(default = "default_mtu")]
    #[schemars(range(min = 576, max = 9000))]
    pub mtu: u32,
    /// What emulated nodes do with the IP TTL: `transparent` (the default: the
    /// emulated network looks like one hop) or `decrement` (every transit node
    /// is a router: it decrements the TTL / hop limit and answers expiry with
    /// ICMP Time Exceeded, so traceroute and mtr show the emulated path).
    #[serde(default)]
    pub ttl: TtlMode,
}

fn default_processors() -> u32 {
    2
}

fn default_mtu() -> u32 {
    1400
}

impl Default for DataplaneSpec {
    fn default() -> Self {
        DataplaneSpec {
            processors: default_processors(),
            mapping: Mapping::default(),
            mtu: default_mtu(),
            ttl: TtlMode::default(),
        }
    }
}

/// What emulated nodes do with the IP TTL of packets they forward.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TtlMode {
    /// Carried through untouched: the whole emulated path is one IP hop.
    #[default]
    Transparent,
    /// Decremented at every transit node, with ICMP Time Exceeded on expiry.
    Decrement,
}

/// How flows are assigned to processor tasks.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mapping {
    /// Each flow sticks to one processor, keeping its packets in order.
    #[default]
    Sequential,
    /// Packets of a flow may be processed by any processor.
    Concurrent,
}

/// Address pools. Both default to halves of 198.18.0.0/15, the benchmarking range, so
/// emulated networks never collide with real ones.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AddressingSpec {
    /// Pool of overlay (TUN) addresses; node i gets the (i+1)-th host address.
    #[serde(default = "default_overlay")]
    pub overlay: Ipv4Cidr,
    /// Pool of underlay addresses (namespace bridge); node i gets the (i+1)-th host address.
    #[serde(default = "default_underlay")]
    pub underlay: Ipv4Cidr,
}

fn default_overlay() -> Ipv4Cidr {
    Ipv4Cidr(ipnet::Ipv4Net::new_assert(
        std::net::Ipv4Addr::new(198, 18, 0, 0),
        16,
    ))
}

fn default_underlay() -> Ipv4Cidr {
    Ipv4Cidr(ipnet::Ipv4Net::new_assert(
        std::net::Ipv4Addr::new(198, 19, 0, 0),
        17,
    ))
}

impl Default for AddressingSpec {
    fn default() -> Self {
        AddressingSpec {
            overlay: default_overlay(),
            underlay: default_underlay(),
        }
    }
}

/// One virtual node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSpec {
    /// Node name, a DNS label (lowercase letters, digits, '-'); other nodes reach it by this name.
    #[schemars(pattern(DNS_LABEL_PATTERN), length(min = 1, max = 63))]
    pub name: String,
    /// CPU and memory for the node's agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesSpec>,
    /// SOCKS5 servers run by the node's agent, each on its own address: the way in
    /// for applications outside the emulated network, e.g.
    /// `[{listen: "127.0.0.1:1080"}, {listen: "127.0.0.1:1081", mode: max}]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub socks: Vec<super::SocksSpec>,
    /// Application containers run beside the agent in the node's pod (cluster
    /// only; Kubernetes `Container` objects). They share the pod's network
    /// namespace, so their traffic to other nodes' names crosses the emulated
    /// network.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "containers_schema")]
    pub containers: Vec<serde_json::Value>,
    /// The MemberCluster the node runs in (default: the operator's own cluster;
    /// one machine in namespace mode). Set this or `region`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub cluster: Option<String>,
    /// The region the node runs in: a MemberCluster of that region is chosen
    /// (the nodes of a region go round the region's clusters by name). Set this
    /// or `cluster`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(DNS_LABEL_PATTERN), length(min = 1, max = 63))]
    pub region: Option<String>,
}

fn containers_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "description": "Application containers run beside the agent in the node's pod (cluster only; Kubernetes `Container` objects). They share the pod's network namespace, so their traffic to other nodes' names crosses the emulated network.",
        "items": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true
        }
    })
}

/// Compute resources of a node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourcesSpec {
    /// CPU in cores or millicores, e.g. `500m`, `2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    /// Memory in bytes, e.g. `64Mi`, `1GiB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Size>,
}

with_link_params! {
    /// A link listed inside the Topology, with the same parameters as a `Link` object.
    #[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct InlineLinkSpec {
        /// Link name; defaults to `<first endpoint>-<second endpoint>`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub name: Option<String>,
        /// The two nodes joined by the link. The first one dials, the second accepts.
        #[schemars(
            length(min = 2, max = 2),
            inner(pattern(DNS_LABEL_PATTERN), length(max = 63))
        )]
        #[x_kube(validation = Rule::new("self.size() != 2 || self[0] != self[1]").message("endpoints must name two different nodes"))]
        pub endpoints: Vec<String>,
        /// `tcp` or `quic`; falls back to `linkDefaults.transport`, then `tcp`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub transport: Option<Transport>,
        /// Overrides for the direction from `endpoints[0]` to `endpoints[1]` (what the
        /// first node sends), field by field.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub forward: Option<LinkParamsSpec>,
        /// Overrides for the direction from `endpoints[1]` to `endpoints[0]` (what the
        /// second node sends), field by field.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub backward: Option<LinkParamsSpec>,
    }
}

/// A regular shape to generate; set exactly one field.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("(has(self.ring) ? 1 : 0) + (has(self.line) ? 1 : 0) + (has(self.star) ? 1 : 0) + (has(self.fatTree) ? 1 : 0) == 1").message("set exactly one of ring, line, star, fatTree"))]
pub struct GeneratorSpec {
    /// `nodes` nodes in a cycle: n0-n1, ..., n{N-1}-n0 (at least 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<CountSpec>,
    /// `nodes` nodes in a chain: n0-n1, ..., n{N-2}-n{N-1}.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<CountSpec>,
    /// Hub n0 linked to n1..n{N-1}.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub star: Option<CountSpec>,
    /// A k-ary fat tree: core-i, agg-p-i, edge-p-i and host-p-e-h nodes (k even).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fat_tree: Option<FatTreeSpec>,
}

/// Size of a ring, line or star.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CountSpec {
    /// Number of nodes (named `nodes`, not `n`: YAML 1.1 tools such as kubectl read a bare `n` as false).
    #[schemars(range(min = 1, max = 65534))]
    pub nodes: u32,
}

/// Size of a fat tree.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("self.k % 2 == 0").message("k must be even"))]
pub struct FatTreeSpec {
    /// Switch port count; even, at least 2. Gives k^3/4 hosts and 5k^2/4 switches.
    #[schemars(range(min = 2, max = 64))]
    pub k: u32,
}

/// Observed state of a Topology.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologyStatus {
    /// The `metadata.generation` the status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Current conditions (`Ready`, `Planned`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Nodes whose agent is connected to the operator.
    #[serde(default)]
    pub nodes_ready: u32,
    /// Nodes in the plan.
    #[serde(default)]
    pub nodes_total: u32,
    /// Links whose two ends are connected.
    #[serde(default)]
    pub links_up: u32,
    /// Links in the plan.
    #[serde(default)]
    pub links_total: u32,
    /// Where the nodes run, per member cluster, when some run in a member
    /// cluster other than the operator's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<ClusterPlacementStatus>,
}

/// What the operator keeps of a topology in one member cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPlacementStatus {
    /// The MemberCluster's name; unset for the operator's own cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The namespace of the topology's pods there.
    #[serde(default)]
    pub namespace: String,
    /// Nodes placed there.
    #[serde(default)]
    pub nodes: u32,
    /// Of those, agents connected and running the current generation.
    #[serde(default)]
    pub nodes_ready: u32,
    /// Agent pods there.
    #[serde(default)]
    pub pods: u32,
    /// Of those, pods in phase Running.
    #[serde(default)]
    pub pods_running: u32,
    /// Whether the operator reached the cluster's API server at its last
    /// reconcile; when not, its pods are left as they were until it answers
    /// again.
    #[serde(default)]
    pub reachable: bool,
    /// Why the cluster was not reachable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
