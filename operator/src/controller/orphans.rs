//! Links and Flows whose `spec.topology` names no Topology of their namespace.
//!
//! The Topology controller writes its members' status, so without this a Link
//! naming a missing (or misspelt) Topology would never get one, and `kubectl get
//! links` would show nothing wrong. This controller gives such an object an
//! `Accepted=False` condition with reason `TopologyNotFound`. Once the Topology
//! exists, its reconcile writes the member's status again, which replaces the
//! condition (same field manager, server-side apply).

use super::{MANAGER, fetch};
use crate::api::{API_VERSION, Condition, ConditionStatus, Topology};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// Type of the condition this controller owns.
pub const ACCEPTED: &str = "Accepted";
pub const TOPOLOGY_NOT_FOUND: &str = "TopologyNotFound";

/// How often an orphan is looked at again: the Topology's own reconcile takes
/// over as soon as it exists, so this only refreshes a stale condition.
const RECHECK: Duration = Duration::from_secs(60);

struct Ctx {
    client: Client,
    resource: ApiResource,
}

/// Watches one kind (Link or Flow) until SIGTERM/SIGINT.
pub async fn run(client: Client, resource: ApiResource, namespace: Option<String>) {
    let api = match &namespace {
        Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource),
        None => Api::<DynamicObject>::all_with(client.clone(), &resource),
    };
    let kind = resource.kind.clone();
    let ctx = Arc::new(Ctx {
        client,
        resource: resource.clone(),
    });
    Controller::new_with(api, watcher::Config::default(), resource)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            let kind = kind.clone();
            async move {
                if let Err(e) = result {
                    tracing::debug!(%kind, error = %e, "orphan check failed");
                }
            }
        })
        .await;
}

async fn reconcile(member: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
    let (Some(namespace), Some(topology)) = (member.namespace(), fetch::topology_of(&member))
    else {
        return Ok(Action::await_change());
    };
    let topologies = Api::<Topology>::namespaced(ctx.client.clone(), &namespace);
    if topologies.get_opt(&topology).await?.is_some() {
        return Ok(Action::await_change());
    }
    let wanted = orphan_condition(
        &ctx.resource.kind,
        &topology,
        &namespace,
        member.metadata.generation,
    );
    if !has_condition(&member, &wanted) {
        let api =
            Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &namespace, &ctx.resource);
        let patch = json!({
            "apiVersion": API_VERSION,
            "kind": ctx.resource.kind,
            "status": {"observedGeneration": member.metadata.generation, "conditions": [wanted]},
        });
        api.patch_status(
            &member.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
        tracing::info!(kind = %ctx.resource.kind, name = %member.name_any(), %namespace, %topology, "names a Topology that does not exist");
    }
    Ok(Action::requeue(RECHECK))
}

fn error_policy(_: Arc<DynamicObject>, _: &kube::Error, _: Arc<Ctx>) -> Action {
    Action::requeue(Duration::from_secs(10))
}

/// The condition of a member whose Topology is missing.
pub fn orphan_condition(
    kind: &str,
    topology: &str,
    namespace: &str,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: ACCEPTED.into(),
        status: ConditionStatus::False,
        reason: TOPOLOGY_NOT_FOUND.into(),
        message: format!(
            "spec.topology: no Topology named {topology:?} in namespace {namespace:?}; this {kind} is not part of any running topology"
        ),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        observed_generation: generation,
    }
}

/// Whether the member already carries `wanted` (compared without its time), so
/// that an unchanged orphan is not written again at every recheck.
fn has_condition(member: &DynamicObject, wanted: &Condition) -> bool {
    member
        .data
        .get("status")
        .and_then(|s| s.get("conditions"))
        .and_then(|c| serde_json::from_value::<Vec<Condition>>(c.clone()).ok())
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.type_ == wanted.type_
                    && c.status == wanted.status
                    && c.reason == wanted.reason
                    && c.message == wanted.message
                    && c.observed_generation == wanted.observed_generation
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_orphan_is_written_once_per_generation() {
        let wanted = orphan_condition("Link", "nope", "lab", Some(1));
        assert!(
            wanted
                .message
                .starts_with("spec.topology: no Topology named \"nope\"")
        );
        let mut member: DynamicObject = serde_json::from_value(json!({
            "apiVersion": API_VERSION, "kind": "Link",
            "metadata": {"name": "a-b", "namespace": "lab", "generation": 1},
            "spec": {"topology": "nope", "endpoints": ["a", "b"]},
        }))
        .expect("an object");
        assert!(!has_condition(&member, &wanted));
        member.data["status"] =
            json!({"conditions": [orphan_condition("Link", "nope", "lab", Some(1))]});
        assert!(has_condition(&member, &wanted));
        let next = orphan_condition("Link", "nope", "lab", Some(2));
        assert!(!has_condition(&member, &next));
    }
}
