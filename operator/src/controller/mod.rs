//! The Kubernetes operator: kube-rs controllers reconciling `Topology` (with the
//! `Link` and `Flow` objects naming it) into agent pods, a headless Service, a
//! credentials Secret and rows in PostgreSQL, which the control hub turns into
//! the agents' snapshots.
//!
//! Reconcile is a pipeline, one module per phase:
//! [`fetch`] (the objects) → [`validate`] (pure: the same planner as local mode)
//! → [`build`] (pure: desired Kubernetes objects) → [`apply`] (store and API
//! server) → [`status`] (pure conditions, written by server-side apply).
//! [`orphans`] gives Links and Flows that name no Topology a condition saying so;
//! [`member_clusters`] probes every MemberCluster and writes what it found.

pub mod apply;
pub mod build;
pub mod exposure;
pub mod fetch;
pub mod health;
pub mod member_clusters;
pub mod member_events;
pub mod members;
pub mod orphans;
pub mod pod_files;
pub mod remote;
pub mod remote_sync;
pub mod status;
pub mod validate;

use crate::api::{Flow, Link, MemberCluster, Topology};
use crate::store::Store;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

/// Finalizer that keeps a Topology until its rows are gone from the store.
pub const FINALIZER: &str = "nextmini.io/cleanup";
/// Field manager of everything the operator writes by server-side apply.
pub const MANAGER: &str = "nextmini-operator";
/// `app.kubernetes.io/managed-by` of the objects the operator makes.
pub const MANAGED_BY: &str = "nextmini-operator";
pub const TOPOLOGY_LABEL: &str = "nextmini.io/topology";
pub const NODE_LABEL: &str = "nextmini.io/node";

/// What every agent pod is made with; fixed for the operator's lifetime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// What agents dial, e.g. `https://nextmini-hub.nextmini.svc:50051`.
    pub hub_address: String,
    pub agent_image: String,
    pub agent_image_pull_policy: String,
    /// `RUST_LOG` of the agents.
    pub agent_log: String,
}

pub struct Context {
    pub client: Client,
    pub store: Store,
    pub settings: Settings,
    pub recorder: Recorder,
    /// The operator's own pod as it was when the operator started: its
    /// last termination, when it restarted, shows on every topology.
    pub operator_pod: Option<Pod>,
    /// The credentials each topology's Secrets hold (`namespace/name`), so a
    /// reconcile need not read them back.
    pub credentials: tokio::sync::Mutex<std::collections::HashMap<String, crate::pki::Credentials>>,
    /// Clients of the member clusters that run nodes.
    pub remotes: remote::Clients,
    /// The member clusters' warnings already repeated on topologies.
    pub member_events: member_events::Repeated,
    /// Restarts owed to member clusters that did not answer.
    owed_restarts: remote_sync::OwedRestarts,
}

