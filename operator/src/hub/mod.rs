//! The control hub: one persistent gRPC bidi stream per agent. On Hello it checks
//! the agent's credential and sends a full snapshot. When a topology's desired
//! state changes (a NOTIFY from PostgreSQL after any committed change: a
//! re-applied manifest, a script's UPDATE of a link, route or rule) it sends each
//! of the topology's agents an ordered delta from the generation it has to the
//! new one. It stores acknowledgements, counters and the metrics history, and
//! marks agents that fall silent.

mod batcher;
mod fidelity;
mod observability;
pub(crate) mod params;
mod repair;
mod scenario;
mod session;
mod snapshot;
mod tls;
mod verify;

pub use snapshot::{SentConfig, TopologyView, Underlay, delta};

use crate::observe::Refusal;
use crate::store::{Store, TOPOLOGY_CHANNEL};
use batcher::CounterBatcher;
use futures::StreamExt;
use nextmini_proto::tls::NodeIdentity;
use nextmini_proto::v1 as pb;
use pb::control_server::{Control, ControlServer};
use session::SessionEntry;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 ping interval and answer timeout on control streams. A dead agent's
/// stream ends when its process does; these catch a silent peer over TCP.
/// Five seconds was too short while thousands of agents started on two cores:
/// pings went unanswered, streams were cut and every agent reconnected.
const KEEPALIVE: Duration = Duration::from_secs(20);
const RETENTION_EVERY: Duration = Duration::from_secs(30);
/// How often the hub looks whether sessions or topologies went, to return
/// their memory.
const RETURN_MEMORY_EVERY: Duration = Duration::from_secs(5);
/// How long agents a change does not touch wait for their delta.
const UNAFFECTED_DELAY: Duration = Duration::from_millis(20);
/// Connections of the views' own pool: a change reads the links it stamped,
/// the routes and the rules side by side, and sqlx's ping of a connection
/// given back holds it a round trip longer.
const VIEWS_POOL: u32 = 4;

type SessionKey = (String, String);

#[derive(Clone)]
pub struct Hub {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    /// Reads views for changes and Hellos, apart from the bulk writes.
    views_store: Store,
    counters: CounterBatcher,
    views: Mutex<HashMap<String, Arc<TopologyView>>>,
    checks: verify::Checks,
    sessions: Mutex<HashMap<SessionKey, SessionEntry>>,
    next_session: AtomicU64,
    started: Instant,
    metrics: Arc<crate::observe::HubMetrics>,
}

impl Hub {
    pub fn new(store: Store) -> Hub {
        let metrics = Arc::new(crate::observe::HubMetrics::new());
        let counters = CounterBatcher::spawn(store.clone(), metrics.clone());
        Hub {
            inner: Arc::new(Inner {
                views_store: store.dedicated(VIEWS_POOL),
                store,
                counters,
                views: Mutex::new(HashMap::new()),
                checks: verify::Checks::default(),
                sessions: Mutex::new(HashMap::new()),
                next_session: AtomicU64::new(1),
                started: Instant::now(),
                metrics,
            }),
        }
    }

