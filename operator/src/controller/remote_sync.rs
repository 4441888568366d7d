//! Phase 4 in member clusters: the agent pods of nodes placed in a member
//! cluster, with their credential Secrets and the headless Service, made
//! through that cluster's API server; what runs there, per cluster, for the
//! status; and their removal.
//!
//! A member that does not answer costs only its own nodes: its pods are left
//! as they were (agents there stay connected to the hub if they can), the
//! topology is Degraded naming it, and the next reconcile after it answers
//! brings it up to date. The topology's status remembers which members hold
//! its objects, so nodes moved away and a deleted topology are cleaned up
//! there too; a member that does not answer at deletion keeps the Topology
//! until it does or its MemberCluster is deleted.

use super::apply::{self, Restart, Target};
use super::remote::{self, Unreachable};
use super::validate::Validated;
use super::{Context, Error, build, exposure};
use crate::api::{ClusterPlacementStatus, MemberCluster, Topology};
use crate::plan::Manifest;
use crate::runtime::pods;
use crate::store::TopologyStatusRow;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::api::{ListParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use std::collections::BTreeMap;
use std::time::Duration;

/// One member's whole sync gives up after this, so a member that accepts
/// connections but hangs delays the rest by this much at most.
const MEMBER_SYNC_TIMEOUT: Duration = Duration::from_secs(20);

/// What the reconcile hands over for the member clusters.
pub(super) struct RemoteWork<'a> {
    /// The agent pods built for member clusters (each labelled with its own).
    pub pods: Vec<Pod>,
    /// Per cluster, its nodes dialed from elsewhere and how it exposes them.
    pub exposing: &'a BTreeMap<exposure::Site, exposure::ClusterNodes<'a>>,
    /// Every node's credential Secret as kept in the operator's cluster.
    pub secrets: Vec<Secret>,
    pub restart: &'a Restart,
    pub row: Option<&'a TopologyStatusRow>,
    pub generation: i64,
    /// The topology's pods in the operator's own cluster, and how many run.
    pub home_pods: (u32, u32),
}

/// What the member clusters hold, for the status.
#[derive(Debug, Default)]
pub(super) struct Elsewhere {
    /// Per cluster, the operator's own first; empty when no node runs, or
    /// has run, in a member cluster.
    pub clusters: Vec<ClusterPlacementStatus>,
    /// Pods in member clusters that cannot run, named with their cluster.
    pub pod_problems: Vec<String>,
    /// The link endpoints found in the members that answered, by node.
    pub endpoints: BTreeMap<String, Option<String>>,
    /// The nodes of members that did not answer (their endpoints stand).
    pub unanswered: Vec<String>,
}

