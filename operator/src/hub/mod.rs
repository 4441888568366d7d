//! The control hub: one persistent gRPC bidi stream per agent. On Hello it checks
//! the agent's credential and sends a full snapshot; when the topology's desired
//! state changes (a NOTIFY from PostgreSQL) it sends every connected agent of that
//! topology its new snapshot; it stores acknowledgements and counters.

mod batcher;
mod params;
mod snapshot;

pub use snapshot::TopologyView;

use crate::store::{CounterRow, Store, TOPOLOGY_CHANNEL};
use batcher::CounterBatcher;
use nextmini_proto::v1 as pb;
use pb::control_server::{Control, ControlServer};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Mutex, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// Default interval at which agents report counters.
pub const REPORT_INTERVAL_MS: u32 = 1000;
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

type SessionKey = (String, String);

struct SessionEntry {
    id: u64,
    tx: mpsc::Sender<Result<pb::ControllerMessage, Status>>,
}

#[derive(Clone)]
pub struct Hub {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    counters: CounterBatcher,
    views: Mutex<HashMap<String, Arc<TopologyView>>>,
    sessions: Mutex<HashMap<SessionKey, SessionEntry>>,
    next_session: AtomicU64,
}

impl Hub {
    pub fn new(store: Store) -> Hub {
        let counters = CounterBatcher::spawn(store.clone());
        Hub {
            inner: Arc::new(Inner {
                store,
                counters,
                views: Mutex::new(HashMap::new()),
                sessions: Mutex::new(HashMap::new()),
                next_session: AtomicU64::new(1),
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
        let listener = tokio::net::UnixListener::bind(path)?;
        set_owner_only(path)?;
        tokio::spawn(self.clone().watch_changes());
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(5)))
            .http2_keepalive_timeout(Some(Duration::from_secs(5)))
            .add_service(ControlServer::new(self))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                shutdown,
            )
            .await?;
        Ok(())
    }

    /// The topology's view at its current generation, rebuilt only when the
    /// generation moved: a thousand agents connecting at once share one plan load.
    async fn view(&self, topology: &str) -> Result<Option<Arc<TopologyView>>, Status> {
        let unavailable = |e: crate::store::StoreError| Status::unavailable(e.to_string());
        let Some(generation) = self
            .inner
            .store
            .generation(topology)
            .await
            .map_err(unavailable)?
        else {
            self.inner.views.lock().await.remove(topology);
            return Ok(None);
        };
        let mut views = self.inner.views.lock().await;
        if let Some(v) = views.get(topology).filter(|v| v.generation == generation) {
            return Ok(Some(v.clone()));
        }
        let Some((plan, generation)) = self
            .inner
            .store
            .load_plan(topology)
            .await
            .map_err(unavailable)?
        else {
            views.remove(topology);
            return Ok(None);
        };
        let mut view = TopologyView::new(plan, generation);
        view.identity = self
            .inner
            .store
            .link_identity(topology)
            .await
            .map_err(unavailable)?;
        let view = Arc::new(view);
        views.insert(topology.to_string(), view.clone());
        Ok(Some(view))
    }

