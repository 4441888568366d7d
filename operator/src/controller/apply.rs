//! Phase 4: make it so — the plan into the store (a new generation only when
//! something changed, node by node when possible), then the credentials
//! Secret, the headless Service and the agent pods; then observe and write the
//! status. Every step is idempotent, so a reconcile can stop anywhere and run
//! again.

use super::build::{self, hash_of};
use super::pod_files;
use super::status::{self, Failure, Observed, Planning};
use super::validate::{self, Invalid, Validated};
use super::{Context, Error, MANAGER, TOPOLOGY_LABEL, remote};
use crate::api::{ConditionStatus, Topology, TopologyStatus};
use crate::pki::Credentials;
use crate::plan::Manifest;
use crate::runtime::pods;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use nextmini_proto::topology_key;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// How often a topology that is not Ready yet is looked at again (agents and
/// links report to the store, not to the API server).
const STARTING_RECHECK: Duration = Duration::from_secs(2);
/// How often a Ready topology is looked at again: a link that went down, a pod
/// that fails or a stored row the hub cannot run shows within this.
const READY_RECHECK: Duration = Duration::from_secs(10);

pub async fn reconcile(topology: &Topology, ctx: &Context) -> Result<Action, Error> {
    let namespace = topology.namespace().unwrap_or_default();
    let key = topology_key::join(Some(&namespace), &topology.name_any());
    let fetched = super::fetch::manifest(&ctx.client, topology).await?;
    if !fetched.undecodable.is_empty() {
        let invalid = Invalid {
            reason: "InvalidSpec",
            message: fetched.undecodable.join("; "),
        };
        refuse(topology, ctx, &invalid).await?;
        return Ok(Action::await_change());
    }
    let manifest = fetched.manifest;
    let stored_runtime = ctx.store.runtime_of(&key).await?;
    let validated = match validate::validate(&manifest, &namespace, stored_runtime.as_deref()) {
        Ok(v) => v,
        Err(invalid) => {
            refuse(topology, ctx, &invalid).await?;
            return Ok(Action::await_change());
        }
    };
    match make_it_so(topology, ctx, &validated, &manifest).await {
        Ok(action) => Ok(action),
        Err(error) => {
            show_failure(topology, ctx, &error).await;
            Err(error)
        }
    }
}

/// The valid spec into the store, the API server's objects and the status.
async fn make_it_so(
    topology: &Topology,
    ctx: &Context,
    validated: &Validated,
    manifest: &Manifest,
) -> Result<Action, Error> {
    let namespace = topology.namespace().unwrap_or_default();
    let key = topology_key::join(Some(&namespace), &topology.name_any());
    let home = Target::home(ctx, &namespace);
    let credentials = ensure_credentials(topology, ctx, validated, &home).await?;
    let (generation, restart) =
        store_plan(ctx, validated, &namespace, manifest, &credentials).await?;
    restart.run(&home, &key).await?;
    apply_object(&ctx.client, &namespace, &build::service(topology, &key)).await?;
    sync_hosts(topology, validated, &home).await?;
    let (here, elsewhere): (Vec<Pod>, Vec<Pod>) =
        build::agent_pods(topology, validated, &ctx.settings)
            .into_iter()
            .partition(|p| !p.labels().contains_key(remote::CLUSTER_LABEL));
    let created = sync_pods(&home, &key, &here).await?;
    if created > 0 {
        publish(
            ctx,
            topology,
            EventType::Normal,
            "PodsCreated",
            &format!("created {created} agent pod(s)"),
        )
        .await;
    }
    let row = ctx.store.status(&key).await?;
    let mut observed = observe(ctx, &home, &key, row.as_ref(), generation).await?;
    let secrets = pod_files::credential_secrets(topology, &validated.plan, &credentials);
    let exposing = super::exposure::per_site(validated, manifest);
    let remote = super::remote_sync::RemoteWork {
        pods: elsewhere,
        exposing: &exposing,
        secrets,
        restart: &restart,
        row: row.as_ref(),
        generation,
        home_pods: observed.home_pods,
    };
    let elsewhere = super::remote_sync::sync(topology, ctx, validated, manifest, remote).await;
    observed.clusters = elsewhere.clusters;
    observed.pod_problems.extend(elsewhere.pod_problems);
    super::exposure::record(
        ctx,
        topology,
        &exposing,
        &home,
        &key,
        elsewhere.endpoints,
        &elsewhere.unanswered,
    )
    .await?;
    super::members::adopt(ctx, topology, manifest).await?;
    super::members::link_statuses(ctx, manifest, row.as_ref()).await?;
    super::members::flow_statuses(ctx, manifest, &key).await?;
    let ready = write_status(topology, ctx, Planning::Planned, Some(&observed)).await?;
    Ok(Action::requeue(if ready {
        READY_RECHECK
    } else {
        STARTING_RECHECK
    }))
}