/// The operator's pod (named by the chart's POD_NAME and POD_NAMESPACE), if
/// it runs in one and may read it.
async fn own_pod(client: &Client) -> Option<Pod> {
    let name = std::env::var("POD_NAME").ok()?;
    let namespace = std::env::var("POD_NAMESPACE").ok()?;
    match Api::<Pod>::namespaced(client.clone(), &namespace)
        .get(&name)
        .await
    {
        Ok(pod) => {
            if let Some(restarts) =
                health::operator_restarts(&pod, k8s_openapi::jiff::Timestamp::now())
            {
                tracing::warn!(%restarts, "the operator restarted");
            }
            Some(pod)
        }
        Err(e) => {
            tracing::info!(error = %e, "cannot read the operator's own pod; its restarts will not show on topologies");
            None
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("{0}")]
    Other(String),
}

/// Runs the Topology controller until SIGTERM/SIGINT. `namespace` limits it to
/// one namespace; `None` watches all of them.
pub async fn run(client: Client, store: Store, settings: Settings, namespace: Option<String>) {
    // Links and Flows are watched untyped, like fetch lists them: a typed watch
    // stops at the first object it cannot decode, and with it every trigger.
    let link_resource = ApiResource::erase::<Link>(&());
    let flow_resource = ApiResource::erase::<Flow>(&());
    let (topologies, links, flows, pods, config_maps) = match &namespace {
        Some(ns) => (
            Api::<Topology>::namespaced(client.clone(), ns),
            Api::<DynamicObject>::namespaced_with(client.clone(), ns, &link_resource),
            Api::<DynamicObject>::namespaced_with(client.clone(), ns, &flow_resource),
            Api::<Pod>::namespaced(client.clone(), ns),
            Api::<ConfigMap>::namespaced(client.clone(), ns),
        ),
        None => (
            Api::<Topology>::all(client.clone()),
            Api::<DynamicObject>::all_with(client.clone(), &link_resource),
            Api::<DynamicObject>::all_with(client.clone(), &flow_resource),
            Api::<Pod>::all(client.clone()),
            Api::<ConfigMap>::all(client.clone()),
        ),
    };
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let operator_pod = own_pod(&client).await;
    let context = Arc::new(Context {
        client,
        store,
        settings,
        recorder,
        operator_pod,
        credentials: Default::default(),
        remotes: Default::default(),
        member_events: Default::default(),
        owed_restarts: Default::default(),
    });
    let owned_pods =
        watcher::Config::default().labels(&format!("app.kubernetes.io/managed-by={MANAGED_BY}"));
    let orphan_links = orphans::run(
        context.client.clone(),
        link_resource.clone(),
        namespace.clone(),
    );
    let orphan_flows = orphans::run(
        context.client.clone(),
        flow_resource.clone(),
        namespace.clone(),
    );
    let probes = member_clusters::run(context.client.clone());
    let controller = Controller::new(topologies, watcher::Config::default());
    let known = controller.store();
    let every_topology = controller.store();
    let topologies = controller
        .owns(pods, owned_pods)
        // A trace's ConfigMap edited: the topologies whose spec names it plan
        // again now (Link objects naming one, at the next periodic check).
        .watches(config_maps, watcher::Config::default(), move |map| {
            let (ns, name) = (map.namespace(), map.name_any());
            known
                .state()
                .into_iter()
                .filter(|t| t.namespace() == ns && names_config_map(t, &name))
                .map(|t| ObjectRef::from_obj(&*t))
                .collect::<Vec<_>>()
        })
        // A MemberCluster's region or measured round trip changes where nodes
        // go and the delays of links between clusters: every topology plans again.
        .watches(
            Api::<MemberCluster>::all(context.client.clone()),
            watcher::Config::default(),
            move |_| {
                every_topology
                    .state()
                    .into_iter()
                    .map(|t| ObjectRef::from_obj(&*t))
                    .collect::<Vec<_>>()
            },
        )
        .watches_with(
            links,
            link_resource,
            watcher::Config::default(),
            owner_topology,
        )
        .watches_with(
            flows,
            flow_resource,
            watcher::Config::default(),
            owner_topology,
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(topology = %object.name, "reconciled"),
                Err(e) => tracing::warn!(error = %e, "reconcile failed"),
            }
        });
    futures::join!(topologies, orphan_links, orphan_flows, probes);
}

/// Whether a trace in the topology's spec reads the ConfigMap `name`.
fn names_config_map(topology: &Topology, name: &str) -> bool {
    let mut manifest = fetch::assemble(topology, Vec::new(), Vec::new());
    crate::plan::trace_sources::referenced(&mut manifest)
        .iter()
        .any(|n| n == name)
}

/// The Topology a Link or Flow names.
fn owner_topology(member: DynamicObject) -> Option<ObjectRef<Topology>> {
    let ns = member.namespace()?;
    Some(ObjectRef::<Topology>::new(&fetch::topology_of(&member)?).within(&ns))
}

async fn reconcile(topology: Arc<Topology>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = topology
        .namespace()
        .ok_or_else(|| Error::Other("a Topology is namespaced".into()))?;
    let api = Api::<Topology>::namespaced(ctx.client.clone(), &namespace);
    finalizer(&api, FINALIZER, topology, |event| async {
        match event {
            Finalizer::Apply(t) => apply::reconcile(&t, &ctx).await,
            Finalizer::Cleanup(t) => apply::cleanup(&t, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Other(e.to_string()))
}

fn error_policy(topology: Arc<Topology>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(topology = %topology.name_any(), %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}
