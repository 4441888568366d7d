//! The Link and Flow objects of a topology: each is owned by its Topology (so
//! deleting the Topology removes them), and each gets a status — links whether
//! both agents report them up, flows their progress and completion times.

use super::{Context, Error, MANAGER};
use crate::api::{Flow, Link, LinkStatus, Topology};
use crate::plan::{Doc, Manifest};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use std::collections::HashMap;

/// Adds the Topology as an owner of its Links and Flows that lack it. It is
/// not their controller: users own and edit them.
pub async fn adopt(ctx: &Context, topology: &Topology, manifest: &Manifest) -> Result<(), Error> {
    let Some(mut owner) = topology.controller_owner_ref(&()) else {
        return Ok(());
    };
    owner.controller = None;
    owner.block_owner_deletion = None;
    adopt_each(ctx, &manifest.links, &owner).await?;
    adopt_each(ctx, &manifest.flows, &owner).await
}

async fn adopt_each<K>(ctx: &Context, docs: &[Doc<K>], owner: &OwnerReference) -> Result<(), Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    for doc in docs {
        let object = &doc.object;
        if object
            .meta()
            .owner_references
            .iter()
            .flatten()
            .any(|r| r.uid == owner.uid)
        {
            continue;
        }
        let api = Api::<K>::namespaced(ctx.client.clone(), &object.namespace().unwrap_or_default());
        let patch = json!({"apiVersion": K::api_version(&()), "kind": K::kind(&()),
                           "metadata": {"name": object.name_any(), "ownerReferences": [owner]}});
        api.patch(
            &object.name_any(),
            &PatchParams::apply(MANAGER),
            &Patch::Apply(&patch),
        )
        .await?;
    }
    Ok(())
}

/// `status.up` of each Link object, written only when it changed.
pub async fn link_statuses(
    ctx: &Context,
    manifest: &Manifest,
    row: Option<&crate::store::TopologyStatusRow>,
) -> Result<(), Error> {
    let Some(row) = row.filter(|_| !manifest.links.is_empty()) else {
        return Ok(());
    };
    let up: HashMap<&str, bool> = row
        .links
        .iter()
        .map(|l| (l.name.as_str(), l.connected))
        .collect();
    for doc in &manifest.links {
        let link = &doc.object;
        let now_up = up.get(link.name_any().as_str()).copied().unwrap_or(false);
        if link.status.as_ref().is_some_and(|s| {
            s.up == now_up
                    && s.observed_generation == link.metadata.generation
                    // An orphan's TopologyNotFound (orphans.rs) is replaced.
                    && s.conditions.is_empty()
        }) {
            continue;
        }
        let status = LinkStatus {
            observed_generation: link.metadata.generation,
            up: now_up,
            conditions: vec![],
        };
        let api =
            Api::<Link>::namespaced(ctx.client.clone(), &link.namespace().unwrap_or_default());
        let patch =
            json!({"apiVersion": crate::api::API_VERSION, "kind": "Link", "status": status});
        api.patch_status(
            &link.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    }
    Ok(())
}

/// Each Flow's progress from its stored results, written only when it changed.
pub async fn flow_statuses(
    ctx: &Context,
    manifest: &Manifest,
    topology: &str,
) -> Result<(), Error> {
    if manifest.flows.is_empty() {
        return Ok(());
    }
    let defined: HashMap<String, u32> = ctx
        .store
        .flows(Some(topology))
        .await?
        .into_iter()
        .map(|f| (f.name, f.count))
        .collect();
    let results = ctx.store.flow_results(Some(topology), None).await?;
    for doc in &manifest.flows {
        let flow = &doc.object;
        let name = flow.name_any();
        let Some(count) = defined.get(&name) else {
            continue;
        };
        let rows: Vec<_> = results.iter().filter(|r| r.flow == name).collect();
        let mut status = crate::store::flow_status(*count, &rows);
        status.observed_generation = flow.metadata.generation;
        if flow.status.as_ref() == Some(&status) {
            continue;
        }
        let api =
            Api::<Flow>::namespaced(ctx.client.clone(), &flow.namespace().unwrap_or_default());
        let patch =
            json!({"apiVersion": crate::api::API_VERSION, "kind": "Flow", "status": status});
        api.patch_status(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    }
    Ok(())
}
