//! Custom resources of group `nextmini.io`, version `v1alpha1`: `Topology`, `Link`, `Flow`,
//! `MemberCluster`.
//!
//! The doc comments become the CRD's field descriptions (`kubectl explain`), so they are
//! written for users. Schema patterns, ranges and CEL rules reject what the API server
//! can check on its own; `crate::plan` re-checks everything with better messages for
//! local mode and for what needs the whole topology (unknown nodes, reachability).

mod cluster;
mod common;
mod discipline;
mod flow;
mod link;
mod params;
mod scenario;
mod socks;
mod topology;
mod trace;

pub use cluster::{
    ExposureKind, ExposureSpec, MemberCluster, MemberClusterSpec, MemberClusterStatus, PeerRttSpec,
    SecretKeySelector,
};
pub use common::{
    CidrError, Condition, ConditionStatus, DNS_LABEL_MAX, DNS_LABEL_PATTERN, Ipv4Cidr, Transport,
};
pub use discipline::{
    AqmSpec, ClassSpec, DrrSpec, EcnSpec, MAX_BANDS, MAX_CLASSES, MAX_QUEUES, NoSettings,
    PrioritySpec, Protocol, QueueSpec, RedSpec, SchedulerSpec, WrrSpec,
};
pub use flow::{
    ArrivalsSpec, BuiltinSizes, CongestionControl, DscpBySizeSpec, Flow, FlowMode, FlowPhase,
    FlowProtocol, FlowSpec, FlowStatus, PoissonSpec, SizesSpec,
};
pub use link::{Link, LinkSpec, LinkStatus};
pub use params::{JitterDistribution, LinkDefaultsSpec, LinkParamsSpec};
pub use scenario::{
    LinkState, MAX_SCENARIO_EVENTS, NodeAction, RouteEventSpec, ScenarioEventSpec, ScenarioSpec,
};
pub use socks::{SocksMode, SocksSpec, SocksUserSpec};
pub use topology::{
    AddressingSpec, ClusterPlacementStatus, CountSpec, DataplaneSpec, FatTreeSpec, GeneratorSpec,
    InlineLinkSpec, Mapping, NodeSpec, Placement, RegionLinkSpec, ResourcesSpec, SpreadSpec,
    Topology, TopologySpec, TopologyStatus, TtlMode,
};
pub use trace::{ConfigMapKey, TraceSpec, TraceTextError};

/// API group of every Nextmini kind.
pub const GROUP: &str = "nextmini.io";
/// Version of every Nextmini kind.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` as written in manifests.
pub const API_VERSION: &str = "nextmini.io/v1alpha1";