/// Makes every member cluster that runs nodes (or held some) hold exactly
/// its share of the topology.
pub(super) async fn sync(
    topology: &Topology,
    ctx: &Context,
    validated: &Validated,
    manifest: &Manifest,
    work: RemoteWork<'_>,
) -> Elsewhere {
    let key = &validated.plan.topology;
    let held = held_before(topology);
    if validated.remote.is_empty() && held.is_empty() {
        return Elsewhere::default();
    }
    let ready = |node: &str| {
        work.row.is_some_and(|r| {
            r.nodes.iter().any(|n| {
                n.name == node
                    && n.agent_state == "connected"
                    && n.acked_generation >= work.generation
            })
        })
    };
    let home_nodes: Vec<&str> = validated
        .plan
        .nodes
        .iter()
        .filter(|n| validated.remote_of(n).is_none())
        .map(|n| n.name.as_str())
        .collect();
    let mut out = Elsewhere::default();
    out.clusters.push(ClusterPlacementStatus {
        // The MemberCluster standing for the operator's own cluster, when
        // nodes name it.
        cluster: validated
            .plan
            .nodes
            .iter()
            .filter(|n| validated.remote_of(n).is_none())
            .find_map(|n| n.cluster.clone()),
        namespace: topology.namespace().unwrap_or_default(),
        nodes: home_nodes.len() as u32,
        nodes_ready: home_nodes.iter().filter(|n| ready(n)).count() as u32,
        pods: work.home_pods.0,
        pods_running: work.home_pods.1,
        reachable: true,
        message: None,
    });
    let mut visit: BTreeMap<String, (MemberCluster, String)> = validated
        .remote
        .iter()
        .map(|(name, r)| (name.clone(), (r.member.clone(), r.namespace.clone())))
        .collect();
    for (name, namespace) in held {
        if visit.contains_key(&name) {
            continue;
        }
        // A member that no longer exists cannot be reached: what it held
        // is the user's to remove.
        if let Some(doc) = manifest.member_clusters.iter().find(|d| {
            d.object.metadata.name.as_deref() == Some(name.as_str())
                // The operator's own cluster, named, is not a member to visit.
                && d.object.spec.kubeconfig_secret_ref.is_some()
        }) {
            visit.insert(name, (doc.object.clone(), namespace));
        }
    }
    for (name, (member, namespace)) in visit {
        let nodes: Vec<&str> = validated
            .plan
            .nodes
            .iter()
            .filter(|n| validated.remote.contains_key(&name) && n.cluster.as_deref() == Some(&name))
            .map(|n| n.name.as_str())
            .collect();
        let pods: Vec<Pod> = work
            .pods
            .iter()
            .filter(|p| p.labels().get(remote::CLUSTER_LABEL) == Some(&name))
            .cloned()
            .collect();
        // A restart stored while this member did not answer is still owed
        // to it: its pods would otherwise run the old generation's agents.
        let slot = (key.clone(), name.clone());
        let restart = ctx
            .owed_restarts
            .take(&slot)
            .unwrap_or_default()
            .and(work.restart.clone());
        let (pods, restart, work) = (&pods, &restart, &work);
        let exposing = work.exposing.get(&Some(name.clone()));
        let synced = in_member(
            ctx,
            &member,
            &name,
            namespace.clone(),
            |target| async move {
                sync_one(ctx, topology, &target, key, pods, restart, work, exposing).await
            },
        )
        .await;
        let mut entry = ClusterPlacementStatus {
            cluster: Some(name.clone()),
            namespace,
            nodes: nodes.len() as u32,
            nodes_ready: nodes.iter().filter(|n| ready(n)).count() as u32,
            ..ClusterPlacementStatus::default()
        };
        match synced {
            Ok(seen) => {
                entry.reachable = true;
                entry.pods = seen.pods;
                entry.pods_running = seen.running;
                out.endpoints.extend(seen.endpoints);
                out.pod_problems
                    .extend(seen.problems.into_iter().map(|p| format!("{name}: {p}")));
                if nodes.is_empty() && seen.pods == 0 {
                    // Cleaned up: no longer the topology's.
                    continue;
                }
            }
            Err(Failed::Refused(message)) => {
                ctx.owed_restarts.owe(slot, restart.clone());
                out.unanswered.extend(nodes.iter().map(|n| n.to_string()));
                // It answered: a problem of the objects, not of the cluster.
                tracing::warn!(topology = %key, cluster = %name, %message, "member cluster refused an object");
                entry.reachable = true;
                out.pod_problems.push(format!("{name}: {message}"));
            }
            Err(Failed::Unreachable(message)) => {
                tracing::warn!(topology = %key, cluster = %name, %message, "member cluster unreachable");
                ctx.owed_restarts.owe(slot, restart.clone());
                out.unanswered.extend(nodes.iter().map(|n| n.to_string()));
                entry.message = Some(message);
            }
        }
        out.clusters.push(entry);
    }
    if out.clusters.len() == 1 {
        out.clusters.clear();
    }
    out
}

/// Restarts a member missed while it did not answer, made up at its next
/// sync. Kept in memory: an operator restart during the outage forgets them
/// (a pod whose spec changed is replaced by the sync in any case).
pub(super) type OwedRestarts = remote::PerMember<Restart>;

impl OwedRestarts {
    fn owe(&self, slot: (String, String), restart: Restart) {
        if restart == Restart::Nothing {
            return;
        }
        self.update(slot, |before| (before.unwrap_or_default().and(restart), ()));
    }
}

/// The clusters the topology's status says hold its objects, with the
/// namespace there (the operator's own among them when nodes name its
/// MemberCluster; callers skip it).
fn held_before(topology: &Topology) -> Vec<(String, String)> {
    topology
        .status
        .iter()
        .flat_map(|s| &s.clusters)
        .filter_map(|c| Some((c.cluster.clone()?, c.namespace.clone())))
        .collect()
}

/// Why a member's sync stopped: its API server did not answer (or its
/// kubeconfig is unusable), or it answered with a refusal.
enum Failed {
    Unreachable(String),
    Refused(String),
}

impl Failed {
    fn of(error: Error, server: &str) -> Failed {
        match error {
            Error::Kube(kube::Error::Api(status)) => {
                Failed::Refused(format!("{} ({})", status.message, status.reason))
            }
            Error::Kube(e) => Failed::Unreachable(format!(
                "API server {server}: {}",
                nextmini_proto::error_chain::error_chain(&e)
            )),
            other => Failed::Unreachable(other.to_string()),
        }
    }
}

impl Failed {
    fn message(&self) -> &str {
        match self {
            Failed::Unreachable(m) | Failed::Refused(m) => m,
        }
    }
}