/// What a failed step means for the user, in the refusing party's words.
pub fn failure_of(error: &Error) -> Failure {
    match error {
        Error::Kube(kube::Error::Api(status)) => Failure {
            reason: match status.code {
                400 | 422 => "ObjectRefused",
                403 => "Forbidden",
                409 => "Conflict",
                413 => "ObjectTooLarge",
                500.. => "ApiServerError",
                _ => "ApiRefused",
            },
            message: status.message.clone(),
        },
        Error::Kube(e) => Failure {
            reason: "ApiUnreachable",
            message: e.to_string(),
        },
        Error::Store(e) => Failure {
            reason: "StoreUnavailable",
            message: e.to_string(),
        },
        Error::Other(message) => Failure {
            reason: "ReconcileFailed",
            message: message.clone(),
        },
    }
}

/// Ready=False with the failure's reason and message, and a Warning event when
/// the failure is new; the controller retries on its own. Best effort: when
/// the API server itself is what failed, the log is all there is.
async fn show_failure(topology: &Topology, ctx: &Context, error: &Error) {
    let failure = failure_of(error);
    let before = status::condition(topology.status.as_ref(), "Ready")
        .map(|c| (c.reason.clone(), c.message.clone()));
    if let Err(e) = write_status(topology, ctx, Planning::Failed(&failure), None).await {
        tracing::warn!(topology = %topology.name_any(), error = %e, "could not write the failure into the status");
    }
    if before != Some((failure.reason.to_string(), failure.message.clone())) {
        publish(
            ctx,
            topology,
            EventType::Warning,
            failure.reason,
            &failure.message,
        )
        .await;
    }
}

/// Removes the topology's rows, pods, Service, Secrets and ConfigMaps (the
/// owner references would remove the last three too, but later). A topology
/// of the same namespace and name that local mode runs is left alone.
pub async fn cleanup(topology: &Topology, ctx: &Context) -> Result<Action, Error> {
    let namespace = topology.namespace().unwrap_or_default();
    let key = topology_key::join(Some(&namespace), &topology.name_any());
    if ctx.store.runtime_of(&key).await?.as_deref() == Some(pods::runtime_name(&namespace).as_str())
    {
        ctx.store.delete_topology(&key).await?;
    }
    // Member clusters first: one that does not answer keeps the Topology
    // (and its finalizer) until it does, or until its MemberCluster is
    // deleted, so nothing is left running there unseen.
    super::remote_sync::cleanup(topology, ctx).await?;
    let home = Target::home(ctx, &namespace);
    clear(&home, &key).await?;
    ctx.credentials.lock().await.remove(&key);
    publish(
        ctx,
        topology,
        EventType::Normal,
        "Deleted",
        "removed the topology's pods and rows",
    )
    .await;
    Ok(Action::await_change())
}

async fn refuse(topology: &Topology, ctx: &Context, invalid: &Invalid) -> Result<(), Error> {
    let before = status::condition(topology.status.as_ref(), "Planned")
        .map(|c| (c.status, c.message.clone()));
    write_status(topology, ctx, Planning::Refused(invalid), None).await?;
    if before != Some((ConditionStatus::False, invalid.message.clone())) {
        publish(
            ctx,
            topology,
            EventType::Warning,
            invalid.reason,
            &invalid.message,
        )
        .await;
    }
    Ok(())
}

