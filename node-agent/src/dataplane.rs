//! The dataplane as the controller interface sees it: built from the first
//! snapshot, then changed in place by later ones without dropping connections
//! that stay the same.

use crate::counters::NodeCounters;
use crate::link::{LinkContext, LinkHandle, LinkSpec, Role, Transport};
use crate::listener::{self, LinkMap};
use crate::processor::{Mapping, Outputs, Processors, Routes};
use crate::routing::RouteTable;
use crate::tun_io;
use arc_swap::ArcSwap;
use nextmini_proto::v1 as pb;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

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
    #[error("{0}")]
    Quic(#[from] crate::quic::QuicError),
    #[error("delta from generation {base} does not apply to generation {have}")]
    OutOfOrder { base: u64, have: u64 },
    #[error("a delta arrived before any snapshot")]
    NoSnapshot,
    #[error("{0}")]
    Flows(#[from] crate::synth::task::TaskError),
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
    context: Option<LinkContext>,
    routes: Routes,
    links: LinkMap,
    pub counters: Arc<NodeCounters>,
    generation: u64,
    /// Stream state and generation, for the metrics endpoint.
    agent: Arc<crate::metrics::AgentState>,
    /// The config in force, which deltas are applied to.
    current_links: Vec<pb::LinkConfig>,
    current_routes: pb::RouteTable,
    /// The synthetic flows' stack: started by the first snapshot with flows,
    /// then kept, so flows survive reconnects and later snapshots.
    synth: Option<crate::synth::Synth>,
    synth_slot: crate::synth::SynthSlot,
    /// The SOCKS servers' and the max-mode relay's shared state.
    relay: Arc<crate::relay::Relay>,
    /// SOCKS listeners bound before the agent entered its namespace; served once
    /// the first snapshot has started the dataplane.
    socks_listeners: Vec<(SocketAddr, std::net::TcpListener)>,
    socks_bound: Vec<SocketAddr>,
    /// The node's config from the last snapshot (deltas do not carry it).
    current_node: pb::NodeConfig,
    /// Ask the kernel for TUN offloads (GSO/GRO with virtio-net headers).
    tun_offload: bool,
    /// Where the TUN device is made (the node's namespace).
    node_side: crate::node_side::NodeSide,
    /// Judges every report window's links (fidelity.rs).
    fidelity: crate::fidelity::Guard,
    /// Applies the timed scenario's events at their instants (scenario.rs).
    scenario: crate::scenario::Runner,
}

impl Dataplane {
    pub fn new(topology: String, node: String, tun_name: String) -> Dataplane {
        let routes: Routes = Arc::new(ArcSwap::from_pointee(RouteTable::empty()));
        let relay = Arc::new(crate::relay::Relay::new(routes.clone(), Arc::default()));
        let links: LinkMap = Arc::new(ArcSwap::from_pointee(HashMap::new()));
        Dataplane {
            topology,
            node,
            tun_name,
            identity: None,
            context: None,
            scenario: crate::scenario::Runner::new(links.clone(), routes.clone()),
            routes,
            links,
            counters: Arc::new(NodeCounters::default()),
            generation: 0,
            agent: Arc::default(),
            current_links: Vec::new(),
            current_routes: pb::RouteTable::default(),
            synth: None,
            synth_slot: Arc::default(),
            relay,
            socks_listeners: Vec::new(),
            socks_bound: Vec::new(),
            current_node: pb::NodeConfig::default(),
            tun_offload: true,
            node_side: crate::node_side::NodeSide::here(),
            fidelity: crate::fidelity::Guard::default(),
        }
    }

    /// Whether to ask for TUN offloads; on unless turned off (for comparison
    /// runs, or a kernel that misbehaves with them).
    pub fn with_tun_offload(mut self, offload: bool) -> Dataplane {
        self.tun_offload = offload;
        self
    }

    /// The node's own end (TUN device, connections to its applications) lives
    /// in another namespace than the agent (packed pods).
    pub fn with_node_side(mut self, side: crate::node_side::NodeSide) -> Dataplane {
        self.relay = Arc::new(
            crate::relay::Relay::new(self.routes.clone(), Arc::default())
                .with_node_side(side.clone()),
        );
        self.node_side = side;
        self
    }

    /// SOCKS listeners the agent bound at start (outside its namespace). Their
    /// settings come with the snapshot, which names them by address.
    pub fn with_socks_listeners(
        mut self,
        listeners: Vec<(SocketAddr, std::net::TcpListener)>,
    ) -> Dataplane {
        self.socks_bound = listeners.iter().map(|(a, _)| *a).collect();
        self.socks_listeners = listeners;
        self
    }

    /// The synthetic flows' stack, if this node has had flows.
    pub fn synth(&self) -> Option<&crate::synth::Synth> {
        self.synth.as_ref()
    }

    /// Hands the snapshot's flows to the stack, starting it for the first one.
    fn apply_flows(&mut self, flows: Vec<crate::synth::task::Task>, context: &LinkContext) {
        let Some(identity) = &self.identity else {
            return;
        };
        if flows.is_empty() && self.synth.is_none() {
            return;
        }
        let synth = self.synth.get_or_insert_with(|| {
            crate::synth::Synth::spawn(
                identity.overlay,
                identity.prefix_len,
                u16::try_from(context.mtu).unwrap_or(u16::MAX),
                context.processors.clone(),
                &self.synth_slot,
                self.relay.clone(),
            )
        });
        synth.set_tasks(flows);
    }

    /// The scenario runner: schedules what the hub sends, and hands the
    /// control loop its reports.
    pub fn scenario(&mut self) -> &mut crate::scenario::Runner {
        &mut self.scenario
    }

    /// Schedules a timed scenario's events (before the first snapshot there
    /// are no links to apply them to, and the MTU is not known).
    pub fn schedule_scenario(&mut self, scenario: pb::Scenario) -> Result<(), ApplyError> {
        let mtu = self.context.as_ref().ok_or(ApplyError::NoSnapshot)?.mtu;
        self.scenario.schedule(scenario, mtu);
        Ok(())
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// What the metrics collectors read at scrape time (shared, lock-free).
    pub fn metrics_source(&self) -> crate::metrics::Source {
        crate::metrics::Source {
            links: self.links.clone(),
            node: self.counters.clone(),
            state: self.agent.clone(),
            relay: self.relay.counters.clone(),
        }
    }

    pub async fn apply_snapshot(&mut self, snapshot: pb::Snapshot) -> Result<(), ApplyError> {
        let node = snapshot.node.as_ref().ok_or(ApplyError::NoNode)?;
        let flows = crate::synth::task::parse_all(&snapshot.flows)?;
        let context = self.ensure_started(node).await?;
        self.current_node = node.clone();
        self.apply_config(
            snapshot.links,
            snapshot.routes.unwrap_or_default(),
            snapshot.generation,
            &context,
        )?;
        self.apply_flows(flows, &context);
        Ok(())
    }

    /// Applies a change on top of the config in force. A delta built on another
    /// generation than ours is refused: the caller then asks for a snapshot.
    pub fn apply_delta(&mut self, delta: pb::Delta) -> Result<(), ApplyError> {
        if delta.base_generation != self.generation {
            return Err(ApplyError::OutOfOrder {
                base: delta.base_generation,
                have: self.generation,
            });
        }
        let context = self.context.clone().ok_or(ApplyError::NoSnapshot)?;
        if delta.upsert_links.is_empty() && delta.remove_links.is_empty() && delta.routes.is_none()
        {
            // A change elsewhere in the topology: only the generation moves,
            // and nothing is rebuilt (a thousand agents get one at once).
            self.generation = delta.generation;
            self.agent.set_generation(delta.generation);
            return Ok(());
        }
        let mut links: Vec<pb::LinkConfig> = self
            .current_links
            .iter()
            .filter(|l| {
                !delta.remove_links.contains(&l.name)
                    && !delta.upsert_links.iter().any(|u| u.name == l.name)
            })
            .cloned()
            .collect();
        links.extend(delta.upsert_links);
        let routes = delta.routes.unwrap_or_else(|| self.current_routes.clone());
        self.apply_config(links, routes, delta.generation, &context)
    }

    fn apply_config(
        &mut self,
        links: Vec<pb::LinkConfig>,
        routes: pb::RouteTable,
        generation: u64,
        context: &LinkContext,
    ) -> Result<(), ApplyError> {
        let map = self.build_links(&links, context)?;
        let table = RouteTable::from_proto(&routes, |name| map.get(name).cloned())?;
        let table = self.with_ttl_mode(table)?;
        let view = self.relay_view(&links, &routes)?;
        // Links first, so the listener knows every link the new routes may use;
        // then the routes, in one swap: a flow sees the old table or the new one.
        self.links.store(Arc::new(map));
        // Links the scenario took down stay down (their parameters were
        // already taken from it in `build_links`).
        self.scenario.reassert();
        // With the route events' rules in force on top.
        self.scenario.install_routes(table);
        self.relay.view.store(Arc::new(view));
        self.generation = generation;
        self.agent.set_generation(generation);
        self.current_links = links;
        self.current_routes = routes;
        Ok(())
    }

    /// Applies the node's `ttl` setting to a new table: as a router, the node
    /// answers expired packets from its overlay address.
    fn with_ttl_mode(
        &self,
        table: RouteTable<Arc<LinkHandle>>,
    ) -> Result<RouteTable<Arc<LinkHandle>>, ApplyError> {
        let ttl = self
            .current_node
            .dataplane
            .as_ref()
            .map_or("", |d| d.ttl.as_str());
        match ttl {
            "" | "transparent" => Ok(table),
            "decrement" => {
                let overlay = self
                    .identity
                    .as_ref()
                    .map(|i| i.overlay)
                    .ok_or(ApplyError::NoSnapshot)?;
                Ok(table.with_ttl_decrement(overlay))
            }
            other => Err(invalid(
                "node.dataplane.ttl",
                format!("`{other}` is neither transparent nor decrement"),
            )),
        }
    }

    /// The relays' view of the new config. A SOCKS server the agent has no
    /// listener for cannot be added without a restart (its address is outside
    /// the namespace), so that is an error.
    fn relay_view(
        &self,
        links: &[pb::LinkConfig],
        routes: &pb::RouteTable,
    ) -> Result<crate::relay::View, ApplyError> {
        let overlay = self
            .identity
            .as_ref()
            .map(|i| i.overlay)
            .ok_or(ApplyError::NoSnapshot)?;
        let view = crate::relay::View::build(&self.current_node, overlay, links, routes)
            .map_err(|(field, reason)| invalid(field, reason))?;
        for (i, s) in self.current_node.socks.iter().enumerate() {
            let bound = s
                .listen
                .parse::<SocketAddr>()
                .is_ok_and(|a| self.socks_bound.contains(&a));
            if !bound {
                return Err(invalid(
                    format!("node.socks[{i}].listen"),
                    format!(
                        "this agent was started without a listener on {}; restart the node to serve it",
                        s.listen
                    ),
                ));
            }
        }
        Ok(view)
    }

    /// Per-link counters for the reporter, each with the fidelity guard's
    /// verdict on the window since the last call.
    pub fn link_counters(&mut self) -> Vec<pb::LinkCounters> {
        let links = self.links.load();
        let mut out: Vec<_> = links
            .values()
            .map(|l| l.counters.report(&l.spec.name))
            .collect();
        out.sort_by(|a, b| a.link.cmp(&b.link));
        self.fidelity.judge_report(&mut out);
        for report in &out {
            let Some(link) = links.get(&report.link) else {
                continue;
            };
            let unfaithful = !report.unfaithful.is_empty();
            if link.counters.unfaithful.swap(unfaithful, Relaxed) != unfaithful {
                if unfaithful {
                    tracing::warn!(link = %report.link, peer = %link.spec.peer_node, reason = %report.unfaithful,
                        "the emulator, not the emulated link, limited this link's traffic");
                } else {
                    tracing::info!(link = %report.link, peer = %link.spec.peer_node, "link runs as configured again");
                }
            }
        }
        out
    }

    async fn ensure_started(&mut self, node: &pb::NodeConfig) -> Result<LinkContext, ApplyError> {
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
        if let (Some(current), Some(context)) = (&self.identity, &self.context) {
            if *current != identity {
                return Err(invalid(
                    "node",
                    "the node's addresses changed; restart the agent to apply",
                ));
            }
            return Ok(context.clone());
        }
        let dataplane = node.dataplane.clone().unwrap_or_default();
        let mtu = u16::try_from(dataplane.mtu)
            .ok()
            .filter(|m| *m >= 576)
            .ok_or_else(|| invalid("dataplane.mtu", "must be 576..=65535"))?;
        let mapping = Mapping::parse(&dataplane.mapping)
            .ok_or_else(|| invalid("dataplane.mapping", "must be sequential or concurrent"))?;
        let quic = if node.link_cert_der.is_empty() {
            None
        } else {
            let endpoint =
                crate::quic::endpoint(identity.listen, &node.link_cert_der, &node.link_key_der)?;
            tokio::spawn(listener::run_quic(
                endpoint.clone(),
                self.topology.clone(),
                self.links.clone(),
                crate::link_auth::LinkKey::from_identity(&node.link_key_der),
            ));
            Some(endpoint)
        };
        let device = tun_io::create_on(
            &self.node_side,
            &self.tun_name,
            identity.overlay,
            identity.prefix_len,
            mtu,
            self.tun_offload,
        )
        .await?;
        let local = tun_io::spawn_writer(device.clone(), self.counters.clone());
        let processors = Processors::spawn(
            dataplane.processors,
            mapping,
            Outputs {
                routes: self.routes.clone(),
                local,
                counters: self.counters.clone(),
                synth: self.synth_slot.clone(),
            },
        );
        tun_io::spawn_reader(
            device.clone(),
            processors.clone(),
            mtu,
            self.counters.clone(),
        );
        let tcp = listener::bind(identity.listen).await?;
        tokio::spawn(listener::run_tcp(
            tcp,
            self.topology.clone(),
            self.links.clone(),
            crate::link_auth::LinkKey::from_identity(&node.link_key_der),
        ));
        if let Some(port) = u16::try_from(node.max_port).ok().filter(|p| *p != 0) {
            let addr = SocketAddr::new(identity.listen.ip(), port);
            let max = listener::bind(addr).await?;
            tokio::spawn(crate::maxmode::serve(max, self.relay.clone()));
            tracing::info!(listen = %addr, "max-mode relay started");
        }
        crate::socks::spawn(
            std::mem::take(&mut self.socks_listeners),
            self.relay.clone(),
        )?;
        tracing::info!(node = %self.node, overlay = %identity.overlay, listen = %identity.listen, tun_offload = device.offload, "dataplane started");
        let context = LinkContext {
            processors,
            routes: self.routes.clone(),
            quic,
            mtu: u32::from(mtu),
            auth: crate::link_auth::LinkKey::from_identity(&node.link_key_der),
            seed: node.seed,
        };
        self.identity = Some(identity);
        self.context = Some(context.clone());
        Ok(context)
    }

    /// The new link set: links whose connection identity is unchanged keep their
    /// handle and connection (new parameters are applied in place); new ones are
    /// spawned; the rest stop when their last handle (held by the old map and
    /// route table) is dropped. Everything is checked before anything changes.
    fn build_links(
        &self,
        configs: &[pb::LinkConfig],
        context: &LinkContext,
    ) -> Result<HashMap<String, Arc<LinkHandle>>, ApplyError> {
        let current = self.links.load();
        let mut planned = Vec::with_capacity(configs.len());
        for (i, c) in configs.iter().enumerate() {
            let field = |f: &str| format!("links[{i}].{f}");
            let transport = match c.transport.as_str() {
                "" | "tcp" => Transport::Tcp,
                "quic" if context.quic.is_some() => Transport::Quic,
                "quic" => {
                    return Err(invalid(
                        field("transport"),
                        "quic needs the topology's link certificate, which the snapshot lacks",
                    ));
                }
                other => {
                    return Err(invalid(
                        field("transport"),
                        format!("{other:?} is not tcp or quic"),
                    ));
                }
            };
            let role = match pb::LinkRole::try_from(c.role) {
                Ok(pb::LinkRole::Dial) => Role::Dial {
                    peer: host_port(&c.peer_addr).map_err(|e| invalid(field("peerAddr"), e))?,
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
                transport,
            };
            // The config carries the stored parameters; what a timed scenario
            // set since stays in force.
            let params = self
                .scenario
                .params_for(&c.name)
                .unwrap_or_else(|| c.params.clone().unwrap_or_default());
            crate::sched::Pipeline::<crate::link::Outbound>::new(&params, context.mtu, 0)
                .map_err(|e| invalid(field(&format!("params.{}", e.field)), e.reason.clone()))?;
            planned.push((spec, params));
        }
        let mut next = HashMap::with_capacity(planned.len());
        for (spec, params) in planned {
            let handle = match current.get(&spec.name) {
                Some(h) if h.spec == spec => {
                    h.set_params(params, context.mtu).map_err(|e| {
                        invalid(
                            format!("links.{}.params.{}", spec.name, e.field),
                            e.reason.clone(),
                        )
                    })?;
                    h.clone()
                }
                _ => LinkHandle::spawn(spec.clone(), params, context.clone()).map_err(|e| {
                    invalid(
                        format!("links.{}.params.{}", spec.name, e.field),
                        e.reason.clone(),
                    )
                })?,
            };
            next.insert(spec.name, handle);
        }
        Ok(next)
    }
}

/// Checks `host:port` without resolving it: the host may be a name that only
/// resolves once the peer's pod exists.
fn host_port(addr: &str) -> Result<String, String> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| format!("{addr:?} is not host:port"))?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!("{addr:?} is not host:port"));
    }
    Ok(addr.to_string())
}
