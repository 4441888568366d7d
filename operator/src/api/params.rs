//! The link emulation parameters: one set of fields shared by `Link` objects, inline
//! links, `linkDefaults` and the per-direction overrides `forward` / `backward`.
//!
//! The fields are pasted into each struct by `with_link_params!` rather than
//! `#[serde(flatten)]`ed because serde cannot deny unknown fields through a flatten,
//! and a typo such as `rat: 1Gbit` must be an error, not a silently unlimited link.
//! Every field is optional: an unset field is inherited, field by field, in the order
//! direction override, then link, then `linkDefaults`; unset everywhere means no limit
//! and no impairment.

use super::common::Transport;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// How jitter is spread around `delay`. (A plain comment, not a doc comment: see
// `Transport` for why.)
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum JitterDistribution {
    /// Any value in delay ± jitter is equally likely.
    #[default]
    Uniform,
    /// Normal around `delay` with standard deviation `jitter`.
    Normal,
    /// Pareto: mostly small deviations, now and then large ones.
    Pareto,
}

/// Defines a struct holding the given fields followed by every link parameter, and
/// its `params()` returning the parameters alone.
macro_rules! with_link_params {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$field_meta:meta])* pub $field:ident: $ty:ty, )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $( $(#[$field_meta])* pub $field: $ty, )*
            /// Bandwidth in bits per second, e.g. `100Mbit`; a token bucket paces what the
            /// sender puts on the link. Unset everywhere: unlimited.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub rate: Option<$crate::units::Rate>,
            /// A packet-delivery trace (Mahimahi's format) deciding when packets leave,
            /// instead of `rate` and `burst`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub trace: Option<$crate::api::TraceSpec>,
            /// Depth of the token bucket in bytes, e.g. `64KiB`: what may leave at once
            /// above `rate`; at least the MTU. Unset everywhere: one packet.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub burst: Option<$crate::units::Size>,
            /// One-way delay added to every packet, e.g. `5ms` (whole microseconds).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub delay: Option<$crate::units::Duration>,
            /// Random variation of `delay`, e.g. `1ms`: each packet waits delay ± jitter,
            /// never less than zero, as with netem.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub jitter: Option<$crate::units::Duration>,
            /// How `jitter` is distributed: `uniform` (the default), `normal` or `pareto`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub jitter_distribution: Option<$crate::api::JitterDistribution>,
            /// Probability that a packet is dropped, e.g. `0.1%`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub loss: Option<$crate::units::Percent>,
            /// How much each loss decision follows the previous one, e.g. `25%`; higher
            /// values make losses come in bursts.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub loss_correlation: Option<$crate::units::Percent>,
            /// Share of packets sent at once instead of after `delay`, so they overtake
            /// earlier ones, e.g. `1%`; needs a delay, as with netem.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub reorder: Option<$crate::units::Percent>,
            /// Probability that a packet is sent twice, e.g. `0.1%`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub duplicate: Option<$crate::units::Percent>,
            /// Probability that a packet gets a random bit flipped, e.g. `0.01%`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub corrupt: Option<$crate::units::Percent>,
            /// The sender's queue: its limit and its active queue management. `limit`
            /// and `aqm` are inherited separately.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub queue: Option<$crate::api::QueueSpec>,
            /// How the queues share the link: exactly one of `fcfs`, `wrr`, `drr`,
            /// `priority`. Unset everywhere: `fcfs`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub scheduler: Option<$crate::api::SchedulerSpec>,
            /// Rules sorting packets into the scheduler's queues, tried in order; packets
            /// no rule matches join the last queue. An empty list drops inherited rules.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schemars(length(max = $crate::api::MAX_CLASSES))]
            pub classes: Option<Vec<$crate::api::ClassSpec>>,
        }

        impl $name {
            /// The link parameters alone.
            pub fn params(&self) -> $crate::api::LinkParamsSpec {
                $crate::api::LinkParamsSpec {
                    rate: self.rate,
                    trace: self.trace.clone(),
                    burst: self.burst,
                    delay: self.delay,
                    jitter: self.jitter,
                    jitter_distribution: self.jitter_distribution,
                    loss: self.loss,
                    loss_correlation: self.loss_correlation,
                    reorder: self.reorder,
                    duplicate: self.duplicate,
                    corrupt: self.corrupt,
                    queue: self.queue.clone(),
                    scheduler: self.scheduler.clone(),
                    classes: self.classes.clone(),
                }
            }
        }
    };
}
pub(crate) use with_link_params;

with_link_params! {
    /// Parameters of one direction of a link; each field set here overrides the link's
    /// own value (and `linkDefaults`) for that direction.
    #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct LinkParamsSpec {}
}

with_link_params! {
    /// Parameters every link of the topology inherits for the fields it leaves unset.
    #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct LinkDefaultsSpec {
        /// How links are carried between agents: `tcp` (the default) or `quic`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub transport: Option<Transport>,
    }
}
