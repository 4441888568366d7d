//! Phase 1: the Topology with the Link and Flow objects of its namespace that
//! name it, as the planner's `Manifest`.
//!
//! Links and Flows are listed as untyped objects and decoded one at a time. A
//! typed list fails as a whole when one object in it does not decode (one the
//! CRD schema admitted but a parser refuses), which would hide every member of
//! every topology in the namespace; decoded singly, the bad one is reported,
//! naming its field, as the topology's `Planned=False` reason.

use crate::api::{Flow, Link, MemberCluster, Topology};
use crate::plan::{Doc, Manifest};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// The members that decoded, and what is wrong with those that did not.
pub struct Fetched {
    pub manifest: Manifest,
    /// `link/a-b: spec.rate: invalid rate "900Tbit": ...`, one per object.
    pub undecodable: Vec<String>,
}

pub async fn manifest(client: &Client, topology: &Topology) -> Result<Fetched, kube::Error> {
    let namespace = topology.namespace().unwrap_or_default();
    let name = topology.name_any();
    let (links, mut undecodable) = members::<Link>(client, &namespace, &name, "link").await?;
    let (flows, bad_flows) = members::<Flow>(client, &namespace, &name, "flow").await?;
    undecodable.extend(bad_flows);
    let mut manifest = assemble(topology, links, flows);
    // Only the ConfigMaps traces name; a missing one is the planner's to report.
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), &namespace);
    for name in crate::plan::trace_sources::referenced(&mut manifest) {
        if let Some(object) = config_maps.get_opt(&name).await? {
            manifest.config_maps.push(Doc {
                origin: format!("configmap/{name}"),
                object,
            });
        }
    }
    // Cluster-scoped and few: every topology may place nodes in any of them.
    let (clusters, bad_clusters) = cluster_scoped::<MemberCluster>(client, "membercluster").await?;
    // Only a topology that places nodes depends on them (see `plan::sites`).
    if crate::plan::uses_sites(&topology.spec) {
        undecodable.extend(bad_clusters);
    }
    manifest.member_clusters = clusters
        .into_iter()
        .map(|object| Doc {
            origin: format!("membercluster/{}", object.name_any()),
            object,
        })
        .collect();
    Ok(Fetched {
        manifest,
        undecodable,
    })
}

/// The objects of kind `K` in `namespace` whose `spec.topology` is `topology`,
/// sorted by name, and a message for each that does not decode.
async fn members<K>(
    client: &Client,
    namespace: &str,
    topology: &str,
    kind: &str,
) -> Result<(Vec<K>, Vec<String>), kube::Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let resource = ApiResource::erase::<K>(&());
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource);
    let mut items = api.list(&ListParams::default()).await?.items;
    items.retain(|o| {
        o.metadata.deletion_timestamp.is_none() && topology_of(o).as_deref() == Some(topology)
    });
    items.sort_by_key(|o| o.name_any());
    Ok(decode_all(items, kind))
}

/// Every object of the cluster-scoped kind `K`, sorted by name, and a message
/// for each that does not decode.
async fn cluster_scoped<K>(
    client: &Client,
    kind: &str,
) -> Result<(Vec<K>, Vec<String>), kube::Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let resource = ApiResource::erase::<K>(&());
    let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
    let mut items = api.list(&ListParams::default()).await?.items;
    items.retain(|o| o.metadata.deletion_timestamp.is_none());
    items.sort_by_key(|o| o.name_any());
    Ok(decode_all(items, kind))
}

fn decode_all<K: DeserializeOwned>(items: Vec<DynamicObject>, kind: &str) -> (Vec<K>, Vec<String>) {
    let (mut decoded, mut undecodable) = (Vec::new(), Vec::new());
    for object in items {
        let name = object.name_any();
        match decode::<K>(object) {
            Ok(k) => decoded.push(k),
            Err(e) => undecodable.push(format!("{kind}/{name}: {e}")),
        }
    }
    (decoded, undecodable)
}

/// `spec.topology` of an untyped Link or Flow, for the watch that maps it to
/// its Topology.
pub fn topology_of(object: &DynamicObject) -> Option<String> {
    object
        .data
        .get("spec")?
        .get("topology")?
        .as_str()
        .map(str::to_owned)
}

/// Decodes one object, with the path of the field that failed: `spec.rate:
/// invalid rate "900Tbit": ...`.
pub fn decode<K: DeserializeOwned>(object: DynamicObject) -> Result<K, String> {
    let value = serde_json::to_value(object).map_err(|e| e.to_string())?;
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            e.inner().to_string()
        } else {
            format!("{path}: {}", e.inner())
        }
    })
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
        config_maps: Vec::new(),
        member_clusters: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(yaml: &str) -> DynamicObject {
        serde_norway::from_str(yaml).expect("fixture parses as an object")
    }

    #[test]
    fn a_member_that_does_not_decode_is_named_with_its_field() {
        let bad = object(
            "apiVersion: nextmini.io/v1alpha1\nkind: Link\nmetadata: {name: a-b, namespace: lab}\nspec: {topology: t, endpoints: [a, b], rate: 10MBps}\n",
        );
        assert_eq!(topology_of(&bad).as_deref(), Some("t"));
        let message = decode::<Link>(bad).err().unwrap_or_default();
        assert!(
            message.starts_with("spec.rate: invalid rate \"10MBps\""),
            "{message}"
        );
        let good = object(
            "apiVersion: nextmini.io/v1alpha1\nkind: Link\nmetadata: {name: a-b, namespace: lab}\nspec: {topology: t, endpoints: [a, b], rate: 10Mbit}\n",
        );
        let link = decode::<Link>(good).map_err(|e| e.to_string());
        assert_eq!(
            link.map(|l| l.spec.rate.map(|r| r.bps())),
            Ok(Some(10_000_000))
        );
    }
}