    /// Serves the control stream on a Unix socket (local mode: agents in network
    /// namespaces share the host's filesystem, so no address is exposed) until
    /// `shutdown` resolves.
    pub async fn serve_unix(
        self,
        path: &Path,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        if path.exists() {
            std::fs::remove_file(path)?;
        }
        let tls = self.tls_config().await?;
        // std's bind asks for the kernel's largest backlog (somaxconn); tokio's
        // for 1,024, which thousands of agents starting at once overflowed: each
        // refused connect (EAGAIN) was retried with a new TLS handshake.
        let listener = std::os::unix::net::UnixListener::bind(path)?;
        listener.set_nonblocking(true)?;
        let listener = tokio::net::UnixListener::from_std(listener)?;
        set_owner_only(path)?;
        self.start_background().await;
        let incoming = tls::authenticated(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            tls,
            self.inner.metrics.clone(),
        );
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(KEEPALIVE))
            .http2_keepalive_timeout(Some(KEEPALIVE))
            .add_service(ControlServer::new(self))
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await?;
        Ok(())
    }

    /// Serves the control stream on TCP (in a cluster, behind the hub Service)
    /// until `shutdown` resolves. TLS with client certificates, as on the Unix
    /// socket.
    pub async fn serve_tcp(
        self,
        addr: std::net::SocketAddr,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let tls = self.tls_config().await?;
        let listener = tokio::net::TcpListener::bind(addr).await?;
        tracing::info!(%addr, "control hub listening (mTLS)");
        self.start_background().await;
        let accepted = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|conn| {
            let conn = conn?;
            // Deltas are small and latency matters more than segment count.
            conn.set_nodelay(true)?;
            Ok(conn)
        });
        let incoming = tls::authenticated(accepted, tls, self.inner.metrics.clone());
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(KEEPALIVE))
            .http2_keepalive_timeout(Some(KEEPALIVE))
            .add_service(ControlServer::new(self))
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await?;
        Ok(())
    }

    /// The hub's TLS: a server certificate issued afresh by the store's control
    /// CA, and client certificates of that CA required.
    async fn tls_config(&self) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let ca = self.inner.store.control_ca().await?;
        let cert = ca.issue_hub()?;
        let config = nextmini_proto::tls::server_config(
            ca.cert_pem().as_bytes(),
            cert.cert_pem.as_bytes(),
            cert.key_pem.as_bytes(),
        )?;
        Ok(Arc::new(config))
    }

    /// The tasks beside the streams: change listener, silence watchdog, metrics
    /// retention.
    async fn start_background(&self) {
        // Sessions of an earlier hub died with it: what the store says about
        // connected agents is stale until they reconnect.
        match self.inner.store.reset_agent_states().await {
            Ok(n) if n > 0 => {
                tracing::info!(agents = n, "marked agents of the previous hub disconnected")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "resetting agent states failed"),
        }
        tokio::spawn(self.clone().watch_changes());
        tokio::spawn(self.clone().watch_silence());
        tokio::spawn(self.clone().trim_metrics());
        tokio::spawn(self.clone().return_memory());
    }

    fn now_ms(&self) -> u64 {
        self.inner.started.elapsed().as_millis() as u64
    }

    /// Reads a topology's current view (plan, link identity, routes) from the
    /// store, on another connection when one was found broken (the views'
    /// pool does not test its connections before use).
    async fn load_view(
        &self,
        topology: &str,
    ) -> Result<Option<Arc<TopologyView>>, crate::store::StoreError> {
        let mut tries = VIEWS_POOL;
        loop {
            match self.load_view_once(topology).await {
                Err(e) if e.is_connection_lost() && tries > 0 => {
                    tracing::debug!(%topology, error = %e, "view read on a broken connection; again on another");
                    tries -= 1;
                }
                done => return done,
            }
        }
    }

    async fn load_view_once(
        &self,
        topology: &str,
    ) -> Result<Option<Arc<TopologyView>>, crate::store::StoreError> {
        let store = &self.inner.views_store;
        let Some((version, plan_generation)) = store.plan_version(topology).await? else {
            return Ok(None);
        };
        // The last good view of this creation: what a faulty row keeps running.
        let old = self
            .inner
            .views
            .lock()
            .await
            .get(topology)
            .filter(|o| o.topology_id == version.id)
            .cloned();
        let view = match old
            .as_deref()
            .filter(|o| o.plan_generation == plan_generation)
        {
            // Only routes, rules or links in place changed since `old`: its
            // plan stands but for the links stamped after it.
            Some(o) => {
                // Side by side: each is a round trip to a database that
                // 10,000 agents' reports keep busy.
                let (changed, (routes, rules)) = tokio::try_join!(
                    store.links_changed_since(version.id, o.generation, o.plan.dataplane.mtu),
                    store.routes(topology),
                )?;
                let mut view = if changed.links.is_empty() {
                    TopologyView::same_plan_as(o, version.generation)
                } else {
                    TopologyView::with_links_changed(o, version.generation, changed)
                };
                // An apply stores the identity just after its commit, so a
                // view loaded in between has none yet.
                if view.identity.is_none() {
                    view.identity = store.link_identity(topology).await?;
                }
                view.with_routes(routes, rules, Some(o))
            }
            None => {
                let Some(loaded) = store.load_checked(topology).await? else {
                    return Ok(None);
                };
                let version = loaded.version;
                let old = old.filter(|o| o.topology_id == version.id);
                let mut plan = loaded.plan;
                let problems = repair::put_back(&mut plan, &loaded.faults, old.as_deref());
                let (routes, rules) = store.routes(topology).await?;
                let mut view = TopologyView::after(plan, version.generation, old.as_deref())
                    .with_routes(routes, rules, old.as_deref());
                view.plan_problems = problems;
                view.plan_generation = loaded.plan_generation;
                view.topology_id = version.id;
                // Both change only with an apply, which moves the plan
                // generation: a view sharing the plan shares them.
                view.identity = store.link_identity(topology).await?;
                if let Some(runtime) = store.runtime_of(topology).await? {
                    view.underlay = crate::runtime::pods::underlay_of(&view.plan, &runtime);
                }
                view.endpoints = Arc::new(store.endpoints(topology).await?);
                view
            }
        };
        Ok(Some(Arc::new(view)))
    }

    /// The view at the topology's current creation and generation, loaded only
    /// when either moved: a thousand agents connecting at once share one load,
    /// and a topology deleted and applied again under the same name (generation
    /// 1 again) never gets its predecessor's view.
    async fn current_view(&self, topology: &str) -> Result<Option<Arc<TopologyView>>, Status> {
        let unavailable = |e: crate::store::StoreError| Status::unavailable(e.to_string());
        let Some(version) = self
            .inner
            .store
            .version(topology)
            .await
            .map_err(unavailable)?
        else {
            self.inner.views.lock().await.remove(topology);
            return Ok(None);
        };
        if let Some(v) = self
            .inner
            .views
            .lock()
            .await
            .get(topology)
            .filter(|v| v.topology_id == version.id && v.generation == version.generation)
        {
            return Ok(Some(v.clone()));
        }
        let view = match self.load_view(topology).await {
            Ok(view) => view,
            Err(e) => {
                self.unloadable(topology, &e).await;
                return Err(unavailable(e));
            }
        };
        if let Some(v) = &view {
            self.publish_problems(v).await;
        }
        let mut views = self.inner.views.lock().await;
        match &view {
            Some(v) => {
                // A change read meanwhile may have put a later one there.
                if let Some(newer) = views.get(topology).filter(|o| o.overtakes(v)) {
                    return Ok(Some(newer.clone()));
                }
                views.insert(topology.to_string(), v.clone());
            }
            None => {
                views.remove(topology);
            }
        }
        Ok(view)
    }

    /// LISTENs for committed changes and brings every agent of the changed
    /// topology to the new generation. After a lost connection every topology
    /// with sessions is refreshed, since notifications may have been missed.
    async fn watch_changes(self) {
        let mut backoff = Duration::from_millis(100);
        loop {
            if let Err(e) = self.listen_once().await {
                tracing::warn!(error = %e, "topology change listener failed; reconnecting");
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
            let topologies: Vec<String> = {
                let sessions = self.inner.sessions.lock().await;
                let mut t: Vec<String> = sessions.keys().map(|k| k.0.clone()).collect();
                t.sort();
                t.dedup();
                t
            };
            for t in topologies {
                self.on_change(&t).await;
            }
        }
    }

    async fn listen_once(&self) -> Result<(), sqlx::Error> {
        let mut listener =
            sqlx::postgres::PgListener::connect_with(self.inner.store.pool()).await?;
        listener.listen(TOPOLOGY_CHANNEL).await?;
        loop {
            let n = listener.recv().await?;
            // `<topology> problems=<n>` is the hub's own news for listeners:
            // no desired state changed.
            if n.payload().contains(' ') {
                continue;
            }
            let received = Instant::now();
            self.on_change(n.payload()).await;
            self.inner.metrics.observe_control_delta(received.elapsed());
        }
    }

    /// Sends each session of `topology` what it needs to reach the new
    /// generation: a delta from the generation it has, or a full snapshot when
    /// no delta applies. Sessions are locked throughout, so a Hello racing with
    /// this sees either the old generation (and gets the delta) or the new one.
    async fn on_change(&self, topology: &str) {
        let new = match self.load_view(topology).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(%topology, error = %e, "cannot load changed topology");
                self.unloadable(topology, &e).await;
                return;
            }
        };
        if new.is_none() {
            self.inner.metrics.set_topology_problems(topology, None);
        }
        let old = {
            let mut views = self.inner.views.lock().await;
            if let Some(v) = &new
                && let Some(newer) = views.get(topology).filter(|o| o.overtakes(v))
            {
                // A connecting agent's Hello loaded a later generation while
                // this one was read, and its sessions got that: putting this
                // one back would make the hub believe they run it. The later
                // generation's own notification brings the rest to it.
                tracing::debug!(%topology, loaded = v.generation, served = newer.generation, "change overtaken while it was read");
                return;
            }
            match &new {
                Some(v) => views.insert(topology.to_string(), v.clone()),
                None => views.remove(topology),
            }
        };
        // A view of an earlier creation of this name says nothing about what
        // the agents of this one run.
        let old = old.filter(|o| new.as_ref().is_some_and(|n| n.topology_id == o.topology_id));
        let mut sessions = self.inner.sessions.lock().await;
        let Some(new) = new else {
            end_other_creations(&mut sessions, topology, None);
            return;
        };
        let affected = old.as_ref().map(|o| new.affected_nodes(o));
        // When nothing outside the affected nodes changed, the others are sent
        // nothing: their config stays what it was (issue 16.4).
        let unchanged_from = old
            .as_ref()
            .filter(|o| new.same_outside_affected(o))
            .map(|o| o.generation);
        // The affected nodes are looked up, not searched for among thousands
        // of sessions: they are served before anything scans the rest.
        let first: Vec<SessionKey> = match &affected {
            Some(nodes) => nodes
                .iter()
                .map(|n| (topology.to_string(), n.clone()))
                .filter(|k| sessions.contains_key(k))
                .collect(),
            None => sessions
                .keys()
                .filter(|(t, _)| t == topology)
                .cloned()
                .collect(),
        };
        let mut carried = Vec::new();
        for key in &first {
            if let Delivery::Carried { sent } = bring_up_to_date(&mut sessions, key, &new) {
                carried.push((key.1.clone(), sent));
            }
        }
        // The sends woke the changed nodes' connection tasks into this
        // worker's next slot, which no other worker may take: they would run
        // only after the scans below, milliseconds at 10,000 agents.
        tokio::task::yield_now().await;
        // After the changed nodes' sends, which skip such sessions.
        end_other_creations(&mut sessions, topology, Some(new.topology_id));
        let rest: Vec<SessionKey> = match &affected {
            Some(nodes) => sessions
                .keys()
                .filter(|(t, n)| t == topology && !nodes.contains(n))
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        let mut behind = Vec::new();
        for key in rest {
            match unchanged_from.and_then(|from| carry_forward(&mut sessions, &key, from, &new)) {
                Some(sent) => carried.push((key.1, sent)),
                None => behind.push(key),
            }
        }
        drop(sessions);
        // After the sends: the problems are a database write, which the
        // changed nodes need not wait for.
        self.publish_problems(&new).await;
        if !carried.is_empty()
            && let Err(e) = self
                .inner
                .store
                .carry_acks(new.topology_id, new.generation, &carried)
                .await
        {
            tracing::warn!(%topology, error = %e, "recording the untouched nodes at the new generation failed");
        }
        if new.built_in_part() {
            self.check_view_soon(topology).await;
        }
        if behind.is_empty() {
            return;
        }
        // The nodes that need a full update but are not among the changed ones
        // get it a moment later: hundreds of agents decoding at once would
        // otherwise take the CPU from the few whose packet path is changing.
        let hub = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(UNAFFECTED_DELAY).await;
            let carried: Vec<(String, i64)> = {
                let mut sessions = hub.inner.sessions.lock().await;
                behind
                    .into_iter()
                    .filter_map(|key| match bring_up_to_date(&mut sessions, &key, &new) {
                        Delivery::Carried { sent } => Some((key.1, sent)),
                        _ => None,
                    })
                    .collect()
            };
            if !carried.is_empty()
                && let Err(e) = hub
                    .inner
                    .store
                    .carry_acks(new.topology_id, new.generation, &carried)
                    .await
            {
                tracing::warn!(topology = %new.plan.topology, error = %e, "recording the unchanged nodes at the new generation failed");
            }
        });
    }

    /// Makes the faulty rows of a freshly loaded view visible: the
    /// `topology_problems` rows (`nextmini status`, the Topology's conditions), a
    /// NOTIFY when they change, the metric, and one log line per problem.
    async fn publish_problems(&self, view: &TopologyView) {
        let topology = &view.plan.topology;
        let problems = view.problems();
        for p in &problems {
            tracing::warn!(%topology, subject = %p.subject, problem = %p.problem, consequence = %p.consequence, "stored row cannot run as written");
        }
        self.inner
            .metrics
            .set_topology_problems(topology, Some(problems.len() as u64));
        if let Err(e) = self
            .inner
            .store
            .record_problems(view.topology_id, topology, &problems)
            .await
        {
            tracing::warn!(%topology, error = %e, "recording the topology's problems failed");
        }
    }

    /// A topology the hub cannot read at all (a row no stand-in covers, such as
    /// a node address that does not parse): its agents keep the last generation
    /// they were sent, and the reason is recorded where users look.
    async fn unloadable(&self, topology: &str, e: &crate::store::StoreError) {
        let Ok(Some(version)) = self.inner.store.version(topology).await else {
            return;
        };
        let running = self
            .inner
            .views
            .lock()
            .await
            .get(topology)
            .filter(|v| v.topology_id == version.id)
            .map(|v| v.generation);
        let problem = crate::store::TopologyProblem {
            subject: "topology".into(),
            problem: e.to_string(),
            consequence: match running {
                Some(g) => format!("no change applies: agents keep generation {g}"),
                None => "no agent can be served".into(),
            },
        };
        self.inner.metrics.set_topology_problems(topology, Some(1));
        if let Err(e) = self
            .inner
            .store
            .record_problems(version.id, topology, &[problem])
            .await
        {
            tracing::warn!(%topology, error = %e, "recording the topology's problems failed");
        }
    }

    /// Marks the nodes of agents silent for several report intervals (a hung
    /// or killed agent whose connection the kernel has not reset)
    /// disconnected. Their sessions stay: on two cores at thousands of agents
    /// the silence can be the hub's own backlog, and a dropped session comes
    /// back as a reconnect with a TLS handshake and a full snapshot, which
    /// deepened it (4,600 sessions dropped while 9,472 agents started within
    /// seconds). A dead connection still ends by HTTP/2 keepalive; a live
    /// agent's next message marks it connected again.
    async fn watch_silence(self) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let now = self.now_ms();
            let silent: Vec<(SessionKey, i64)> = {
                let sessions = self.inner.sessions.lock().await;
                sessions
                    .iter()
                    .filter(|(_, e)| {
                        if e.held {
                            return false;
                        }
                        let applying = u64::try_from(e.generation).unwrap_or(0)
                            > e.liveness.acked.load(Ordering::Relaxed);
                        let limit = session::silence_limit_ms(
                            e.report_interval_ms,
                            e.idle_report_interval_ms,
                            applying,
                        );
                        now.saturating_sub(e.liveness.last_seen_ms.load(Ordering::Relaxed)) > limit
                    })
                    // Once per silence: the flag is cleared by its next message.
                    .filter(|(_, e)| !e.liveness.silent.swap(true, Ordering::Relaxed))
                    .map(|(k, e)| (k.clone(), e.topology_id))
                    .collect()
            };
            for (key, topology_id) in silent {
                tracing::warn!(topology = %key.0, node = %key.1, "agent went silent; marking it disconnected");
                self.mark_disconnected(&key, topology_id).await;
            }
        }
    }

    /// Records that `key`'s session ended or fell silent. The agent may have
    /// connected again, or spoken, while this write waited (at 10,000 agents
    /// on two cores a watchdog pass wrote thousands of these, seconds behind):
    /// it wrote `connected` first and would stay marked down for good, so a
    /// session found registered and not silent after the write is marked
    /// connected again.
    pub(crate) async fn mark_disconnected(&self, key: &SessionKey, topology_id: i64) {
        let store = &self.inner.store;
        if let Err(e) = store
            .set_agent_state(topology_id, &key.1, "disconnected")
            .await
        {
            tracing::warn!(error = %e, "marking agent disconnected failed");
            return;
        }
        let back = self
            .inner
            .sessions
            .lock()
            .await
            .get(key)
            .filter(|e| e.topology_id == topology_id && !e.liveness.silent.load(Ordering::Relaxed))
            .is_some();
        if back
            && let Err(e) = store
                .set_agent_state(topology_id, &key.1, "connected")
                .await
        {
            tracing::warn!(error = %e, "marking the reconnected agent connected failed");
        }
    }

    /// Gives the memory of gone sessions and views back to the system once
    /// their number fell. glibc's allocator keeps freed memory in its
    /// per-thread arenas: a hub that served 1,000 agents kept their 300 MB
    /// after the topology was removed.
    ///
    /// A session's entry can go before its connection's buffers, which its
    /// HTTP/2 task frees when the socket closes, seconds later under load (a
    /// hub that trimmed only on the falling tick once kept 79 MB of a
    /// 1,100-agent ring's for 30 s). So it trims on the ticks after, too.
    async fn return_memory(self) {
        const TRIMS_AFTER_A_FALL: u8 = 3;
        let mut tick = tokio::time::interval(RETURN_MEMORY_EVERY);
        let mut held = (0, 0);
        let mut trims_left = 0;
        let mut recycles_left = 0;
        loop {
            tick.tick().await;
            let now = (
                self.inner.sessions.lock().await.len(),
                self.inner.views.lock().await.len(),
            );
            if now.0 < held.0 || now.1 < held.1 {
                trims_left = TRIMS_AFTER_A_FALL;
                // The tables keep the capacity of their largest size: 400 KB
                // of sessions after a 1,000-node ring's `down`.
                self.inner.sessions.lock().await.shrink_to_fit();
                self.inner.views.lock().await.shrink_to_fit();
            }
            // Only after a topology went: agents reconnecting during a large
            // `up` make the session count fall too, and reopening the pool
            // then would cost a loaded database connection set-ups for nothing.
            if now.1 < held.1 {
                recycles_left = TRIMS_AFTER_A_FALL;
            }
            if trims_left > 0 {
                trims_left -= 1;
                let before = crate::observe::process_rss_bytes();
                let mut recycled = 0;
                if recycles_left > 0 {
                    recycles_left -= 1;
                    // Their buffers were grown by the gone topology's batches.
                    recycled = self.inner.store.recycle_idle_connections().await
                        + self.inner.views_store.recycle_idle_connections().await;
                }
                crate::observe::return_free_memory();
                // At most a few lines after sessions or topologies went.
                tracing::info!(
                    sessions = now.0,
                    views = now.1,
                    recycled_connections = recycled,
                    rss_before = before,
                    rss_after = crate::observe::process_rss_bytes(),
                    "returned free memory"
                );
            }
            held = now;
        }
    }

    async fn trim_metrics(self) {
        let mut tick = tokio::time::interval(RETENTION_EVERY);
        loop {
            tick.tick().await;
            match self.inner.store.trim_metrics().await {
                Ok(n) if n > 0 => tracing::debug!(rows = n, "trimmed metrics history"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "trimming metrics failed"),
            }
        }
    }

    /// Checks Hello against the connection's certificate and the store: the
    /// certificate says which node this is, the token that it belongs to the
    /// topology as applied now.
    async fn authenticate(&self, peer: &NodeIdentity, hello: &pb::Hello) -> Result<i64, Status> {
        if peer.topology != hello.topology || peer.node != hello.node {
            self.inner.metrics.refused(Refusal::IdentityMismatch);
            tracing::warn!(certificate = %peer, claimed_topology = %hello.topology, claimed_node = %hello.node, "refused a session: Hello claims another node than its certificate");
            return Err(Status::permission_denied(format!(
                "this connection's certificate is for {peer}, not {}/{}",
                hello.topology, hello.node
            )));
        }
        if hello.protocol_version != nextmini_proto::PROTOCOL_VERSION {
            return Err(Status::failed_precondition(format!(
                "protocol version {} not supported (hub speaks {})",
                hello.protocol_version,
                nextmini_proto::PROTOCOL_VERSION
            )));
        }
        let identity = self
            .inner
            .store
            .node_identity(&hello.topology, &hello.node)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?
            .ok_or_else(|| {
                self.inner.metrics.refused(Refusal::UnknownNode);
                Status::not_found(format!(
                    "topology {} has no node {}",
                    hello.topology, hello.node
                ))
            })?;
        let presented = hex::encode(Sha256::digest(hello.credential.as_bytes()));
        if presented != identity.credential_sha256 {
            self.inner.metrics.refused(Refusal::BadCredential);
            return Err(Status::unauthenticated("bad credential"));
        }
        Ok(identity.topology_id)
    }
}

