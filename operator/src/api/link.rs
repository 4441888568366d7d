//! The `Link` kind: two endpoints, a transport, and the link parameters of
//! `super::params`, with per-direction overrides.

use super::common::{Condition, DNS_LABEL_PATTERN, Transport};
use super::params::{LinkParamsSpec, with_link_params};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

with_link_params! {
    /// A link between two nodes of a topology, with its emulation parameters.
    ///
    /// Links are objects of their own so one link can be patched live and large topologies
    /// stay below the API server's object-size limit. Parameters left unset are inherited
    /// from the topology's `linkDefaults`; `forward` and `backward` override them for one
    /// direction.
    #[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
    #[kube(
        group = "nextmini.io",
        version = "v1alpha1",
        kind = "Link",
        namespaced,
        status = "LinkStatus",
        derive = "PartialEq",
        shortname = "nmlink",
        category = "nextmini",
        doc = "A link between two nodes of a Nextmini topology.",
        printcolumn = r#"{"name": "Topology", "type": "string", "description": "Topology the link belongs to", "jsonPath": ".spec.topology"}"#,
        printcolumn = r#"{"name": "Rate", "type": "string", "description": "Bandwidth", "jsonPath": ".spec.rate"}"#,
        printcolumn = r#"{"name": "Delay", "type": "string", "description": "One-way delay", "jsonPath": ".spec.delay"}"#,
        printcolumn = r#"{"name": "Up", "type": "boolean", "description": "Whether both ends are connected", "jsonPath": ".status.up"}"#,
        printcolumn = r#"{"name": "Age", "type": "date", "description": "Time since creation", "jsonPath": ".metadata.creationTimestamp"}"#
    )]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct LinkSpec {
        /// Name of the Topology (in the same namespace) this link belongs to.
        #[schemars(length(min = 1))]
        pub topology: String,
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

/// Observed state of a Link.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LinkStatus {
    /// The `metadata.generation` the status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Whether both agents report the link connected.
    #[serde(default)]
    pub up: bool,
    /// Current conditions of the link (`Ready`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