/// Runs `work` against `member`'s API server, in `namespace` there, within
/// [`MEMBER_SYNC_TIMEOUT`]; what failed, in the member's words.
async fn in_member<T, Work, Done>(
    ctx: &Context,
    member: &MemberCluster,
    name: &str,
    namespace: String,
    work: Work,
) -> Result<T, Failed>
where
    Work: FnOnce(Target) -> Done,
    Done: std::future::Future<Output = Result<T, Error>>,
{
    let bounded = tokio::time::timeout(MEMBER_SYNC_TIMEOUT, async {
        let remote = ctx.remotes.of(&ctx.client, member).await.map_err(
            |Unreachable { reason, message }| Failed::Unreachable(format!("{reason}: {message}")),
        )?;
        let target = Target {
            client: remote.client,
            namespace,
            cluster: Some(name.to_owned()),
        };
        work(target)
            .await
            .map_err(|e| Failed::of(e, &remote.server))
    });
    bounded.await.unwrap_or_else(|_| {
        Err(Failed::Unreachable(format!(
            "no answer within {MEMBER_SYNC_TIMEOUT:?}"
        )))
    })
}

#[derive(Default)]
struct Seen {
    pods: u32,
    running: u32,
    problems: Vec<String>,
    endpoints: BTreeMap<String, Option<String>>,
}

#[allow(clippy::too_many_arguments)]
async fn sync_one(
    ctx: &Context,
    topology: &Topology,
    target: &Target,
    key: &str,
    pods: &[Pod],
    restart: &Restart,
    work: &RemoteWork<'_>,
    exposing: Option<&exposure::ClusterNodes<'_>>,
) -> Result<Seen, Error> {
    if pods.is_empty() {
        apply::clear(target, key).await?;
        release_namespace(target).await?;
        return Ok(Seen::default());
    }
    let cluster = target.cluster.as_deref().unwrap_or_default();
    let uid = topology.metadata.uid.as_deref();
    ensure_namespace(target).await?;
    restart.run(target, key).await?;
    let mut service = build::service(topology, key);
    remote::move_into(&mut service.metadata, cluster, &target.namespace, uid);
    apply::apply_object(&target.client, &target.namespace, &service).await?;
    let wanted: Vec<String> = pods
        .iter()
        .map(|p| pods::credentials_secret(&p.name_any()))
        .collect();
    let secrets: Vec<Secret> = work
        .secrets
        .iter()
        .filter(|s| wanted.contains(&s.name_any()))
        .cloned()
        .map(|mut s| {
            remote::move_into(&mut s.metadata, cluster, &target.namespace, uid);
            s
        })
        .collect();
    apply::sync_parts(target, key, secrets, |s: &Secret| &s.metadata).await?;
    let created = apply::sync_pods(target, key, pods).await?;
    if created > 0 {
        tracing::info!(topology = %key, %cluster, created, "created agent pods in a member cluster");
    }
    let live = Api::<Pod>::namespaced(target.client.clone(), &target.namespace)
        .list(&ListParams::default().labels(&target.selector(key)))
        .await?;
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut seen = Seen {
        pods: live.items.len() as u32,
        ..Seen::default()
    };
    if let Some(nodes) = exposing {
        seen.endpoints = exposure::endpoints(target, key, topology, nodes).await?;
    }
    for pod in &live.items {
        if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            seen.running += 1;
        }
        seen.problems
            .extend(super::health::of_pod(pod, now).blocking);
    }
    let live_pods: BTreeMap<String, String> = live
        .items
        .iter()
        .filter_map(|p| Some((p.name_any(), p.metadata.uid.clone()?)))
        .collect();
    super::member_events::mirror(ctx, topology, key, target, &live_pods).await;
    Ok(seen)
}

/// The namespace the member's pods go into, made when missing (marked as
/// the operator's, so [`release_namespace`] deletes it once it is empty).
async fn ensure_namespace(target: &Target) -> Result<(), Error> {
    let api = Api::<Namespace>::all(target.client.clone());
    if api.get_opt(&target.namespace).await?.is_some() {
        return Ok(());
    }
    let namespace = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(target.namespace.clone()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                super::MANAGED_BY.to_owned(),
            )])),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &namespace).await {
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        other => other.map(|_| ()).map_err(Error::from),
    }
}