/// What `bring_up_to_date` did for one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// A delta or snapshot was queued.
    Sent,
    /// The session's config already is `new`'s: it was sent nothing, and its
    /// ack of generation `sent` stands for the new one (`Store::carry_acks`).
    Carried { sent: i64 },
    /// Already there, held down, of another creation, or gone.
    Nothing,
}

/// Sends a session what takes its agent to `new`'s generation: a delta from
/// the config it has, or a full snapshot. A session already there (or past it,
/// when a later change overtook a delayed send) is left alone, and so is one
/// whose config the change left as it was, however the hub's bookkeeping of
/// generations came to call it behind: an agent that needs nothing is sent
/// nothing (issue 16.4).
fn bring_up_to_date(
    sessions: &mut HashMap<SessionKey, SessionEntry>,
    key: &SessionKey,
    new: &TopologyView,
) -> Delivery {
    let Some(entry) = sessions.get_mut(key) else {
        return Delivery::Nothing;
    };
    let (topology, node) = key;
    // A session of an earlier creation of this name: `end_other_creations`
    // ends it.
    if entry.generation >= new.generation || entry.held || entry.topology_id != new.topology_id {
        return Delivery::Nothing;
    }
    let Some(next) = new.snapshot(node) else {
        entry.send(reject(format!(
            "node {node} is no longer part of topology {topology}"
        )));
        return Delivery::Sent;
    };
    let next_config = SentConfig::of(&next);
    if entry
        .config
        .as_ref()
        .is_some_and(|c| c.runs_same_as(&next_config))
    {
        tracing::debug!(%topology, %node, sent = entry.generation, generation = new.generation, "config unchanged: carried, not sent");
        entry.same_as = entry.same_as.max(new.generation);
        return Delivery::Carried {
            sent: entry.generation,
        };
    }
    let msg = entry
        .config
        .as_ref()
        .and_then(|before| delta(before, &next))
        .map(|mut d| {
            // The agent's own generation: `same_as` may be past it.
            d.base_generation = entry.generation as u64;
            d
        })
        .map(pb::controller_message::Msg::Delta)
        .unwrap_or_else(|| pb::controller_message::Msg::Snapshot(next.clone()));
    entry.report_interval_ms = new.plan.report_interval_ms;
    entry.idle_report_interval_ms = next.idle_report_interval_ms;
    if entry.send(msg) {
        entry.generation = new.generation;
        entry.same_as = new.generation;
        entry.config = Some(next_config);
    }
    Delivery::Sent
}