/// Each node's credential (token, certificate and key of the store's control
/// CA), kept in its pod's Secret across reconciles; new nodes get new ones, and
/// all are issued again when the CA is not the one that issued them (a new
/// database). Agents read their files at every connect, so a rotation needs no
/// pod restart once the kubelet has updated the mounted Secret. The operator
/// keeps what it wrote in memory and reads the Secrets back only when it
/// starts (or the CA changed); then it compares content hashes from a
/// metadata-only list, so a Ready topology of 10,000 nodes costs one small
/// list per reconcile, not its megabytes of keys.
async fn ensure_credentials(
    topology: &Topology,
    ctx: &Context,
    validated: &Validated,
    home: &Target,
) -> Result<Credentials, Error> {
    let namespace = topology.namespace().unwrap_or_default();
    let plan = &validated.plan;
    let nodes = || plan.nodes.iter().map(|n| &n.name);
    let ca = ctx.store.control_ca().await?;
    let key = plan.topology.clone();
    let cached = ctx
        .credentials
        .lock()
        .await
        .get(&key)
        .filter(|c| c.ca_pem == ca.cert_pem())
        .cloned();
    let api = Api::<Secret>::namespaced(ctx.client.clone(), &namespace);
    let mut credentials = match cached {
        Some(c) => c,
        None => {
            // Every Secret of the topology, including the single one older
            // operators wrote for all nodes.
            let mut files = BTreeMap::new();
            let all = api
                .list(&ListParams::default().labels(&home.selector(&plan.topology)))
                .await?;
            for secret in all.items {
                for (k, v) in secret.data.unwrap_or_default() {
                    if let Ok(v) = String::from_utf8(v.0) {
                        files.insert(k, v);
                    }
                }
            }
            Credentials::from_files(&files, nodes())
                .filter(|c| c.ca_pem == ca.cert_pem())
                .unwrap_or_else(|| Credentials {
                    ca_pem: ca.cert_pem().to_string(),
                    nodes: BTreeMap::new(),
                })
        }
    };
    credentials
        .nodes
        .retain(|n, _| plan.nodes.iter().any(|p| &p.name == n));
    let missing: Vec<&String> = nodes()
        .filter(|n| !credentials.nodes.contains_key(*n))
        .collect();
    let issued = Credentials::issue(&ca, &plan.topology, missing.into_iter())
        .map_err(crate::store::StoreError::from)?;
    credentials.nodes.extend(issued.nodes);
    // Every node's Secret stays here, where the operator reads credentials
    // back after a restart; nodes in member clusters get a copy there.
    let desired = pod_files::credential_secrets(topology, plan, &credentials);
    sync_parts(home, &plan.topology, desired, |s: &Secret| &s.metadata).await?;
    ctx.credentials
        .lock()
        .await
        .insert(key, credentials.clone());
    Ok(credentials)
}

/// A packed topology's node names, in ConfigMaps its worker pods mount.
async fn sync_hosts(
    topology: &Topology,
    validated: &Validated,
    home: &Target,
) -> Result<(), Error> {
    let desired = pod_files::hosts_config_maps(topology, &validated.plan);
    sync_parts(home, &validated.plan.topology, desired, |c: &ConfigMap| {
        &c.metadata
    })
    .await
}

/// Where the topology's objects go: the operator's own cluster, or a member
/// cluster through its API server.
pub(super) struct Target {
    pub client: kube::Client,
    pub namespace: String,
    /// The MemberCluster, for a member cluster.
    pub cluster: Option<String>,
}

impl Target {
    pub fn home(ctx: &Context, namespace: &str) -> Self {
        Target {
            client: ctx.client.clone(),
            namespace: namespace.to_owned(),
            cluster: None,
        }
    }

    /// The label selector of the topology's objects there, from its key:
    /// labels carry the name alone (a label value holds no `/`), and the
    /// namespace scopes them. The home's excludes objects made for a member
    /// (a member may be the operator's own cluster under another kubeconfig).
    pub fn selector(&self, topology: &str) -> String {
        let name = topology_key::name_of(topology);
        match &self.cluster {
            None => format!("{TOPOLOGY_LABEL}={name},!{}", remote::CLUSTER_LABEL),
            Some(c) => format!("{TOPOLOGY_LABEL}={name},{}={c}", remote::CLUSTER_LABEL),
        }
    }
}

/// Removes the topology's pods, Service, Secrets and ConfigMaps at `target`.
pub(super) async fn clear(target: &Target, topology: &str) -> Result<(), Error> {
    // One by one: the operator's role may delete pods, not collections.
    delete_pods(target, topology, |_| true).await?;
    ignore_missing(
        Api::<Service>::namespaced(target.client.clone(), &target.namespace)
            .delete(&pods::service_name(topology), &DeleteParams::default())
            .await
            .map(|_| ()),
    )?;
    sync_parts::<Secret>(target, topology, Vec::new(), |s| &s.metadata).await?;
    sync_parts::<ConfigMap>(target, topology, Vec::new(), |c| &c.metadata).await?;
    // The Services that exposed nodes to other clusters.
    super::exposure::keep_exposing(target, topology, &Default::default()).await?;
    Ok(())
}

