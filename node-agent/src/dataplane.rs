//! The dataplane as the controller interface sees it: built from the first
//! snapshot, then changed in place by later ones without dropping connections
//! that stay the same.

use crate::counters::NodeCounters;
use crate::link::{LinkHandle, LinkSpec, Role};
use crate::listener::{self, LinkMap};
use crate::processor::{Processors, Routes};
use crate::routing::RouteTable;
use crate::tun_io;
use arc_swap::ArcSwap;
use nextmini_proto::v1 as pb;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("snapshot has no node config")]
    NoNode,
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("routes: {0}")]
    Routes(#[from] crate::routing::RouteError),
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ApplyError {
    ApplyError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// What the first snapshot fixed: changing it needs a new agent.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    overlay: Ipv4Addr,
    prefix_len: u8,
    listen: SocketAddr,
}

pub struct Dataplane {
    topology: String,
    node: String,
    tun_name: String,
    identity: Option<Identity>,
    processors: Option<Processors>,
    routes: Routes,
    links: LinkMap,
    pub counters: Arc<NodeCounters>,
    generation: u64,
}

impl Dataplane {
    pub fn new(topology: String, node: String, tun_name: String) -> Dataplane {
        Dataplane {
            topology,
            node,
            tun_name,
            identity: None,
            processors: None,
            routes: Arc::new(ArcSwap::from_pointee(RouteTable::empty())),
            links: Arc::new(ArcSwap::from_pointee(HashMap::new())),
            counters: Arc::new(NodeCounters::default()),
            generation: 0,
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub async fn apply_snapshot(&mut self, snapshot: pb::Snapshot) -> Result<(), ApplyError> {
        let node = snapshot.node.as_ref().ok_or(ApplyError::NoNode)?;
        let processors = self.ensure_started(node).await?;
        let links = self.build_links(&snapshot.links, &processors)?;
        let table = match &snapshot.routes {
            Some(r) => RouteTable::from_proto(r, |name| links.get(name).cloned())?,
            None => RouteTable::empty(),
        };
        // Links first, so the listener knows every link the new routes may use;
        // then the routes, in one swap: a flow sees the old table or the new one.
        self.links.store(Arc::new(links));
        self.routes.store(Arc::new(table));
        self.generation = snapshot.generation;
        Ok(())
    }

    /// Per-link counters for the reporter.
    pub fn link_counters(&self) -> Vec<pb::LinkCounters> {
        let links = self.links.load();
        let mut out: Vec<_> = links
            .values()
            .map(|l| l.counters.snapshot(&l.spec.name))
            .collect();
        out.sort_by(|a, b| a.link.cmp(&b.link));
        out
    }

    async fn ensure_started(&mut self, node: &pb::NodeConfig) -> Result<Processors, ApplyError> {
        let identity = Identity {
            overlay: node
                .overlay_addr
                .parse()
                .map_err(|e| invalid("node.overlayAddr", format!("{e}")))?,
            prefix_len: u8::try_from(node.overlay_prefix_len)
                .ok()
                .filter(|p| *p <= 32)
                .ok_or_else(|| invalid("node.overlayPrefixLen", "must be 0..=32"))?,
            listen: node
                .listen_addr
                .parse()
                .map_err(|e| invalid("node.listenAddr", format!("{e}")))?,
        };
        if let (Some(current), Some(processors)) = (&self.identity, &self.processors) {
            if *current != identity {
                return Err(invalid(
                    "node",
                    "the node's addresses changed; restart the agent to apply",
                ));
            }
            return Ok(processors.clone());
        }
        let dataplane = node.dataplane.clone().unwrap_or_default();
        let mtu = u16::try_from(dataplane.mtu)
            .ok()
            .filter(|m| *m >= 576)
            .ok_or_else(|| invalid("dataplane.mtu", "must be 576..=65535"))?;
        let device = tun_io::create(&self.tun_name, identity.overlay, identity.prefix_len, mtu)?;
        let tun_tx = tun_io::spawn_writer(device.clone(), self.counters.clone());
        let processors = Processors::spawn(
            dataplane.processors,
            self.routes.clone(),
            tun_tx,
            self.counters.clone(),
        );
        tun_io::spawn_reader(device, processors.clone(), mtu, self.counters.clone());
        let tcp = listener::bind(identity.listen).await?;
        tokio::spawn(listener::run(
            tcp,
            self.topology.clone(),
            self.links.clone(),
        ));
        tracing::info!(node = %self.node, overlay = %identity.overlay, listen = %identity.listen, "dataplane started");
        self.identity = Some(identity);
        self.processors = Some(processors.clone());
        Ok(processors)
    }

    /// The new link set: links whose spec is unchanged keep their handle (and
    /// connection); new ones are spawned; the rest stop when their last handle
    /// (held by the old map and route table) is dropped.
    fn build_links(
        &self,
        configs: &[pb::LinkConfig],
        processors: &Processors,
    ) -> Result<HashMap<String, Arc<LinkHandle>>, ApplyError> {
        let current = self.links.load();
        let mut next = HashMap::with_capacity(configs.len());
        for (i, c) in configs.iter().enumerate() {
            let field = |f: &str| format!("links[{i}].{f}");
            if c.transport != "tcp" {
                return Err(invalid(
                    field("transport"),
                    format!(
                        "{:?} is not supported by this agent (tcp only)",
                        c.transport
                    ),
                ));
            }
            let role = match pb::LinkRole::try_from(c.role) {
                Ok(pb::LinkRole::Dial) => Role::Dial {
                    peer: c
                        .peer_addr
                        .parse()
                        .map_err(|e| invalid(field("peerAddr"), format!("{e}")))?,
                },
                Ok(pb::LinkRole::Accept) => Role::Accept,
                _ => return Err(invalid(field("role"), "must be dial or accept")),
            };
            let spec = LinkSpec {
                topology: self.topology.clone(),
                name: c.name.clone(),
                local_node: self.node.clone(),
                peer_node: c.peer_node.clone(),
                role,
            };
            let handle = match current.get(&c.name) {
                Some(h) if h.spec == spec => h.clone(),
                _ => LinkHandle::spawn(spec, processors.clone()),
            };
            next.insert(c.name.clone(), handle);
        }
        Ok(next)
    }
}