/// Ends the sessions of `topology` that are not of creation `current` (all
/// of them when it was deleted), also when the name was applied again before
/// the notification was read: their agents are being removed, and none of
/// them may take the new creation's state.
fn end_other_creations(
    sessions: &mut HashMap<SessionKey, SessionEntry>,
    topology: &str,
    current: Option<i64>,
) {
    sessions.retain(|(t, _), entry| {
        if t != topology || Some(entry.topology_id) == current {
            return true;
        }
        entry.send(reject(format!("topology {topology} was deleted")));
        false
    });
}

/// For a session whose agent runs the config of generation `from`, which the
/// change left as it was: records that its config is also `new`'s, sends
/// nothing, and returns the generation the agent was sent (its ack of that
/// stands for `new`'s). None when the session is elsewhere (held, behind, or
/// without a config): it needs `bring_up_to_date`.
fn carry_forward(
    sessions: &mut HashMap<SessionKey, SessionEntry>,
    key: &SessionKey,
    from: i64,
    new: &TopologyView,
) -> Option<i64> {
    let entry = sessions.get_mut(key)?;
    if entry.held || entry.config.is_none() || entry.same_as != from {
        return None;
    }
    entry.same_as = new.generation;
    Some(entry.generation)
}

fn reject(reason: String) -> pb::controller_message::Msg {
    pb::controller_message::Msg::Reject(pb::Reject { reason })
}