/// Makes the topology's objects of one kind exactly `desired`: writes those
/// whose content hash differs from the live one and deletes the rest (those
/// of nodes that are gone, and the single Secret older operators wrote).
pub(super) async fn sync_parts<K>(
    target: &Target,
    topology: &str,
    desired: Vec<K>,
    meta: impl Fn(&K) -> &ObjectMeta,
) -> Result<(), Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api = Api::<K>::namespaced(target.client.clone(), &target.namespace);
    let selector = target.selector(topology);
    let live: HashMap<String, Option<String>> = api
        .list_metadata(&ListParams::default().labels(&selector))
        .await?
        .items
        .into_iter()
        .map(|m| {
            let hash = pod_files::hash_of(&m.metadata).map(str::to_string);
            (m.name_any(), hash)
        })
        .collect();
    for object in &desired {
        let m = meta(object);
        let name = m.name.clone().unwrap_or_default();
        let wanted = pod_files::hash_of(m).map(str::to_string);
        if live.get(&name) != Some(&wanted) {
            apply_object(&target.client, &target.namespace, object).await?;
        }
    }
    for name in live.keys() {
        if !desired
            .iter()
            .any(|d| meta(d).name.as_deref() == Some(name.as_str()))
        {
            ignore_missing(api.delete(name, &DeleteParams::default()).await.map(|_| ()))?;
        }
    }
    Ok(())
}

/// What the store compares to decide whether the desired state changed.
fn source_of(manifest: &Manifest) -> String {
    let topology = manifest.topologies.first().map(|d| &d.object.spec);
    let links: Vec<_> = manifest
        .links
        .iter()
        .map(|d| (d.object.name_any(), &d.object.spec))
        .collect();
    let flows: Vec<_> = manifest
        .flows
        .iter()
        .map(|d| (d.object.name_any(), &d.object.spec))
        .collect();
    // The traces' ConfigMaps too: an edited trace is a changed source, so it
    // is planned and stored again.
    let config_maps: Vec<_> = manifest
        .config_maps
        .iter()
        .map(|d| (d.object.name_any(), &d.object.data))
        .collect();
    json!({"topology": topology, "links": links, "flows": flows, "configMaps": config_maps})
        .to_string()
}

/// Which pods a newly stored generation needs made afresh, wherever they run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) enum Restart {
    #[default]
    Nothing,
    /// Pods, by name, hosting nodes whose addresses changed.
    Pods(Vec<String>),
    /// Topology-wide settings changed (or it is new): every agent starts afresh.
    All,
}

impl Restart {
    /// Both restarts: everything either one makes afresh.
    pub(super) fn and(self, other: Restart) -> Restart {
        match (self, other) {
            (Restart::All, _) | (_, Restart::All) => Restart::All,
            (Restart::Nothing, r) | (r, Restart::Nothing) => r,
            (Restart::Pods(mut a), Restart::Pods(b)) => {
                a.extend(b);
                a.sort();
                a.dedup();
                Restart::Pods(a)
            }
        }
    }

    /// Deletes the pods at `target`; the next sync makes them again.
    pub(super) async fn run(&self, target: &Target, topology: &str) -> Result<(), Error> {
        match self {
            Restart::Nothing => Ok(()),
            Restart::Pods(doomed) => {
                delete_pods(target, topology, |p| doomed.contains(&p.name_any())).await
            }
            Restart::All => delete_pods(target, topology, |_| true).await,
        }
    }
}

