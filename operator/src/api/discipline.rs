//! How a link's sender queues and schedules packets: the queue and its AQM, the
//! scheduler, and the classes that sort packets into the scheduler's queues.
//!
//! A choice of kind (`aqm`, `scheduler`) is a mapping with exactly one key, as the
//! generator is: that is what a structural CRD schema can express, and CEL rules make
//! the API server enforce "exactly one". The planner checks the same for local mode.

use crate::units::{Fraction, Percent, Size};
use kube::KubeSchema;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use std::borrow::Cow;
use std::fmt;

/// The sender's queue of one direction of a link.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(
    rename_all = "camelCase",
    deny_unknown_fields,
    expecting = "a mapping such as {limit: 1000pkt, aqm: {taildrop: {}}}"
)]
pub struct QueueSpec {
    /// Most the queue holds, in packets (`1000pkt`) or bytes (`64KB`); the agent's
    /// default when unset everywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<Size>,
    /// Active queue management: exactly one of `taildrop`, `red`, `ecn`; `taildrop`
    /// when unset everywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aqm: Option<AqmSpec>,
}

/// What the queue does as it fills; set exactly one field.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(
    rename_all = "camelCase",
    deny_unknown_fields,
    expecting = "a mapping with one of taildrop, red, ecn, scheme, e.g. {taildrop: {}}"
)]
#[x_kube(validation = Rule::new("(has(self.taildrop) ? 1 : 0) + (has(self.red) ? 1 : 0) + (has(self.ecn) ? 1 : 0) + (has(self.scheme) ? 1 : 0) == 1").message("set exactly one of taildrop, red, ecn, scheme"))]
pub struct AqmSpec {
    /// Drop arriving packets while the queue is full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taildrop: Option<NoSettings>,
    /// Random Early Detection: drop (or ECN-mark) with a probability that grows with the
    /// average queue length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub red: Option<RedSpec>,
    /// Mark ECN-capable packets while the queue is longer than a threshold (DCTCP-style).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecn: Option<EcnSpec>,
    /// A registered AQM scheme, by name, with its own settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<SchemeSpec>,
}

impl AqmSpec {
    /// How many kinds are set; the spec is valid with exactly one.
    pub fn kinds_set(&self) -> usize {
        [
            self.taildrop.is_some(),
            self.red.is_some(),
            self.ecn.is_some(),
            self.scheme.is_some(),
        ]
        .into_iter()
        .filter(|&set| set)
        .count()
    }
}

/// A scheme from the agent's registry (`node-agent/src/sched/schemes`): its name
/// and its settings, which the scheme's own types check.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SchemeSpec {
    /// The registered name, e.g. `pfabric`.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// The scheme's settings, as its documentation gives them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_mapping")]
    pub settings: Option<serde_json::Value>,
}

/// A mapping the API server keeps as written: a scheme's settings are checked by
/// the scheme, not by the CRD.
fn free_form_mapping(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "description": "the scheme's settings",
    })
}

/// A choice that takes no settings, written `{}`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NoSettings {}

impl JsonSchema for NoSettings {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "NoSettings".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        // Not derived: `deny_unknown_fields` would add `additionalProperties: false`,
        // which a CRD schema may not contain. The API server prunes unknown keys.
        json_schema!({
            "type": "object",
            "description": "no settings: write {}",
        })
    }
}

/// Random Early Detection, as in `tc red`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("self.min < self.max").message("red: min must be less than max"))]
pub struct RedSpec {
    /// Average queue length, in packets, below which nothing is dropped.
    pub min: u32,
    /// Average queue length, in packets, at which the probability reaches `maxP`; above
    /// it every packet is dropped (or marked).
    pub max: u32,
    /// Drop probability at `max`, e.g. `10%`.
    pub max_p: Percent,
    /// Weight of the newest sample in the average queue length, between 0 and 1
    /// (e.g. 0.002); small values follow bursts slowly.
    pub weight: Fraction,
    /// Mark ECN-capable packets instead of dropping them.
    #[serde(default)]
    pub ecn: bool,
}

/// ECN marking at a fixed queue length.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EcnSpec {
    /// Queue length, in packets, above which ECN-capable packets are marked.
    #[schemars(range(min = 1))]
    pub threshold: u32,
}

/// How the link's queues share it; set exactly one field.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(
    rename_all = "camelCase",
    deny_unknown_fields,
    expecting = "a mapping with one of fcfs, wrr, drr, priority, scheme, e.g. {fcfs: {}}"
)]
#[x_kube(validation = Rule::new("(has(self.fcfs) ? 1 : 0) + (has(self.wrr) ? 1 : 0) + (has(self.drr) ? 1 : 0) + (has(self.priority) ? 1 : 0) + (has(self.scheme) ? 1 : 0) == 1").message("set exactly one of fcfs, wrr, drr, priority, scheme"))]
pub struct SchedulerSpec {
    /// One queue, first come first served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fcfs: Option<NoSettings>,
    /// Weighted round robin over one queue per weight, counting packets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrr: Option<WrrSpec>,
    /// Deficit round robin over one queue per quantum, counting bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drr: Option<DrrSpec>,
    /// Strict priority: queue 0 is always served first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<PrioritySpec>,
    /// A registered scheduler scheme, by name, with its own settings (e.g.
    /// `{name: pfabric, settings: {flows: [{port: 5001, bytes: 1000000}]}}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<SchemeSpec>,
}