#[tonic::async_trait]
impl Control for Hub {
    type SessionStream = ReceiverStream<Result<pb::ControllerMessage, Status>>;

    async fn session(
        &self,
        request: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        // Every connection reaching here passed the TLS handshake with a node
        // certificate; a request without one means a listener without TLS.
        let Some(tls::PeerNode(peer)) = request.extensions().get::<tls::PeerNode>().cloned() else {
            return Err(Status::unauthenticated("no client certificate"));
        };
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no Hello within 10 s"))??;
        let Some(pb::AgentMessage {
            msg: Some(pb::agent_message::Msg::Hello(hello)),
        }) = first
        else {
            return Err(Status::invalid_argument("the first message must be Hello"));
        };
        let topology_id = self.authenticate(&peer, &hello).await?;
        // Deep enough for bursts of changes (a script flipping routes); one that falls further
        // behind is resynced by its next reconnect.
        let (tx, rx) = mpsc::channel(1024);
        let id = self.inner.next_session.fetch_add(1, Ordering::Relaxed);
        let key = (hello.topology.clone(), hello.node.clone());
        let liveness = Arc::new(session::Liveness::new(self.now_ms()));
        // A timed scenario's kill may hold this node down (a cluster). The
        // cached view is enough to tell: a scenario starts only once every
        // agent ran the topology, so a view was loaded by then, and reading
        // the store's version again here would cost every connecting agent a
        // query.
        let cached = self.inner.views.lock().await.get(&hello.topology).cloned();
        let hold = match cached.filter(|v| v.topology_id == topology_id) {
            Some(view) => scenario::on_connect(self, &view, &hello.node).await,
            None => None,
        };
        let replaced = {
            // Held while the snapshot is chosen and the session registered, so a
            // concurrent change is applied to this session exactly once.
            let mut sessions = self.inner.sessions.lock().await;
            let view = self
                .current_view(&hello.topology)
                .await?
                .ok_or_else(|| Status::not_found(format!("no topology {}", hello.topology)))?;
            let snapshot = view
                .snapshot(&hello.node)
                .ok_or_else(|| Status::not_found(format!("no node {}", hello.node)))?;
            let mut entry = SessionEntry {
                id,
                pid: hello.pid,
                tx,
                config: None,
                generation: 0,
                same_as: 0,
                liveness: liveness.clone(),
                topology_id,
                report_interval_ms: view.plan.report_interval_ms,
                idle_report_interval_ms: snapshot.idle_report_interval_ms,
                metrics: self.inner.metrics.clone(),
                held: hold.is_some(),
            };
            if !entry.held {
                entry.config = Some(SentConfig::of(&snapshot));
                if !entry.send(pb::controller_message::Msg::Snapshot(snapshot)) {
                    return Err(Status::internal("session closed"));
                }
                entry.generation = view.generation;
                entry.same_as = view.generation;
            }
            sessions.insert(key.clone(), entry)
        };
        if let Some(hold) = hold {
            tracing::info!(topology = %hello.topology, node = %hello.node, ?hold, "agent held down by the scenario");
            if let Some((restart, at)) = hold.restart {
                tokio::spawn(scenario::release_at(
                    self.clone(),
                    key.clone(),
                    id,
                    restart,
                    at,
                ));
            }
        }
        // A restarted agent can say Hello before the hub has seen its
        // predecessor's stream end, which then finds itself replaced and marks
        // nothing: the node would never show the outage. A session of another
        // process replaced here is that predecessor.
        if replaced.is_some_and(|old| old.pid != hello.pid)
            && let Err(e) = self
                .inner
                .store
                .set_agent_state(topology_id, &hello.node, "disconnected")
                .await
        {
            tracing::warn!(error = %e, "marking the replaced agent disconnected failed");
        }
        if let Err(e) = self
            .inner
            .store
            .set_agent_state(topology_id, &hello.node, "connected")
            .await
        {
            tracing::warn!(error = %e, "marking agent connected failed");
        }
        tracing::info!(topology = %hello.topology, node = %hello.node, pid = hello.pid, "agent connected");
        tokio::spawn(session::run(
            self.clone(),
            id,
            key,
            topology_id,
            liveness,
            inbound,
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

fn set_owner_only(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fixtures::line3;

    fn entry(tx: mpsc::Sender<Result<pb::ControllerMessage, Status>>) -> SessionEntry {
        SessionEntry {
            id: 1,
            pid: 1,
            tx,
            generation: 0,
            same_as: 0,
            config: None,
            liveness: Arc::new(session::Liveness::new(0)),
            topology_id: 1,
            report_interval_ms: 1000,
            idle_report_interval_ms: 1000,
            metrics: Arc::new(crate::observe::HubMetrics::new()),
            held: false,
        }
    }

    /// A view of creation 1, the sessions' own.
    fn view(plan: crate::plan::Plan, generation: i64) -> TopologyView {
        let mut view = TopologyView::new(plan, generation);
        view.topology_id = 1;
        view
    }

    fn with_rate(link: usize, rate: u64, generation: i64) -> TopologyView {
        let mut plan = line3();
        plan.link_mut(link).forward.rate_bps = Some(rate);
        view(plan, generation)
    }

    /// A session of an earlier creation of the name is sent nothing of the
    /// new one's, and is ended once the changed nodes were served.
    #[test]
    fn a_session_of_an_earlier_creation_gets_nothing_and_is_ended() {
        let (tx, mut rx) = mpsc::channel(8);
        let key: SessionKey = ("line3".into(), "a".into());
        let mut sessions = HashMap::from([(key.clone(), entry(tx))]);
        let mut again = TopologyView::new(line3(), 1);
        again.topology_id = 2;
        bring_up_to_date(&mut sessions, &key, &again);
        assert!(
            rx.try_recv().is_err(),
            "creation 2's state went to creation 1's agent"
        );
        end_other_creations(&mut sessions, "line3", Some(2));
        assert!(sessions.is_empty());
        match rx.try_recv().expect("a reject").expect("ok").msg {
            Some(pb::controller_message::Msg::Reject(r)) => {
                assert_eq!(r.reason, "topology line3 was deleted");
            }
            other => panic!("expected a reject, got {other:?}"),
        }
    }

    /// Issue 16.4: a node a change leaves alone is sent nothing, and the next
    /// change that does touch it is a delta from the config it really has.
    #[test]
    fn untouched_nodes_are_sent_nothing_and_catch_up_from_what_they_run() {
        let (tx, mut rx) = mpsc::channel(8);
        let key: SessionKey = ("line3".into(), "a".into());
        let mut sessions = HashMap::from([(key.clone(), entry(tx))]);
        let v1 = view(line3(), 1);
        bring_up_to_date(&mut sessions, &key, &v1);
        assert!(matches!(
            rx.try_recv().expect("a snapshot").expect("ok").msg,
            Some(pb::controller_message::Msg::Snapshot(_))
        ));

        // b-c's rate: a's config is the same.
        let v2 = with_rate(1, 5_000_000, 2);
        assert!(!v2.affected_nodes(&v1).contains("a") && v2.same_outside_affected(&v1));
        assert_eq!(carry_forward(&mut sessions, &key, 1, &v2), Some(1));
        assert!(
            rx.try_recv().is_err(),
            "a was sent something it does not need"
        );
        assert_eq!((sessions[&key].generation, sessions[&key].same_as), (1, 2));

        // A carry from a generation the session is not at does not apply.
        assert_eq!(carry_forward(&mut sessions, &key, 1, &v2), None);

        // a-b's rate: a needs it, as a delta from generation 1, its own.
        let mut plan = line3();
        plan.link_mut(1).forward.rate_bps = Some(5_000_000);
        plan.link_mut(0).forward.rate_bps = Some(7_000_000);
        let v3 = view(plan, 3);
        bring_up_to_date(&mut sessions, &key, &v3);
        match rx.try_recv().expect("a delta").expect("ok").msg {
            Some(pb::controller_message::Msg::Delta(d)) => {
                assert_eq!((d.base_generation, d.generation), (1, 3));
                assert_eq!(d.upsert_links.len(), 1, "{d:?}");
            }
            other => panic!("expected a delta, got {other:?}"),
        }
        assert_eq!((sessions[&key].generation, sessions[&key].same_as), (3, 3));

        // A session the hub's generations call behind (its view of the old
        // generation was overtaken, say) but whose config the change left as
        // it was is carried, not sent anything (CI once saw a batch of 20
        // agents sent a route change they did not need).
        let mut plan = line3();
        plan.link_mut(1).forward.rate_bps = Some(9_000_000);
        plan.link_mut(0).forward.rate_bps = Some(7_000_000);
        assert_eq!(
            bring_up_to_date(&mut sessions, &key, &view(plan, 5)),
            Delivery::Carried { sent: 3 }
        );
        assert!(rx.try_recv().is_err(), "a was sent its own config again");
        assert_eq!((sessions[&key].generation, sessions[&key].same_as), (3, 5));
        // Its next real change is a delta from what it runs.
        let mut plan = line3();
        plan.link_mut(1).forward.rate_bps = Some(9_000_000);
        plan.link_mut(0).forward.rate_bps = Some(1_000_000);
        assert_eq!(
            bring_up_to_date(&mut sessions, &key, &view(plan, 6)),
            Delivery::Sent
        );
        match rx.try_recv().expect("a delta").expect("ok").msg {
            Some(pb::controller_message::Msg::Delta(d)) => {
                assert_eq!((d.base_generation, d.generation), (3, 6));
            }
            other => panic!("expected a delta, got {other:?}"),
        }

        // A session held down by a scenario is never carried.
        sessions.get_mut(&key).expect("a").held = true;
        assert_eq!(
            carry_forward(&mut sessions, &key, 6, &with_rate(1, 1, 7)),
            None
        );
    }
}
