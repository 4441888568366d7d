//! `spec.scenario` of a Topology: a timeline of changes at offsets from the
//! moment the topology first runs (every agent applied its config and every
//! link forwards). Each agent applies the events that touch it with its own
//! timer (DESIGN.md "Timed scenarios").

use super::common::DNS_LABEL_PATTERN;
use super::discipline::Protocol;
use super::params::LinkParamsSpec;
use crate::units::Duration;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// At most this many events in one scenario.
pub const MAX_SCENARIO_EVENTS: usize = 1000;

/// A timeline of link and node changes at offsets from the scenario's start.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScenarioSpec {
    /// The events, in order of their offsets (equal offsets keep their order).
    /// At most 1000.
    #[serde(default)]
    #[schemars(length(max = 1000))]
    pub events: Vec<ScenarioEventSpec>,
}

/// One change at one offset: a `link` with either `set` parameters or its
/// `state`, a `node` with an `action`, or a `route`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScenarioEventSpec {
    /// Offset from the scenario's start, e.g. `5s` or `2500ms` (at most 86400s, a day).
    pub at: Duration,
    /// The link the event changes, by name (or name a `node`, or give a `route`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    /// The node the event acts on, by name (or name a `link`, or give a `route`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// What happens to the `node`: `kill` stops its agent (locally SIGKILL;
    /// in a cluster the agent exits), and the node stays down until a
    /// `restart` event; `restart` brings it back (the agent gets its config
    /// and the scenario's state from the hub). In a cluster a node restarted
    /// sooner than its pod's back-off comes back late, as recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<NodeAction>,
    /// New parameters for both directions of the link, field by field, layered
    /// over the link's own (and what earlier events set), as a direction
    /// override would be. The agents change the running pipeline in place:
    /// queued packets and the link's state stay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set: Option<LinkParamsSpec>,
    /// `down`: the link stops forwarding (both ends drop what they would send
    /// on it, counted as drops); `up`: it forwards again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<LinkState>,
    /// A route rule from this instant: the traffic it matches takes `path`
    /// (label-switched along it), or, without `path`, goes back to how the
    /// stored routes send it. The source node's agent swaps its table at the
    /// instant; the path's other nodes know the route from the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<RouteEventSpec>,
}

/// Which traffic a route event moves, and where to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteEventSpec {
    /// The node the traffic enters at (its source).
    #[schemars(pattern(DNS_LABEL_PATTERN), length(min = 1, max = 63))]
    pub src: String,
    /// The node the traffic is for.
    #[schemars(pattern(DNS_LABEL_PATTERN), length(min = 1, max = 63))]
    pub dst: String,
    /// Only this IP protocol: `tcp`, `udp`, `icmp` or its number (default: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// Only this TCP or UDP source port (1-65535; default: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub src_port: Option<u32>,
    /// Only this TCP or UDP destination port (1-65535; default: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub dst_port: Option<u32>,
    /// The node path from `src` to `dst`, both included, along links, no node
    /// twice. Unset: an earlier route event's rule for the same traffic ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(inner(pattern(DNS_LABEL_PATTERN), length(max = 63)))]
    pub path: Option<Vec<String>>,
}

/// Whether a link forwards.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LinkState {
    Up,
    Down,
}

/// What a scenario does to a node's agent.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NodeAction {
    Kill,
    Restart,
}