/// Stores the plan when it changed and returns the generation in force, with
/// the pods that must start afresh for it.
async fn store_plan(
    ctx: &Context,
    validated: &Validated,
    namespace: &str,
    manifest: &Manifest,
    credentials: &Credentials,
) -> Result<(i64, Restart), Error> {
    let store = &ctx.store;
    let plan = &validated.plan;
    let source = source_of(manifest);
    if store.source_of(&plan.topology).await?.as_deref() == Some(source.as_str())
        && let Some(g) = store.generation(&plan.topology).await?
    {
        return Ok((g, Restart::Nothing));
    }
    let changes = store
        .load_plan(&plan.topology)
        .await?
        .and_then(|(running, _)| running.node_changes(plan));
    let (generation, restart) = match changes {
        Some(changes) => {
            let added = credentials.token_hashes(changes.added.iter());
            let g = store
                .apply_node_changes(plan, &source, &changes.removed, &added)
                .await?;
            // A node whose addresses changed needs a new agent: its pod, or
            // the worker pod hosting it, is made afresh.
            let restarted: Vec<&String> = changes
                .added
                .iter()
                .filter(|n| changes.removed.contains(n))
                .collect();
            if restarted.is_empty() {
                (g, Restart::Nothing)
            } else {
                (g, Restart::Pods(build::pods_hosting(plan, &restarted)))
            }
        }
        None => {
            let all = credentials.token_hashes(plan.nodes.iter().map(|n| &n.name));
            let g = store
                .apply_plan(plan, &pods::runtime_name(namespace), &source, &all)
                .await?;
            (g, Restart::All)
        }
    };
    store.ensure_link_identity(&plan.topology).await?;
    tracing::info!(topology = %plan.topology, %namespace, generation, "stored a new generation");
    Ok((generation, restart))
}

async fn delete_pods(
    target: &Target,
    topology: &str,
    which: impl Fn(&Pod) -> bool,
) -> Result<(), Error> {
    let api = Api::<Pod>::namespaced(target.client.clone(), &target.namespace);
    let existing = api
        .list(&ListParams::default().labels(&target.selector(topology)))
        .await?;
    for pod in existing.items.iter().filter(|p| which(p)) {
        ignore_missing(
            api.delete(&pod.name_any(), &DeleteParams::default())
                .await
                .map(|_| ()),
        )?;
    }
    Ok(())
}

/// Creates missing pods, replaces those whose spec changed and removes those
/// of nodes that are gone; returns how many it created.
pub(super) async fn sync_pods(
    target: &Target,
    topology: &str,
    desired: &[Pod],
) -> Result<usize, Error> {
    let api = Api::<Pod>::namespaced(target.client.clone(), &target.namespace);
    let existing: HashMap<String, Pod> = api
        .list(&ListParams::default().labels(&target.selector(topology)))
        .await?
        .items
        .into_iter()
        .map(|p| (p.name_any(), p))
        .collect();
    let mut created = 0;
    for pod in desired {
        match existing.get(&pod.name_any()) {
            None => match api.create(&PostParams::default(), pod).await {
                Ok(_) => created += 1,
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            },
            Some(live) if live.metadata.deletion_timestamp.is_some() => {}
            Some(live) if hash_of(live) != hash_of(pod) => {
                tracing::info!(pod = %pod.name_any(), "pod spec changed; replacing the pod");
                ignore_missing(
                    api.delete(&live.name_any(), &DeleteParams::default())
                        .await
                        .map(|_| ()),
                )?;
            }
            Some(_) => {}
        }
    }
    let wanted: std::collections::HashSet<String> = desired.iter().map(|p| p.name_any()).collect();
    for (pod, live) in &existing {
        if !wanted.contains(pod) && live.metadata.deletion_timestamp.is_none() {
            ignore_missing(api.delete(pod, &DeleteParams::default()).await.map(|_| ()))?;
        }
    }
    Ok(created)
}

async fn observe(
    ctx: &Context,
    home: &Target,
    topology: &str,
    row: Option<&crate::store::TopologyStatusRow>,
    generation: i64,
) -> Result<Observed, Error> {
    let mut observed = Observed::default();
    if let Some(row) = row {
        observed.nodes_total = row.nodes.len() as u32;
        observed.nodes_ready = row
            .nodes
            .iter()
            .filter(|n| n.agent_state == "connected" && n.acked_generation >= generation)
            .count() as u32;
        observed.links_total = row.links.len() as u32;
        observed.links_down = ctx
            .store
            .links_not_forwarding(topology)
            .await?
            .into_iter()
            .map(|l| format!("{}: {}", l.link, l.reason))
            .collect();
        observed.links_up = observed
            .links_total
            .saturating_sub(observed.links_down.len() as u32);
        observed.row_problems = row
            .problems
            .iter()
            .map(|p| format!("{}: {}; {}", p.subject, p.problem, p.consequence))
            .collect();
        observed.unfaithful_now = row.unfaithful.iter().any(|e| e.ongoing());
        let (ongoing, ended): (Vec<_>, Vec<_>) = row.unfaithful.iter().partition(|e| e.ongoing());
        observed.unfaithful = ongoing
            .into_iter()
            .chain(ended)
            .map(|e| e.describe())
            .collect();
    }
    let pods = Api::<Pod>::namespaced(home.client.clone(), &home.namespace)
        .list(&ListParams::default().labels(&home.selector(topology)))
        .await?;
    let now = k8s_openapi::jiff::Timestamp::now();
    let running = pods
        .items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count();
    observed.home_pods = (pods.items.len() as u32, running as u32);
    for pod in &pods.items {
        let health = super::health::of_pod(pod, now);
        observed.pod_problems.extend(health.blocking);
        observed.pod_warnings.extend(health.recent);
    }
    if let Some(operator) = &ctx.operator_pod {
        observed
            .pod_warnings
            .extend(super::health::operator_restarts(operator, now));
    }
    Ok(observed)
}

