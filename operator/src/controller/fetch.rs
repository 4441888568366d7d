//! Phase 1: the Topology with the Link and Flow objects of its namespace that
//! name it, as the planner's `Manifest`.

use crate::api::{Flow, Link, Topology};
use crate::plan::{Doc, Manifest};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

pub async fn manifest(client: &Client, topology: &Topology) -> Result<Manifest, kube::Error> {
    let namespace = topology.namespace().unwrap_or_default();
    let name = topology.name_any();
    let mut links: Vec<Link> = Api::<Link>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|l| l.spec.topology == name && l.metadata.deletion_timestamp.is_none())
        .collect();
    let mut flows: Vec<Flow> = Api::<Flow>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|f| f.spec.topology == name && f.metadata.deletion_timestamp.is_none())
        .collect();
    links.sort_by_key(|l| l.name_any());
    flows.sort_by_key(|f| f.name_any());
    Ok(assemble(topology, links, flows))
}

/// The manifest the planner reads, with origins that name each object the way
/// `kubectl` does (`link/a-b`), so errors point at what to edit.
pub fn assemble(topology: &Topology, links: Vec<Link>, flows: Vec<Flow>) -> Manifest {
    Manifest {
        topologies: vec![Doc {
            origin: format!("topology/{}", topology.name_any()),
            object: topology.clone(),
        }],
        links: links
            .into_iter()
            .map(|l| Doc {
                origin: format!("link/{}", l.name_any()),
                object: l,
            })
            .collect(),
        flows: flows
            .into_iter()
            .map(|f| Doc {
                origin: format!("flow/{}", f.name_any()),
                object: f,
            })
            .collect(),
    }
}