/// Deletes the member's namespace when the operator made it
/// ([`ensure_namespace`] marks it) and none of the operator's objects are
/// left in it: another topology's pods there keep it. One that comes while it
/// terminates is refused until it is gone, and made again by that topology's
/// next sync.
async fn release_namespace(target: &Target) -> Result<(), Error> {
    let namespaces = Api::<Namespace>::all(target.client.clone());
    let Some(namespace) = namespaces.get_opt(&target.namespace).await? else {
        return Ok(());
    };
    let ours = format!("app.kubernetes.io/managed-by={}", super::MANAGED_BY);
    if namespace
        .labels()
        .get("app.kubernetes.io/managed-by")
        .map(String::as_str)
        != Some(super::MANAGED_BY)
        || namespace.metadata.deletion_timestamp.is_some()
    {
        return Ok(());
    }
    let listed = ListParams::default().labels(&ours);
    let pods = Api::<Pod>::namespaced(target.client.clone(), &target.namespace);
    let secrets = Api::<Secret>::namespaced(target.client.clone(), &target.namespace);
    // Pods already deleted do not hold it: the namespace's own deletion
    // waits for them.
    let live_pods = pods
        .list_metadata(&listed)
        .await?
        .items
        .iter()
        .any(|p| p.metadata.deletion_timestamp.is_none());
    if live_pods
        || !secrets
            .list_metadata(&listed.limit(1))
            .await?
            .items
            .is_empty()
    {
        return Ok(());
    }
    tracing::info!(cluster = ?target.cluster, namespace = %target.namespace, "deleting the member namespace the operator made, now empty");
    match namespaces
        .delete(&target.namespace, &kube::api::DeleteParams::default())
        .await
    {
        // A kubeconfig that may make namespaces but not delete them leaves
        // an empty one behind; that must not hold the Topology's deletion.
        Err(kube::Error::Api(e)) if e.code == 403 => {
            tracing::warn!(cluster = ?target.cluster, namespace = %target.namespace, message = %e.message, "may not delete the empty member namespace; left in place");
            Ok(())
        }
        other => apply::ignore_missing(other.map(|_| ())),
    }
}

/// Removes the topology's objects from every member cluster that held them
/// or that its nodes name. One that does not answer is an error (the
/// finalizer keeps the Topology and retries), unless its MemberCluster is
/// gone.
pub async fn cleanup(topology: &Topology, ctx: &Context) -> Result<(), Error> {
    let namespace = topology.namespace().unwrap_or_default();
    let key = nextmini_proto::topology_key::join(Some(&namespace), &topology.name_any());
    let mut members: BTreeMap<String, Option<String>> = held_before(topology)
        .into_iter()
        .map(|(name, ns)| (name, Some(ns)))
        .collect();
    for node in &topology.spec.nodes {
        if let Some(c) = &node.cluster {
            members.entry(c.clone()).or_insert(None);
        }
    }
    let clusters = Api::<MemberCluster>::all(ctx.client.clone());
    let mut waiting = Vec::new();
    for (name, held_in) in members {
        let Some(member) = clusters.get_opt(&name).await? else {
            continue;
        };
        if member.spec.kubeconfig_secret_ref.is_none() {
            continue;
        }
        let target_namespace = held_in
            .or_else(|| member.spec.namespace.clone())
            .unwrap_or_else(|| namespace.clone());
        let key = key.as_str();
        let cleared = in_member(ctx, &member, &name, target_namespace, |target| async move {
            apply::clear(&target, key).await?;
            release_namespace(&target).await
        })
        .await
        .map_err(|failed| failed.message().to_owned());
        if let Err(message) = cleared {
            waiting.push(format!("{name}: {message}"));
        }
    }
    if waiting.is_empty() {
        ctx.member_events.forget(&key);
        ctx.owed_restarts.forget(&key);
        return Ok(());
    }
    let message = format!(
        "the topology's pods in member cluster(s) could not be removed, so the Topology stays until they answer (or their MemberCluster is deleted): {}",
        waiting.join("; ")
    );
    apply::publish(
        ctx,
        topology,
        EventType::Warning,
        "MemberClusterUnreachable",
        &message,
    )
    .await;
    Err(Error::Other(message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot() -> (String, String) {
        ("ns/span".into(), "eu".into())
    }

    #[test]
    fn restarts_owed_to_an_absent_member_add_up_until_it_answers() {
        let owed = OwedRestarts::default();
        owed.owe(slot(), Restart::Nothing);
        assert_eq!(owed.take(&slot()), None);
        owed.owe(slot(), Restart::Pods(vec!["span-d".into()]));
        owed.owe(
            slot(),
            Restart::Pods(vec!["span-c".into(), "span-d".into()]),
        );
        assert_eq!(
            owed.take(&slot()),
            Some(Restart::Pods(vec!["span-c".into(), "span-d".into()]))
        );
        assert_eq!(owed.take(&slot()), None, "paid once");
        owed.owe(slot(), Restart::Pods(vec!["span-c".into()]));
        owed.owe(slot(), Restart::All);
        owed.forget("ns/other");
        assert_eq!(owed.take(&slot()), Some(Restart::All));
        owed.owe(slot(), Restart::All);
        owed.forget("ns/span");
        assert_eq!(owed.take(&slot()), None);
    }
}
