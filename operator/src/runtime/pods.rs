//! Names of what a topology owns in a cluster (its agent pods, headless Service
//! and credentials Secret) and how the store records that a topology runs there.
//! Pure, so the hub and the controller agree without talking to each other.

use crate::hub::Underlay;
use sha2::{Digest, Sha256};

/// `topologies.runtime` of a topology the operator runs: `kubernetes/<namespace>`.
pub const RUNTIME_PREFIX: &str = "kubernetes/";

pub fn runtime_name(namespace: &str) -> String {
    format!("{RUNTIME_PREFIX}{namespace}")
}

/// The namespace a stored runtime names, when the topology runs in a cluster.
pub fn namespace_of(runtime: &str) -> Option<&str> {
    runtime.strip_prefix(RUNTIME_PREFIX)
}

/// How the topology's agents reach each other, from its stored runtime.
pub fn underlay_of(topology: &str, runtime: &str) -> Underlay {
    match namespace_of(runtime) {
        Some(namespace) => Underlay::PodDns {
            service: service_name(topology),
            namespace: namespace.to_string(),
        },
        None => Underlay::Bridge,
    }
}

/// The headless Service that gives every agent pod a DNS name
/// (`<node>.<service>.<namespace>.svc`). Service names must start with a letter.
pub fn service_name(topology: &str) -> String {
    bounded(&format!("nm-{topology}"), 63)
}

/// The Secret holding each node's credential, one key per node.
pub fn credentials_secret(topology: &str) -> String {
    bounded(&format!("nm-{topology}-credentials"), 253)
}

/// The agent pod of a node.
pub fn pod_name(topology: &str, node: &str) -> String {
    bounded(&format!("{topology}-{node}"), 63)
}

/// `name` itself when it fits, else a prefix and a hash of the whole, so long
/// names stay unique and stable.
fn bounded(name: &str, max: usize) -> String {
    if name.len() <= max {
        return name.to_string();
    }
    let hash = hex::encode(&Sha256::digest(name.as_bytes())[..4]);
    let keep = max - hash.len() - 1;
    let prefix = name[..keep].trim_end_matches('-');
    format!("{prefix}-{hash}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_their_limits_and_stay_distinct() {
        assert_eq!(pod_name("line3", "a"), "line3-a");
        assert_eq!(service_name("line3"), "nm-line3");
        let long = "x".repeat(63);
        let a = pod_name(&long, "a");
        let b = pod_name(&long, "b");
        assert!(a.len() <= 63 && b.len() <= 63);
        assert_ne!(a, b);
        assert_eq!(a, pod_name(&long, "a"), "stable");
        assert!(service_name(&long).len() <= 63);
    }

    #[test]
    fn runtime_round_trips_and_selects_the_underlay() {
        let r = runtime_name("lab");
        assert_eq!(namespace_of(&r), Some("lab"));
        assert_eq!(namespace_of("netns"), None);
        assert_eq!(underlay_of("line3", "netns"), Underlay::Bridge);
        assert_eq!(
            underlay_of("line3", &r),
            Underlay::PodDns {
                service: "nm-line3".into(),
                namespace: "lab".into()
            }
        );
    }
}
