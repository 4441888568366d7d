//! Packed placement, pure: which nodes each worker pod hosts and what the
//! operator tells a worker about them. The hub finds the same seats from the
//! same plan (`Packing::seat`), so the two never need to talk.

use crate::plan::{Packing, Plan, PlannedNode};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// One node as its worker runs it: the worker makes the node's namespace and
/// cgroup and starts its agent; everything else comes to the agent in its
/// snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkerNode {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// The node's SOCKS5 servers, which its agent binds in the pod's namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub socks: Vec<SocketAddr>,
}

impl WorkerNode {
    pub fn of(node: &PlannedNode) -> WorkerNode {
        WorkerNode {
            name: node.name.clone(),
            cpu_millis: node.resources.cpu_millis,
            memory_bytes: node.resources.memory_bytes,
            socks: node.socks.iter().map(|s| s.listen).collect(),
        }
    }

    pub fn resources(&self) -> crate::plan::Resources {
        crate::plan::Resources {
            cpu_millis: self.cpu_millis,
            memory_bytes: self.memory_bytes,
        }
    }
}

/// The nodes of each worker that hosts any, by worker number, in slot order.
pub fn workers(plan: &Plan, packing: Packing) -> BTreeMap<u32, Vec<&PlannedNode>> {
    let mut out: BTreeMap<u32, Vec<(u32, &PlannedNode)>> = BTreeMap::new();
    for node in plan.nodes.iter() {
        let seat = packing.seat(node.index);
        out.entry(seat.worker).or_default().push((seat.slot, node));
    }
    out.into_iter()
        .map(|(w, mut nodes)| {
            nodes.sort_by_key(|(slot, _)| *slot);
            (w, nodes.into_iter().map(|(_, n)| n).collect())
        })
        .collect()
}

/// The `--nodes` argument of a worker: its nodes as JSON.
pub fn nodes_arg(nodes: &[&PlannedNode]) -> String {
    let list: Vec<WorkerNode> = nodes.iter().map(|n| WorkerNode::of(n)).collect();
    serde_json::to_string(&list).unwrap_or_else(|_| "[]".into())
}

/// Reads a worker's `--nodes`, naming what is wrong.
pub fn parse_nodes(json: &str) -> Result<Vec<WorkerNode>, String> {
    let nodes: Vec<WorkerNode> =
        serde_json::from_str(json).map_err(|e| format!("--nodes: not a list of nodes: {e}"))?;
    let mut seen = std::collections::HashSet::new();
    for (i, n) in nodes.iter().enumerate() {
        if let Some(problem) = crate::plan::dns_label_problem(&n.name) {
            return Err(format!("--nodes[{i}].name: {problem}"));
        }
        if !seen.insert(n.name.as_str()) {
            return Err(format!("--nodes[{i}].name: {:?} is listed twice", n.name));
        }
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(spec: &str) -> Plan {
        let yaml = format!(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: p}}\nspec:\n{spec}"
        );
        let manifest = crate::plan::parse_manifest("p.yaml", &yaml).expect("parses");
        crate::plan::plan_manifest(&manifest)
            .expect("plans")
            .remove(0)
    }

    fn names(w: &[&PlannedNode]) -> Vec<String> {
        w.iter().map(|n| n.name.clone()).collect()
    }

    #[test]
    fn nodes_per_worker_fills_workers_in_order_and_workers_deals_in_turn() {
        let p =
            plan("  placement: packed\n  nodesPerWorker: 4\n  generator: {line: {nodes: 10}}\n");
        let w = workers(&p, p.packing().expect("packed"));
        assert_eq!(w.len(), 3);
        assert_eq!(names(&w[&0]), ["n0", "n1", "n2", "n3"]);
        assert_eq!(names(&w[&2]), ["n8", "n9"]);
        let p = plan("  placement: packed\n  workers: 3\n  generator: {line: {nodes: 7}}\n");
        let w = workers(&p, p.packing().expect("packed"));
        assert_eq!(names(&w[&0]), ["n0", "n3", "n6"]);
        assert_eq!(names(&w[&1]), ["n1", "n4"]);
        assert_eq!(names(&w[&2]), ["n2", "n5"]);
        for (worker, nodes) in &w {
            for (slot, n) in nodes.iter().enumerate() {
                let seat = Packing::Workers(3).seat(n.index);
                assert_eq!((seat.worker, seat.slot), (*worker, slot as u32));
            }
        }
    }

    #[test]
    fn the_nodes_argument_round_trips_and_bad_ones_are_named() {
        let p = plan(
            "  placement: packed\n  nodes:\n  - name: a\n    resources: {cpu: 250m, memory: 32Mi}\n    socks: [{listen: '0.0.0.0:1080'}]\n  - name: b\n",
        );
        let all: Vec<&PlannedNode> = p.nodes.iter().collect();
        let arg = nodes_arg(&all);
        let back = parse_nodes(&arg).expect("parses");
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].cpu_millis, Some(250));
        assert_eq!(back[0].memory_bytes, Some(32 << 20));
        assert_eq!(back[0].socks, ["0.0.0.0:1080".parse().expect("addr")]);
        assert_eq!(back[1], WorkerNode::of(&p.nodes[1]));
        assert!(
            !arg.contains("cpuMillis\":null"),
            "unset fields are left out"
        );
        let e = parse_nodes(r#"[{"name":"a"},{"name":"a"}]"#).expect_err("twice");
        assert!(e.starts_with("--nodes[1].name"), "{e}");
        let e = parse_nodes(r#"[{"name":"../x"}]"#).expect_err("not a label");
        assert!(e.starts_with("--nodes[0].name"), "{e}");
        assert!(parse_nodes(r#"[{"name":"a","gpu":1}]"#).is_err());
    }
}
