//! Names of what a topology owns in a cluster (its agent pods, headless Service,
//! credentials Secrets and hosts ConfigMaps) and how the store records that a topology runs there.
//! Pure, so the hub and the controller agree without talking to each other.
//! Each takes the topology's key (`namespace/name`) and names objects by the
//! name alone: they live in that namespace already.

use crate::hub::Underlay;
use crate::plan::Plan;
use nextmini_proto::topology_key::name_of;
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

/// How the topology's agents reach each other, from its plan and stored runtime.
pub fn underlay_of(plan: &Plan, runtime: &str) -> Underlay {
    let topology = &plan.topology;
    match (namespace_of(runtime), plan.packing()) {
        (Some(namespace), Some(packing)) => Underlay::Packed {
            service: service_name(topology),
            namespace: namespace.to_string(),
            packing,
        },
        (Some(namespace), None) => Underlay::PodDns {
            service: service_name(topology),
            namespace: namespace.to_string(),
        },
        (None, _) => Underlay::Bridge,
    }
}

/// The headless Service that gives every agent pod a DNS name
/// (`<node>.<service>.<namespace>.svc`). Service names must start with a letter.
pub fn service_name(topology: &str) -> String {
    bounded(&format!("nm-{}", name_of(topology)), 63)
}

/// The Secret holding the credentials of a pod's nodes.
pub fn credentials_secret(pod: &str) -> String {
    bounded(&format!("{pod}-credentials"), 253)
}

/// One of a packed topology's ConfigMaps of node names.
pub fn hosts_config_map(topology: &str, part: usize) -> String {
    bounded(&format!("nm-{}-hosts-{part}", name_of(topology)), 253)
}

/// The Service that exposes a node's link listener to other clusters
/// (NodePort or LoadBalancer exposure).
pub fn link_service_name(topology: &str, node: &str) -> String {
    bounded(&format!("{}-{node}-link", name_of(topology)), 63)
}

/// The agent pod of a node.
pub fn pod_name(topology: &str, node: &str) -> String {
    bounded(&format!("{}-{node}", name_of(topology)), 63)
}

/// A worker pod's host name, the first label of its DNS name
/// (`<host>.<service>.<namespace>.svc`).
pub fn worker_hostname(worker: u32) -> String {
    format!("worker-{worker}")
}

/// A packed topology's worker pod.
pub fn worker_pod_name(topology: &str, worker: u32) -> String {
    bounded(&format!("{}-worker-{worker}", name_of(topology)), 63)
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
        assert_eq!(pod_name("team-a/line3", "a"), "line3-a");
        assert_eq!(worker_pod_name("team-a/line3", 2), "line3-worker-2");
        assert_eq!(service_name("team-a/line3"), "nm-line3");
        assert_eq!(hosts_config_map("team-a/line3", 0), "nm-line3-hosts-0");
        let long = "x".repeat(63);
        let a = pod_name(&long, "a");
        let b = pod_name(&long, "b");
        assert!(a.len() <= 63 && b.len() <= 63);
        assert_ne!(a, b);
        assert_eq!(a, pod_name(&long, "a"), "stable");
        assert!(service_name(&long).len() <= 63);
    }

    fn plan(yaml: &str) -> Plan {
        let manifest = crate::plan::parse_manifest("t.yaml", yaml).expect("parses");
        crate::plan::plan_manifest(&manifest)
            .expect("plans")
            .remove(0)
    }

    const LINE4: &str = "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: line4}\nspec:\n  generator: {line: {nodes: 4}}\n";

    #[test]
    fn runtime_round_trips_and_selects_the_underlay() {
        let r = runtime_name("lab");
        assert_eq!(namespace_of(&r), Some("lab"));
        assert_eq!(namespace_of("netns"), None);
        let line4 = plan(LINE4);
        assert_eq!(underlay_of(&line4, "netns"), Underlay::Bridge);
        assert_eq!(
            underlay_of(&line4, &r),
            Underlay::PodDns {
                service: "nm-line4".into(),
                namespace: "lab".into()
            }
        );
        let packed = plan(&LINE4.replace("spec:\n", "spec:\n  placement: packed\n  workers: 2\n"));
        assert_eq!(
            underlay_of(&packed, &r),
            Underlay::Packed {
                service: "nm-line4".into(),
                namespace: "lab".into(),
                packing: crate::plan::Packing::Workers(2),
            }
        );
        assert_eq!(
            underlay_of(&packed, "netns"),
            Underlay::Bridge,
            "locally: namespaces"
        );
    }

    /// Packed: every node listens on ports of its own in its worker pod (links,
    /// and the relay one above), and its peers are told that worker's DNS name
    /// with its link port.
    #[test]
    fn packed_snapshots_name_each_peers_worker_and_ports() {
        // n0..n3 in a line on two workers, dealt in turn: n0, n2 on worker 0.
        let p = plan(&LINE4.replace("spec:\n", "spec:\n  placement: packed\n  workers: 2\n"));
        let mut view = crate::hub::TopologyView::new(p.clone(), 1);
        view.underlay = underlay_of(&p, &runtime_name("lab"));
        let s = view.snapshot("n2").expect("n2's snapshot");
        let node = s.node.expect("node");
        // n2 is slot 1 of worker 0: ports 7102 and 7103.
        assert_eq!(node.listen_addr, "0.0.0.0:7102");
        assert_eq!(node.max_port, 7103);
        let link = |name: &str| {
            s.links
                .iter()
                .find(|l| l.name == name)
                .unwrap_or_else(|| panic!("no link {name}"))
        };
        // n1 is slot 0 of worker 1, n3 slot 1 of worker 1.
        assert_eq!(link("n1-n2").peer_addr, "worker-1.nm-line4.lab.svc:7100");
        assert_eq!(link("n2-n3").peer_addr, "worker-1.nm-line4.lab.svc:7102");
        // Pod per node: one port for all, relays found from peer_addr.
        let mut pods = crate::hub::TopologyView::new(plan(LINE4), 1);
        pods.underlay = underlay_of(&pods.plan, &runtime_name("lab"));
        let s = pods.snapshot("n2").expect("snapshot");
        assert_eq!(s.node.expect("node").max_port, 7101);
        assert!(
            s.links
                .iter()
                .any(|l| l.peer_addr == "n1.nm-line4.lab.svc:7100")
        );
    }

    #[test]
    fn worker_names_fit_and_stay_distinct() {
        assert_eq!(worker_pod_name("line3", 0), "line3-worker-0");
        let long = "y".repeat(63);
        assert!(worker_pod_name(&long, 12).len() <= 63);
        assert_ne!(worker_pod_name(&long, 1), worker_pod_name(&long, 2));
    }
}
