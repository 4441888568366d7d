//! The `Link` kind and the link parameters shared with `linkDefaults` and inline links.
//!
//! The parameter fields are repeated in each struct rather than `#[serde(flatten)]`ed
//! because serde cannot deny unknown fields through a flatten, and a typo such as
//! `rat: 1Gbit` must be an error, not a silently unlimited link.

use super::common::{Condition, DNS_LABEL_PATTERN, Transport};
use crate::units::{Duration, Percent, Rate, Size};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Emulation parameters of a link. Every field is optional; an unset field falls back
/// to the topology's `linkDefaults`, and if unset there too means "no limit / no impairment".
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LinkParamsSpec {
    /// Bandwidth in bits per second, e.g. `100Mbit`, `1Gbit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    /// Token-bucket burst allowed above `rate`, e.g. `64KiB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<Size>,
    /// One-way propagation delay, e.g. `5ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<Duration>,
    /// Random variation added to `delay`, e.g. `1ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<Duration>,
    /// Probability that a frame is dropped, e.g. `0.1%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<Percent>,
    /// Queue limit at the sender, in packets (`1000pkt`) or bytes (`1MiB`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<Size>,
    /// How the link is carried between agents: `tcp` (default) or `quic`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Transport>,
}

impl LinkParamsSpec {
    /// Each field of `self`, or of `defaults` where `self` leaves it unset.
    pub fn with_defaults(&self, defaults: &LinkParamsSpec) -> LinkParamsSpec {
        LinkParamsSpec {
            rate: self.rate.or(defaults.rate),
            burst: self.burst.or(defaults.burst),
            delay: self.delay.or(defaults.delay),
            jitter: self.jitter.or(defaults.jitter),
            loss: self.loss.or(defaults.loss),
            queue: self.queue.or(defaults.queue),
            transport: self.transport.or(defaults.transport),
        }
    }
}

/// A link between two nodes of a topology, with its emulation parameters.
///
/// Links are objects of their own so one link can be patched live and large topologies
/// stay below the API server's object-size limit.
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
    /// Bandwidth in bits per second, e.g. `100Mbit`; falls back to `linkDefaults.rate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    /// Token-bucket burst allowed above `rate`, e.g. `64KiB`; falls back to `linkDefaults.burst`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<Size>,
    /// One-way propagation delay, e.g. `5ms`; falls back to `linkDefaults.delay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<Duration>,
    /// Random variation added to `delay`, e.g. `1ms`; falls back to `linkDefaults.jitter`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<Duration>,
    /// Probability that a frame is dropped, e.g. `0.1%`; falls back to `linkDefaults.loss`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<Percent>,
    /// Queue limit at the sender (`1000pkt` or `1MiB`); falls back to `linkDefaults.queue`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<Size>,
    /// `tcp` or `quic`; falls back to `linkDefaults.transport`, then `tcp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Transport>,
}

impl LinkSpec {
    /// The link's own parameters, before falling back to `linkDefaults`.
    pub fn params(&self) -> LinkParamsSpec {
        LinkParamsSpec {
            rate: self.rate,
            burst: self.burst,
            delay: self.delay,
            jitter: self.jitter,
            loss: self.loss,
            queue: self.queue,
            transport: self.transport,
        }
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