    /// LISTENs for committed changes and pushes fresh snapshots to the agents of
    /// the changed topology. After a lost connection every session is resent its
    /// snapshot, since notifications may have been missed meanwhile.
    async fn watch_changes(self) {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.listen_once().await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "topology change listener failed; reconnecting");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    let topologies: Vec<String> = {
                        let sessions = self.inner.sessions.lock().await;
                        let mut t: Vec<String> = sessions.keys().map(|k| k.0.clone()).collect();
                        t.dedup();
                        t
                    };
                    for t in topologies {
                        self.push_snapshots(&t).await;
                    }
                }
            }
        }
    }

    async fn listen_once(&self) -> Result<(), sqlx::Error> {
        let mut listener =
            sqlx::postgres::PgListener::connect_with(self.inner.store.pool()).await?;
        listener.listen(TOPOLOGY_CHANNEL).await?;
        loop {
            let n = listener.recv().await?;
            self.push_snapshots(n.payload()).await;
        }
    }

    async fn push_snapshots(&self, topology: &str) {
        let view = match self.view(topology).await {
            Ok(Some(v)) => v,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(%topology, error = %e, "cannot load changed topology");
                return;
            }
        };
        let sessions = self.inner.sessions.lock().await;
        for ((t, node), entry) in sessions.iter() {
            if t != topology {
                continue;
            }
            let msg = match view.snapshot(node, REPORT_INTERVAL_MS) {
                Some(s) => pb::controller_message::Msg::Snapshot(s),
                None => pb::controller_message::Msg::Reject(pb::Reject {
                    reason: format!("node {node} is no longer part of topology {topology}"),
                }),
            };
            if entry
                .tx
                .try_send(Ok(pb::ControllerMessage { msg: Some(msg) }))
                .is_err()
            {
                tracing::warn!(%topology, %node, "session queue full; agent will resync on reconnect");
            }
        }
    }

    async fn authenticate(&self, hello: &pb::Hello) -> Result<i64, Status> {
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
                Status::not_found(format!(
                    "topology {} has no node {}",
                    hello.topology, hello.node
                ))
            })?;
        let presented = hex::encode(Sha256::digest(hello.credential.as_bytes()));
        if presented != identity.credential_sha256 {
            return Err(Status::unauthenticated("bad credential"));
        }
        Ok(identity.topology_id)
    }

    async fn run_session(
        self,
        id: u64,
        key: SessionKey,
        topology_id: i64,
        mut inbound: Streaming<pb::AgentMessage>,
    ) {
        let (topology, node) = &key;
        let mut last_sequence = 0u64;
        loop {
            let msg = match inbound.message().await {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => {
                    tracing::info!(%topology, %node, error = %e, "agent stream ended");
                    break;
                }
            };
            match msg.msg {
                Some(pb::agent_message::Msg::Ack(ack)) => {
                    if !ack.error.is_empty() {
                        tracing::warn!(%topology, %node, generation = ack.generation, error = %ack.error, "agent rejected config");
                        continue;
                    }
                    if let Err(e) = self
                        .inner
                        .store
                        .record_ack(topology_id, node, ack.generation as i64)
                        .await
                    {
                        tracing::warn!(error = %e, "storing ack failed");
                    }
                }
                Some(pb::agent_message::Msg::Report(report)) => {
                    // A report replayed after a reconnect carries an old sequence.
                    if report.sequence != 0 && report.sequence <= last_sequence {
                        continue;
                    }
                    last_sequence = report.sequence;
                    let rows = report
                        .links
                        .into_iter()
                        .map(|l| CounterRow {
                            topology_id,
                            node: node.clone(),
                            link: l.link,
                            connected: l.connected,
                            tx_bytes: l.tx_bytes,
                            tx_packets: l.tx_packets,
                            rx_bytes: l.rx_bytes,
                            rx_packets: l.rx_packets,
                            drops: l.drops,
                            connects: l.connects,
                            drops_queue: l.drops_queue,
                            drops_aqm: l.drops_aqm,
                            drops_loss: l.drops_loss,
                            ecn_marks: l.ecn_marks,
                            queue_packets: l.queue_packets,
                            queue_bytes: l.queue_bytes,
                        })
                        .collect();
                    self.inner.counters.push(rows).await;
                }
                Some(pb::agent_message::Msg::Hello(_)) => {
                    tracing::warn!(%topology, %node, "second Hello on one stream ignored");
                }
                None => {}
            }
        }
        let mut sessions = self.inner.sessions.lock().await;
        // A newer session of the same agent may have replaced this one already.
        if sessions.get(&key).is_some_and(|e| e.id == id) {
            sessions.remove(&key);
            drop(sessions);
            if let Err(e) = self
                .inner
                .store
                .set_agent_state(topology_id, node, "disconnected")
                .await
            {
                tracing::warn!(error = %e, "marking agent disconnected failed");
            }
        }
    }
}

#[tonic::async_trait]
impl Control for Hub {
    type SessionStream = ReceiverStream<Result<pb::ControllerMessage, Status>>;

    async fn session(
        &self,
        request: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
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
        let topology_id = self.authenticate(&hello).await?;
        let view = self
            .view(&hello.topology)
            .await?
            .ok_or_else(|| Status::not_found(format!("no topology {}", hello.topology)))?;
        let snapshot = view
            .snapshot(&hello.node, REPORT_INTERVAL_MS)
            .ok_or_else(|| Status::not_found(format!("no node {}", hello.node)))?;

        // Deep enough for a burst of snapshots; a session that falls further
        // behind is resynced by its next reconnect.
        let (tx, rx) = mpsc::channel(16);
        let snapshot_msg = pb::ControllerMessage {
            msg: Some(pb::controller_message::Msg::Snapshot(snapshot)),
        };
        tx.send(Ok(snapshot_msg))
            .await
            .map_err(|_| Status::internal("session closed"))?;
        let id = self.inner.next_session.fetch_add(1, Ordering::Relaxed);
        let key = (hello.topology.clone(), hello.node.clone());
        self.inner
            .sessions
            .lock()
            .await
            .insert(key.clone(), SessionEntry { id, tx });
        if let Err(e) = self
            .inner
            .store
            .set_agent_state(topology_id, &hello.node, "connected")
            .await
        {
            tracing::warn!(error = %e, "marking agent connected failed");
        }
        tracing::info!(topology = %hello.topology, node = %hello.node, pid = hello.pid, "agent connected");
        tokio::spawn(self.clone().run_session(id, key, topology_id, inbound));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

fn set_owner_only(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}