/// Writes the status when it changed (ignoring transition times) and
/// publishes events on transitions; returns whether the topology is Ready.
async fn write_status(
    topology: &Topology,
    ctx: &Context,
    planning: Planning<'_>,
    observed: Option<&Observed>,
) -> Result<bool, Error> {
    let previous = topology.status.as_ref();
    let next: TopologyStatus = status::next(
        previous,
        topology.metadata.generation,
        planning,
        observed,
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    );
    let ready =
        status::condition(Some(&next), "Ready").is_some_and(|c| c.status == ConditionStatus::True);
    if previous.is_some_and(|p| status::same_ignoring_time(p, &next)) {
        return Ok(ready);
    }
    let was_ready =
        status::condition(previous, "Ready").is_some_and(|c| c.status == ConditionStatus::True);
    let was_degraded = status::condition(previous, "Degraded")
        .filter(|c| c.status == ConditionStatus::True)
        .map(|c| c.message.clone());
    let was_unfaithful = status::condition(previous, "Faithful")
        .filter(|c| c.status == ConditionStatus::False)
        .map(|c| c.reason.clone());
    let api = Api::<Topology>::namespaced(
        ctx.client.clone(),
        &topology.namespace().unwrap_or_default(),
    );
    let patch = json!({"apiVersion": crate::api::API_VERSION, "kind": "Topology", "status": next});
    api.patch_status(
        &topology.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    if ready && !was_ready {
        publish(
            ctx,
            topology,
            EventType::Normal,
            "Ready",
            "every agent runs the current spec and every link is up",
        )
        .await;
    }
    // Every new set of problems is an event, not only the first.
    if let Some(d) =
        status::condition(Some(&next), "Degraded").filter(|d| d.status == ConditionStatus::True)
        && was_degraded.as_deref() != Some(d.message.as_str())
    {
        publish(ctx, topology, EventType::Warning, "Degraded", &d.message).await;
    }
    // An episode starting is an event; its window sliding by is not.
    if let Some(f) = status::condition(Some(&next), "Faithful")
        .filter(|f| f.status == ConditionStatus::False && f.reason == "EmulatorLimited")
        && was_unfaithful.as_deref() != Some("EmulatorLimited")
    {
        publish(
            ctx,
            topology,
            EventType::Warning,
            "EmulatorLimited",
            &f.message,
        )
        .await;
    }
    Ok(ready)
}

pub(super) async fn publish(
    ctx: &Context,
    topology: &Topology,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    // Events carry at most 1 kB of note.
    let note: String = note.chars().take(1000).collect();
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx
        .recorder
        .publish(&event, &topology.object_ref(&()))
        .await
    {
        tracing::debug!(error = %e, "publishing an event failed");
    }
}

/// Server-side apply of an object the operator owns.
pub(super) async fn apply_object<K>(
    client: &kube::Client,
    namespace: &str,
    object: &K,
) -> Result<(), Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api = Api::<K>::namespaced(client.clone(), namespace);
    let mut value = serde_json::to_value(object).map_err(|e| Error::Other(e.to_string()))?;
    value["apiVersion"] = json!(K::api_version(&()));
    value["kind"] = json!(K::kind(&()));
    api.patch(
        &object.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&value),
    )
    .await?;
    Ok(())
}

pub(super) fn ignore_missing(result: Result<(), kube::Error>) -> Result<(), Error> {
    match result {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => Ok(other?),
    }
}
