//! Types shared by the three kinds: transports, address pools, status conditions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

/// RFC 1123 label: node names become host names inside the emulated network.
pub const DNS_LABEL_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// Longest RFC 1123 label.
pub const DNS_LABEL_MAX: usize = 63;

// How a link carries frames between its two agents. (A plain comment, not a doc comment:
// kube's schema rewrite for `Option<enum>` would let a type-level description replace
// the more specific description of each field that uses this type.)
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// One TCP connection per link.
    Tcp,
    /// One QUIC connection per link.
    Quic,
}

/// An IPv4 network in CIDR notation (`198.18.0.0/16`), without host bits set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv4Cidr(pub ipnet::Ipv4Net);

/// A CIDR that does not parse or has host bits set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("invalid CIDR {0:?}: expected an IPv4 network like 198.18.0.0/16")]
    Syntax(String),
    #[error("invalid CIDR {given:?}: host bits are set; did you mean {network}?")]
    HostBits {
        given: String,
        network: ipnet::Ipv4Net,
    },
}

impl FromStr for Ipv4Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let syntax = || CidrError::Syntax(s.to_owned());
        // std's address parser, which refuses leading zeros (`010` is octal to
        // inet_aton); ipnet's own would take them.
        let (addr, prefix) = s.split_once('/').ok_or_else(syntax)?;
        let addr: std::net::Ipv4Addr = addr.parse().map_err(|_| syntax())?;
        if prefix.is_empty()
            || prefix.len() > 2
            || (prefix.len() > 1 && prefix.starts_with('0'))
            || !prefix.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(syntax());
        }
        let prefix: u8 = prefix.parse().map_err(|_| syntax())?;
        let net = ipnet::Ipv4Net::new(addr, prefix).map_err(|_| syntax())?;
        // A pool written with host bits is almost always a typo; silently truncating
        // would hand out addresses from a range the user did not mean.
        if net.trunc() != net {
            return Err(CidrError::HostBits {
                given: s.to_owned(),
                network: net.trunc(),
            });
        }
        Ok(Ipv4Cidr(net))
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Serialize for Ipv4Cidr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Ipv4Cidr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = Cow::<str>::deserialize(deserializer)?;
        s.parse().map_err(de::Error::custom)
    }
}

impl JsonSchema for Ipv4Cidr {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "Ipv4Cidr".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": CIDR_PATTERN,
            // Bounds the cost the API server estimates for the rule below.
            "maxLength": 18,
            "description": "an IPv4 network in CIDR notation, e.g. 198.18.0.0/16",
            "x-kubernetes-validations": [{
                "rule": cidr_host_bits_rule(),
                "message": "host bits are set: the address must be the network's first (e.g. 10.0.0.0/16, not 10.0.0.1/16)",
            }],
        })
    }
}

/// The syntax `FromStr` accepts: four octets of 0-255 without leading zeros,
/// and a prefix length of 0-32. Kept equal to the parser by a property test,
/// so that the API server refuses what the operator could not decode: an
/// object that cannot be decoded would stop every watch of its kind.
pub const CIDR_PATTERN: &str = r"^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])/(3[0-2]|[12]?[0-9])$";

/// CEL (run by the API server) for the one check a pattern cannot make: the
/// address modulo 2^(32 - prefix) is zero. CEL has no power function, hence
/// the table of the 33 block sizes indexed by prefix length. It passes what
/// the pattern refuses (its guard is the pattern, without backslashes, which
/// CEL strings do not take), whose message is the one to show.
pub fn cidr_host_bits_rule() -> String {
    let guard = CIDR_PATTERN.replace(r"\.", "[.]");
    let octet = |i: usize| format!("int(self.split('/')[0].split('.')[{i}])");
    let blocks: Vec<String> = (0..=32).map(|p| (1u64 << (32 - p)).to_string()).collect();
    format!(
        "!self.matches(r'{guard}') || ({} * 16777216 + {} * 65536 + {} * 256 + {}) % [{}][int(self.split('/')[1])] == 0",
        octet(0),
        octet(1),
        octet(2),
        octet(3),
        blocks.join(", ")
    )
}

/// Whether a condition holds, as in Kubernetes conditions.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// The operator cannot tell yet.
    Unknown,
}

/// One aspect of an object's state, shaped like `metav1.Condition` so `kubectl wait
/// --for=condition=Ready` works.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Kind of condition in CamelCase, e.g. `Ready`, `Planned`, `Degraded`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Whether the condition holds: True, False or Unknown.
    pub status: ConditionStatus,
    /// Machine-readable CamelCase reason for the last transition, e.g. `InvalidSpec`.
    pub reason: String,
    /// Human-readable details about the last transition.
    pub message: String,
    /// When `status` last changed.
    pub last_transition_time: Time,
    /// The `metadata.generation` this condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_host_bits_rule_skips_what_the_pattern_refuses() {
        // Its guard is the pattern, written without backslashes for CEL.
        let guard = format!("!self.matches(r'{}')", CIDR_PATTERN.replace(r"\.", "[.]"));
        assert!(
            cidr_host_bits_rule().starts_with(&guard),
            "{}",
            cidr_host_bits_rule()
        );
    }

    proptest! {
        // The API server refuses by pattern what the parser refuses for its
        // syntax; host bits are left to cidr_host_bits_rule().
        #[test]
        fn cidr_pattern_matches_the_parser(s in "0?[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}(/0?[0-9]{1,2})?") {
            let admitted = regex::Regex::new(CIDR_PATTERN).expect("compiles").is_match(&s);
            match s.parse::<Ipv4Cidr>() {
                Ok(_) => prop_assert!(admitted, "{s} parses but the pattern refuses it"),
                Err(e) => prop_assert!(!admitted || matches!(e, CidrError::HostBits { .. }), "{s}: {e}"),
            }
        }
    }

    #[test]
    fn cidr_rejects_host_bits_and_garbage() {
        assert_eq!(
            "198.18.0.0/16".parse::<Ipv4Cidr>().map(|c| c.to_string()),
            Ok("198.18.0.0/16".to_owned())
        );
        let host_bits = "198.18.0.5/16"
            .parse::<Ipv4Cidr>()
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            host_bits.as_deref(),
            Some("invalid CIDR \"198.18.0.5/16\": host bits are set; did you mean 198.18.0.0/16?")
        );
        assert!(matches!(
            "10.0.0.0".parse::<Ipv4Cidr>(),
            Err(CidrError::Syntax(_))
        ));
    }
}