impl SchedulerSpec {
    /// How many kinds are set; the spec is valid with exactly one.
    pub fn kinds_set(&self) -> usize {
        [
            self.fcfs.is_some(),
            self.wrr.is_some(),
            self.drr.is_some(),
            self.priority.is_some(),
            self.scheme.is_some(),
        ]
        .into_iter()
        .filter(|&set| set)
        .count()
    }
}

/// Most queues a round-robin scheduler may have.
pub const MAX_QUEUES: usize = 64;
/// Most bands a priority scheduler may have, as with `tc prio`.
pub const MAX_BANDS: u32 = 8;
/// Most class rules per link direction.
pub const MAX_CLASSES: usize = 256;

/// Weighted round robin.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WrrSpec {
    /// Packets each queue may send per round, one weight per queue (queue 0 first).
    #[schemars(length(min = 1, max = MAX_QUEUES), inner(range(min = 1)))]
    pub weights: Vec<u32>,
}

/// Deficit round robin.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DrrSpec {
    /// Bytes each queue is credited per round, one per queue (queue 0 first), e.g. `1500`
    /// or `3KB`.
    #[schemars(length(min = 1, max = MAX_QUEUES))]
    pub quantum: Vec<Size>,
}

/// Strict priority.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrioritySpec {
    /// Number of queues (1-8); queue 0 has the highest priority.
    #[schemars(range(min = 1, max = MAX_BANDS))]
    pub bands: u32,
}

/// A rule sending matching packets to one of the scheduler's queues. Unset matchers
/// match everything; a packet must match all the set ones.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClassSpec {
    /// Index of the queue (0 first) that matching packets join.
    pub queue: u32,
    /// DSCP value of the packet's IP header (0-63), e.g. 46 for Expedited Forwarding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 63))]
    pub dscp: Option<u32>,
    /// TCP or UDP source port (1-65535).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub src_port: Option<u32>,
    /// TCP or UDP destination port (1-65535).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub dst_port: Option<u32>,
    /// IP protocol: `tcp`, `udp`, `icmp` or its number (0-255).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// Matches packets smaller than this many bytes, e.g. `128`, to favour short messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_packet_size: Option<Size>,
}

/// An IP protocol number, written by name where it has a common one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Protocol(pub u8);

const PROTOCOL_NAMES: &[(&str, u8)] = &[("icmp", 1), ("tcp", 6), ("udp", 17)];

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match PROTOCOL_NAMES.iter().find(|&&(_, n)| n == self.0) {
            Some((name, _)) => f.write_str(name),
            None => write!(f, "{}", self.0),
        }
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(&(_, n)) = PROTOCOL_NAMES.iter().find(|&&(name, _)| name == s) {
            return Ok(Protocol(n));
        }
        s.parse::<u8>().map(Protocol).map_err(|_| {
            format!("invalid protocol {s:?}: expected tcp, udp, icmp or a number from 0 to 255")
        })
    }
}

impl Serialize for Protocol {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if PROTOCOL_NAMES.iter().any(|&(_, n)| n == self.0) {
            serializer.collect_str(self)
        } else {
            serializer.serialize_u8(self.0)
        }
    }
}

impl<'de> Deserialize<'de> for Protocol {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Protocol;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("tcp, udp, icmp or an IP protocol number")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Protocol, E> {
                s.parse().map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Protocol, E> {
                self.visit_str(&n.to_string())
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Protocol, E> {
                self.visit_str(&n.to_string())
            }
        }
        deserializer.deserialize_any(V)
    }
}

impl JsonSchema for Protocol {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "Protocol".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "x-kubernetes-int-or-string": true,
            "pattern": "^(tcp|udp|icmp|[0-9]{1,3})$",
            "description": "an IP protocol: tcp, udp, icmp or a number",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocols_parse_by_name_or_number() {
        let p = |y: &str| serde_norway::from_str::<Protocol>(y).map_err(|e| e.to_string());
        assert_eq!(p("tcp"), Ok(Protocol(6)));
        assert_eq!(p("17"), Ok(Protocol(17)));
        assert_eq!(p("'47'"), Ok(Protocol(47)));
        assert!(p("256").is_err_and(|e| e.contains("0 to 255")));
        assert!(p("sctp").is_err_and(|e| e.contains("invalid protocol \"sctp\"")));
        assert_eq!(
            serde_json::to_value([Protocol(6), Protocol(47)]).ok(),
            Some(serde_json::json!(["tcp", 47]))
        );
    }

    #[test]
    fn the_api_server_enforces_the_choices() {
        let yaml = crate::crdgen::crd_yaml();
        for message in [
            "set exactly one of taildrop, red, ecn, scheme",
            "set exactly one of fcfs, wrr, drr, priority, scheme",
            "red: min must be less than max",
        ] {
            assert!(yaml.contains(message), "CRD lacks the rule {message:?}");
        }
        assert!(
            !yaml.contains("additionalProperties"),
            "a CRD schema may not set additionalProperties: false"
        );
    }

    #[test]
    fn a_bare_string_where_a_mapping_belongs_says_what_to_write() {
        let e = serde_norway::from_str::<QueueSpec>("1000pkt")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("expected a mapping such as {limit: 1000pkt"),
            "{e}"
        );
        let e = serde_norway::from_str::<SchedulerSpec>("fcfs")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("one of fcfs, wrr, drr, priority, scheme"), "{e}");
    }
}
