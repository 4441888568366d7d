//! Builds an agent's snapshot from the plan: pure, so it is tested without a hub.

use crate::plan::{
    FlowAmount, FlowProtocol, LINK_PORT, MAX_PORT, Mapping, Plan, RelayMode, Transport,
};
use crate::store::{RouteRow, RouteRuleRow};
use nextmini_proto::v1 as pb;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// A topology's desired state with its routes, computed once per generation and
/// shared by every agent's snapshot.
pub struct TopologyView {
    /// The creation of the topology this view is of (its row id): a name
    /// deleted and applied again starts at generation 1 again.
    pub topology_id: i64,
    pub generation: i64,
    /// The generation at which the stored plan (everything but routes) last
    /// changed: a view whose predecessor has the same one shares its plan
    /// and everything computed from it.
    pub plan_generation: i64,
    pub plan: Arc<Plan>,
    /// Per node (by index), its next hops as runs over destination indices;
    /// shared with the previous view when the graph did not change.
    hops: Arc<Vec<Vec<crate::plan::HopRun>>>,
    /// The topology's link certificate and key, handed to every agent.
    pub identity: Option<crate::store::LinkIdentity>,
    /// Explicit routes that follow the topology's links: route id → (path, the
    /// link names along it).
    routes: BTreeMap<u32, (Vec<String>, Vec<String>)>,
    /// Route rules whose route is valid, most specific first.
    rules: Vec<RouteRuleRow>,
    /// How agents reach each other's link listeners.
    pub underlay: Underlay,
    /// Nodes dialed elsewhere than `underlay` says (recorded by the
    /// controller: a node in a member cluster, or one accepting a link from
    /// another cluster), by name. Changes move the plan generation.
    pub endpoints: Arc<HashMap<String, String>>,
    /// Node name → position in `plan.nodes`: a snapshot looks up every
    /// destination, and a linear search made serving 1,000 agents cubic (half
    /// the hub's time on a change, by perf).
    nodes: Arc<HashMap<String, usize>>,
    /// Each node's overlay address as text, in `plan.nodes` order.
    overlays: Arc<Vec<String>>,
    /// The link between two nodes (by position, the lower first) as its
    /// position in `plan.links`, the lowest name where links are parallel:
    /// checking a stored route's path built the whole graph per route, 5 ms
    /// each at 10,000 nodes, on every change.
    ends: Arc<HashMap<(u32, u32), u32>>,
    /// Node indices whose overlay address does not follow the previous
    /// node's (ascending): a destination range cannot cross one.
    overlay_breaks: Arc<Vec<u32>>,
    /// Stored routes this view could not take as written, and what runs instead.
    route_problems: Vec<crate::store::TopologyProblem>,
    /// The same for the plan's rows (nodes, links, flows): a view sharing the
    /// plan shares these.
    pub plan_problems: Vec<crate::store::TopologyProblem>,
    /// When this view is the view at generation `.0` with only the links
    /// named in `.1` changed in place: the nodes a change touches are then
    /// their ends, found without comparing every link and node.
    links_changed: Option<(i64, Vec<String>)>,
    /// Made from an earlier view and the rows a change stamped, not from
    /// every stored row (checked against them later: `hub/verify.rs`).
    built_in_part: bool,
}

/// The loop guard agents apply, in links a packet may cross. A path that visits
/// no node twice (every planned path and every stored route) crosses at most
/// `nodes − 1` links, so the node count never cuts one, whatever the topology's
/// shape; a packet in a real loop dies within one trip around the topology. Never
/// below 64, the fixed guard this replaces, so small topologies gain no new drops.
/// A 16-bit count on the wire caps it: only a line of more than 65,535 nodes
/// could have a path the guard cuts.
pub fn hop_limit(nodes: usize) -> u32 {
    u32::try_from(nodes).map_or(u32::from(u16::MAX), |n| n.clamp(64, u32::from(u16::MAX)))
}

/// Reports a second that a topology's idle agents send the hub in all, at
/// most (see [`idle_report_interval_ms`]).
const IDLE_REPORTS_PER_SECOND: u64 = 200;
/// However large the topology, an idle agent reports at least this often.
const IDLE_REPORT_MAX_MS: u64 = 30_000;

/// How often an agent whose report would say nothing new reports anyway: the
/// report interval for a topology small enough that its idle agents stay
/// within [`IDLE_REPORTS_PER_SECOND`], longer for a larger one (5 s at 1,000
/// nodes, 30 s from 6,000). Agents with news report every interval.
pub fn idle_report_interval_ms(report_interval_ms: u32, nodes: usize) -> u32 {
    let spread = (nodes as u64).saturating_mul(1000) / IDLE_REPORTS_PER_SECOND;
    let interval = u64::from(report_interval_ms);
    u32::try_from(spread.min(IDLE_REPORT_MAX_MS).max(interval)).unwrap_or(u32::MAX)
}

/// Where an agent's link listener is reachable.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Underlay {
    /// Local mode: the planned underlay address on the topology's bridge.
    #[default]
    Bridge,
    /// Pods: a DNS name per node through the topology's headless Service
    /// (`<node>.<service>.<namespace>.svc`), resolved by the dialer at each
    /// attempt, since a recreated pod gets a new address.
    PodDns { service: String, namespace: String },
    /// Packed pods: every node's links and relay listen in its worker pod, on
    /// ports of the node's own, reached through the worker's DNS name.
    Packed {
        service: String,
        namespace: String,
        packing: crate::plan::Packing,
    },
}

impl Underlay {
    fn peer_addr(&self, peer: &crate::plan::PlannedNode) -> String {
        match self {
            Underlay::Bridge => format!("{}:{LINK_PORT}", peer.underlay),
            Underlay::PodDns { service, namespace } => {
                format!("{}.{service}.{namespace}.svc:{LINK_PORT}", peer.name)
            }
            Underlay::Packed {
                service,
                namespace,
                packing,
            } => {
                let seat = packing.seat(peer.index);
                let host = crate::runtime::pods::worker_hostname(seat.worker);
                format!("{host}.{service}.{namespace}.svc:{}", seat.link_port())
            }
        }
    }

    fn listen_addr(&self, me: &crate::plan::PlannedNode) -> String {
        match self {
            Underlay::Bridge => format!("{}:{LINK_PORT}", me.underlay),
            Underlay::PodDns { .. } => format!("0.0.0.0:{LINK_PORT}"),
            Underlay::Packed { packing, .. } => {
                format!("0.0.0.0:{}", packing.seat(me.index).link_port())
            }
        }
    }

    /// Agents find a neighbour's relay at the same distance from its link
    /// port as their own (`relay.rs`), so this stays one above the link port.
    fn max_port(&self, me: &crate::plan::PlannedNode) -> u16 {
        match self {
            Underlay::Packed { packing, .. } => packing.seat(me.index).relay_port(),
            _ => MAX_PORT,
        }
    }
}

/// See [`TopologyView::ends`]. Links naming unknown nodes are left out, as
/// the planner's graph leaves them out.
fn link_ends(plan: &Plan, nodes: &HashMap<String, usize>) -> HashMap<(u32, u32), u32> {
    let mut ends: HashMap<(u32, u32), u32> = HashMap::with_capacity(plan.links.len());
    for (i, l) in plan.links.iter().enumerate() {
        let (Some(&a), Some(&b)) = (nodes.get(&l.dialer), nodes.get(&l.acceptor)) else {
            continue;
        };
        let key = ((a.min(b)) as u32, (a.max(b)) as u32);
        let lower = |j: u32| plan.links.get(j as usize).is_none_or(|o| l.name < o.name);
        match ends.get(&key) {
            Some(&j) if !lower(j) => {}
            _ => {
                ends.insert(key, i as u32);
            }
        }
    }
    ends
}

fn socks_listener(s: &crate::plan::PlannedSocks) -> pb::SocksListener {
    pb::SocksListener {
        listen: s.listen.to_string(),
        mode: match s.mode {
            RelayMode::Normal => pb::RelayMode::Normal as i32,
            RelayMode::Max => pb::RelayMode::Max as i32,
        },
        users: s
            .users
            .iter()
            .map(|u| pb::SocksUser {
                name: u.name.clone(),
                // Validated hex from the planner; a corrupt row logs in with nothing.
                password_sha256: hex::decode(&u.password_sha256).unwrap_or_default(),
            })
            .collect(),
    }
}

impl TopologyView {
    pub fn new(plan: Plan, generation: i64) -> TopologyView {
        TopologyView::after(plan, generation, None)
    }

    /// The view of `plan`, taking the next-hop table from `previous` (the
    /// last view of the same creation) when the graph is the same: a change
    /// of link parameters or routes then costs no all-pairs search, which took
    /// 30-40 ms at 1,000 nodes of a change's 50 ms to its first agent.
    pub fn after(plan: Plan, generation: i64, previous: Option<&TopologyView>) -> TopologyView {
        let hops = match previous.filter(|p| crate::plan::same_graph(&p.plan, &plan)) {
            Some(p) => p.hops.clone(),
            None => Arc::new(crate::plan::next_hop_runs(&plan)),
        };
        let nodes = Arc::new(
            plan.nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.name.clone(), i))
                .collect(),
        );
        let ends = match previous.filter(|p| Arc::ptr_eq(&p.hops, &hops)) {
            // The same graph, and links are sorted by name in both plans.
            Some(p) => p.ends.clone(),
            None => Arc::new(link_ends(&plan, &nodes)),
        };
        let overlays = Arc::new(plan.nodes.iter().map(|n| n.overlay.to_string()).collect());
        let overlay_breaks = plan
            .nodes
            .windows(2)
            .enumerate()
            .filter(|(_, pair)| {
                u32::from(pair[0].overlay).checked_add(1) != Some(u32::from(pair[1].overlay))
            })
            .map(|(i, _)| i as u32 + 1)
            .collect();
        TopologyView {
            topology_id: 0,
            generation,
            plan_generation: generation,
            plan: Arc::new(plan),
            hops,
            identity: None,
            routes: BTreeMap::new(),
            rules: Vec::new(),
            underlay: Underlay::Bridge,
            endpoints: Arc::default(),
            nodes,
            overlays,
            ends,
            overlay_breaks: Arc::new(overlay_breaks),
            route_problems: Vec::new(),
            plan_problems: Vec::new(),
            links_changed: None,
            built_in_part: false,
        }
    }

    /// A view at `generation` of the same plan as `previous` (only routes or
    /// rules changed since): the plan, what was computed from it and its
    /// problems are shared, not loaded and computed again. Routes are added
    /// with [`TopologyView::with_routes`] as for any view.
    pub fn same_plan_as(previous: &TopologyView, generation: i64) -> TopologyView {
        TopologyView {
            topology_id: previous.topology_id,
            generation,
            plan_generation: previous.plan_generation,
            plan: previous.plan.clone(),
            hops: previous.hops.clone(),
            identity: previous.identity.clone(),
            routes: BTreeMap::new(),
            rules: Vec::new(),
            underlay: previous.underlay.clone(),
            endpoints: previous.endpoints.clone(),
            nodes: previous.nodes.clone(),
            overlays: previous.overlays.clone(),
            ends: previous.ends.clone(),
            overlay_breaks: previous.overlay_breaks.clone(),
            route_problems: Vec::new(),
            plan_problems: previous.plan_problems.clone(),
            links_changed: None,
            built_in_part: true,
        }
    }

    /// A view at `generation` of `previous`'s plan with the links an UPDATE
    /// changed in place since (their parameters or transport: a link's name
    /// and ends cannot change live, so the graph and everything computed from
    /// it are shared). A changed row that breaks the rules runs its last good
    /// state from `previous`, as in a full load ([`super::repair`]).
    pub fn with_links_changed(
        previous: &TopologyView,
        generation: i64,
        changed: crate::store::ChangedLinks,
    ) -> TopologyView {
        let mut plan = (*previous.plan).clone();
        let names: Vec<String> = changed.links.iter().map(|l| l.name.clone()).collect();
        for link in changed.links {
            // Always found: the same creation, and links never come or go in place.
            if let Some(slot) = plan.links.iter_mut().find(|l| l.name == link.name) {
                *slot = Arc::new(link);
            }
        }
        let problems = super::repair::put_back(&mut plan, &changed.faults, Some(previous));
        let mut view = TopologyView::same_plan_as(previous, generation);
        view.plan = Arc::new(plan);
        // A changed row's earlier problems are replaced by what it has now.
        let subjects: Vec<String> = names.iter().map(|n| format!("links {n} ")).collect();
        view.plan_problems
            .retain(|p| !subjects.iter().any(|s| p.subject.starts_with(s.as_str())));
        view.plan_problems.extend(problems);
        view.links_changed = Some((previous.generation, names));
        view
    }

    /// Whether this view is of `other`'s creation and a later generation.
    pub fn overtakes(&self, other: &TopologyView) -> bool {
        self.topology_id == other.topology_id && self.generation > other.generation
    }

    /// Whether this view was made from an earlier one and the rows a change
    /// stamped ([`TopologyView::same_plan_as`],
    /// [`TopologyView::with_links_changed`]) rather than from every stored row.
    pub fn built_in_part(&self) -> bool {
        self.built_in_part
    }

    /// The links changed in place since `old`, when this view was made from
    /// `old` by [`TopologyView::with_links_changed`].
    fn links_changed_since(&self, old: &TopologyView) -> Option<&[String]> {
        match &self.links_changed {
            Some((since, names))
                if *since == old.generation && self.topology_id == old.topology_id =>
            {
                Some(names)
            }
            _ => None,
        }
    }

    /// Stored rows this view could not take as written, and what runs
    /// instead: routes first, then the plan's rows.
    pub fn problems(&self) -> Vec<crate::store::TopologyProblem> {
        self.route_problems
            .iter()
            .chain(&self.plan_problems)
            .cloned()
            .collect()
    }

    /// The links along `path`, or `None` when it names an unknown node or
    /// steps between nodes no link joins ([`crate::plan::path_links`]'s
    /// answer, from this view's tables).
    fn path_links(&self, path: &[String]) -> Option<Vec<String>> {
        let at: Vec<u32> = path
            .iter()
            .map(|n| self.nodes.get(n).map(|&i| i as u32))
            .collect::<Option<_>>()?;
        if at.is_empty() {
            return None;
        }
        at.windows(2)
            .map(|pair| {
                let key = (pair[0].min(pair[1]), pair[0].max(pair[1]));
                let &link = self.ends.get(&key)?;
                Some(self.plan.links.get(link as usize)?.name.clone())
            })
            .collect()
    }

    /// A node of the plan with its overlay address as text, by name.
    fn node(&self, name: &str) -> Option<(&crate::plan::PlannedNode, &str)> {
        let &i = self.nodes.get(name)?;
        Some((self.plan.nodes.get(i)?, self.overlays.get(i)?.as_str()))
    }

    /// Whether a change from `old` can have changed a snapshot only for the
    /// nodes `affected_nodes` names: everything but the links is the same
    /// (nodes, pools, dataplane, flows, report interval), and so are the
    /// shortest-path tables, the link identity, the underlay and the
    /// recorded endpoints. Then every
    /// other agent needs only the new generation number.
    pub fn same_outside_affected(&self, old: &TopologyView) -> bool {
        // Spelt out field by field, so that a field added to `Plan` has to be
        // placed here (or among those `affected_nodes` covers).
        let Plan {
            topology,
            overlay,
            underlay,
            placement,
            dataplane,
            report_interval_ms,
            seed,
            // Sent apart from snapshots, once the run starts (hub/scenario.rs).
            scenario: _,
            nodes,
            links: _,
            flows,
        } = &*self.plan;
        let o = &old.plan;
        // A shared plan is the same plan, and so is one that differs from
        // `old`'s by links changed in place (those are `affected_nodes`'); the
        // comparison is for one loaded again.
        let same_plan = Arc::ptr_eq(&self.plan, &old.plan)
            || self.links_changed_since(old).is_some()
            || (*topology == o.topology
                && *overlay == o.overlay
                && *underlay == o.underlay
                && *placement == o.placement
                && *dataplane == o.dataplane
                && *report_interval_ms == o.report_interval_ms
                && *seed == o.seed
                && *nodes == o.nodes
                && *flows == o.flows);
        same_plan
            && self.same_hops(old)
            && self.identity == old.identity
            && self.underlay == old.underlay
            && self.endpoints == old.endpoints
    }

    /// Whether every node's next hop to every node is the same link (by
    /// name: link indices move when links come and go) as in `old`. Node
    /// indices are compared as they are: `same_outside_affected` also needs
    /// the same nodes.
    fn same_hops(&self, old: &TopologyView) -> bool {
        fn link(view: &TopologyView, i: u32) -> Option<&str> {
            view.plan.links.get(i as usize).map(|l| l.name.as_str())
        }
        // Runs merge destinations by link index, and equal indices name equal
        // links within one view: the same runs by name are the same table.
        if Arc::ptr_eq(&self.hops, &old.hops) {
            return true;
        }
        self.hops.len() == old.hops.len()
            && self.hops.iter().zip(old.hops.iter()).all(|(mine, theirs)| {
                mine.len() == theirs.len()
                    && mine.iter().zip(theirs).all(|(m, t)| {
                        m.first == t.first
                            && (m.link == t.link && m.link >= crate::plan::UNREACHABLE
                                || link(self, m.link).is_some()
                                    && link(self, m.link) == link(old, t.link))
                    })
            })
    }

    /// Adds the stored routes and rules. A route that does not follow the
    /// topology's links (a row the database's checks would refuse) keeps the
    /// path it had in `old`, the last good view, if that path still follows
    /// them, and is otherwise left out; either way it is listed in `problems()`.
    pub fn with_routes(
        mut self,
        routes: Vec<RouteRow>,
        rules: Vec<RouteRuleRow>,
        old: Option<&TopologyView>,
    ) -> TopologyView {
        for r in routes {
            if let Some(links) = self.path_links(&r.path) {
                self.routes.insert(r.id, (r.path, links));
                continue;
            }
            let kept = old
                .and_then(|o| o.routes.get(&r.id))
                .and_then(|(path, _)| self.path_links(path).map(|l| (path.clone(), l)));
            let consequence = match &kept {
                Some((path, _)) => format!("runs its last good path {}", path.join("-")),
                None => "is left out: the traffic of its rules takes the shortest path".into(),
            };
            tracing::warn!(topology = %self.plan.topology, route = %r.name, path = ?r.path, %consequence, "route does not follow the topology's links");
            self.route_problems.push(crate::store::TopologyProblem {
                subject: format!("routes {} path", r.name),
                problem: format!(
                    "path: {} does not follow the topology's links",
                    r.path.join("-")
                ),
                consequence,
            });
            if let Some(kept) = kept {
                self.routes.insert(r.id, kept);
            }
        }
        let mut rules: Vec<RouteRuleRow> = rules
            .into_iter()
            .filter(|r| {
                self.routes.get(&r.route_id).is_some_and(|(path, _)| {
                    path.first() == Some(&r.src) && path.last() == Some(&r.dst)
                })
            })
            .collect();
        // A rule for one port must win over a rule for the whole node pair.
        let specificity = |r: &RouteRuleRow| {
            usize::from(r.protocol.is_some())
                + usize::from(r.src_port.is_some())
                + usize::from(r.dst_port.is_some())
        };
        rules.sort_by(|a, b| specificity(b).cmp(&specificity(a)).then(a.id.cmp(&b.id)));
        self.rules = rules;
        self
    }

    /// Nodes whose config may differ between `old` and this view: when routes
    /// or rules changed, those on an explicit route or a rule's source in
    /// either; an end of a link that was added, removed or changed. They are sent their change first, so a route change
    /// reaches the packet path before hundreds of unaffected agents are served.
    pub fn affected_nodes(&self, old: &TopologyView) -> std::collections::HashSet<String> {
        let mut nodes = std::collections::HashSet::new();
        // Routes and rules as they were touch nobody (a link change beside
        // them reaches its own two ends only).
        if self.routes != old.routes || self.rules != old.rules {
            for view in [self, old] {
                for (path, _) in view.routes.values() {
                    nodes.extend(path.iter().cloned());
                }
                nodes.extend(view.rules.iter().map(|r| r.src.clone()));
            }
        }
        if Arc::ptr_eq(&self.plan, &old.plan) {
            return nodes;
        }
        if let Some(names) = self.links_changed_since(old) {
            for link in self.plan.links.iter().filter(|l| names.contains(&l.name)) {
                nodes.insert(link.dialer.clone());
                nodes.insert(link.acceptor.clone());
            }
            return nodes;
        }
        let before: HashMap<&str, &crate::plan::PlannedLink> = old
            .plan
            .links
            .iter()
            .map(|l| (l.name.as_str(), &**l))
            .collect();
        let after: HashMap<&str, &crate::plan::PlannedLink> = self
            .plan
            .links
            .iter()
            .map(|l| (l.name.as_str(), &**l))
            .collect();
        for (name, link) in before.iter().chain(after.iter()) {
            if before.get(name) != after.get(name) {
                nodes.insert(link.dialer.clone());
                nodes.insert(link.acceptor.clone());
            }
        }
        nodes
    }

    /// This node's label routes and flow rules.
    fn explicit_routes(&self, node: &str) -> (Vec<pb::LabelRoute>, Vec<pb::FlowRule>) {
        let labels = self
            .routes
            .iter()
            .filter_map(|(id, (path, links))| {
                let at = path.iter().position(|n| n == node)?;
                Some(pb::LabelRoute {
                    route_id: *id,
                    next_link: links.get(at).cloned().unwrap_or_default(),
                })
            })
            .collect();
        // Rules with the same match become one flow rule with weighted choices.
        type Match = (String, Option<u8>, Option<u16>, Option<u16>);
        let mut grouped: Vec<(Match, Vec<pb::RouteChoice>)> = Vec::new();
        let mut index: HashMap<Match, usize> = HashMap::new();
        for r in self.rules.iter().filter(|r| r.src == node) {
            let key = (r.dst.clone(), r.protocol, r.src_port, r.dst_port);
            let choice = pb::RouteChoice {
                route_id: r.route_id,
                weight: r.weight,
            };
            match index.get(&key) {
                Some(&i) => grouped[i].1.push(choice),
                None => {
                    index.insert(key.clone(), grouped.len());
                    grouped.push((key, vec![choice]));
                }
            }
        }
        let src_addr = self
            .node(node)
            .map(|(_, overlay)| overlay.to_owned())
            .unwrap_or_default();
        let rules = grouped
            .into_iter()
            .filter_map(|((dst, protocol, src_port, dst_port), choices)| {
                let (dst, _) = self.node(&dst)?;
                Some(pb::FlowRule {
                    src_addr: src_addr.clone(),
                    dst_addr: dst.overlay.to_string(),
                    src_port: src_port.map_or(0, u32::from),
                    dst_port: dst_port.map_or(0, u32::from),
                    protocol: protocol.map_or(0, u32::from),
                    route_id: choices.first().map_or(0, |c| c.route_id),
                    choices,
                })
            })
            .collect();
        (labels, rules)
    }

    /// The full snapshot for `node`, or `None` when the topology has no such node.
    pub fn snapshot(&self, node: &str) -> Option<pb::Snapshot> {
        let plan = &self.plan;
        let (me, my_overlay) = self.node(node)?;
        let links = plan
            .links_of(node)
            .filter_map(|(link, peer)| {
                let (peer, _) = self.node(peer)?;
                let dial = link.dialer == node;
                Some(pb::LinkConfig {
                    name: link.name.clone(),
                    peer_node: peer.name.clone(),
                    peer_addr: self
                        .endpoints
                        .get(&peer.name)
                        .cloned()
                        .unwrap_or_else(|| self.underlay.peer_addr(peer)),
                    role: if dial {
                        pb::LinkRole::Dial as i32
                    } else {
                        pb::LinkRole::Accept as i32
                    },
                    transport: match link.transport {
                        Transport::Tcp => "tcp".into(),
                        Transport::Quic => "quic".into(),
                    },
                    // Each end enforces the direction it sends: the dialer is
                    // endpoints[0], so it sends forward.
                    params: Some(super::params::to_proto(if dial {
                        &link.forward
                    } else {
                        &link.backward
                    })),
                })
            })
            .collect();
        let ranges = self
            .nodes
            .get(node)
            .map(|&i| self.destination_ranges(i))
            .unwrap_or_default();
        let (labels, flow_rules) = self.explicit_routes(node);
        Some(pb::Snapshot {
            generation: self.generation as u64,
            node: Some(pb::NodeConfig {
                name: me.name.clone(),
                topology: plan.topology.clone(),
                overlay_addr: my_overlay.to_owned(),
                overlay_prefix_len: u32::from(plan.overlay.prefix_len()),
                listen_addr: self.underlay.listen_addr(me),
                dataplane: Some(pb::DataplaneConfig {
                    processors: plan.dataplane.processors,
                    mtu: plan.dataplane.mtu,
                    mapping: match plan.dataplane.mapping {
                        Mapping::Sequential => "sequential".into(),
                        Mapping::Concurrent => "concurrent".into(),
                    },
                    ttl: if plan.dataplane.ttl_decrement {
                        "decrement".into()
                    } else {
                        "transparent".into()
                    },
                }),
                // Only SOCKS entries look names up; a list of every node in
                // every agent made an agent's memory grow with the topology.
                peers: if me.socks.is_empty() {
                    Vec::new()
                } else {
                    plan.nodes
                        .iter()
                        .zip(self.overlays.iter())
                        .map(|(n, overlay)| pb::PeerAddress {
                            node: n.name.clone(),
                            overlay_addr: overlay.clone(),
                        })
                        .collect()
                },
                link_cert_der: self
                    .identity
                    .as_ref()
                    .map(|i| i.cert_der.clone())
                    .unwrap_or_default(),
                link_key_der: self
                    .identity
                    .as_ref()
                    .map(|i| i.key_der.clone())
                    .unwrap_or_default(),
                max_port: u32::from(self.underlay.max_port(me)),
                socks: me.socks.iter().map(socks_listener).collect(),
                seed: plan.seed.unwrap_or(0),
            }),
            links,
            routes: Some(pb::RouteTable {
                destinations: Vec::new(),
                ranges,
                labels,
                flow_rules,
                hop_limit: hop_limit(plan.nodes.len()),
            }),
            report_interval_ms: plan.report_interval_ms,
            idle_report_interval_ms: idle_report_interval_ms(
                plan.report_interval_ms,
                plan.nodes.len(),
            ),
            flows: self.flow_tasks(node),
        })
    }

    /// Node `i`'s destination routes: each run of its next hops, cut where
    /// the overlay addresses stop being consecutive.
    fn destination_ranges(&self, i: usize) -> Vec<pb::DestinationRange> {
        let Some(row) = self.hops.get(i) else {
            return Vec::new();
        };
        let mut ranges = Vec::with_capacity(row.len());
        for (dsts, link) in crate::plan::expand_runs(row, self.plan.nodes.len()) {
            let next_hops: Vec<pb::NextHop> = self
                .plan
                .links
                .get(link as usize)
                .map(|l| pb::NextHop {
                    link: l.name.clone(),
                    weight: 1,
                })
                .into_iter()
                .collect();
            let mut start = dsts.start;
            let from = self.overlay_breaks.partition_point(|&b| b <= start);
            let cuts = self.overlay_breaks[from..]
                .iter()
                .copied()
                .take_while(|&b| b < dsts.end)
                .chain(std::iter::once(dsts.end));
            for cut in cuts {
                let (Some(first), Some(last)) = (
                    self.overlays.get(start as usize),
                    self.overlays.get(cut as usize - 1),
                ) else {
                    break;
                };
                ranges.push(pb::DestinationRange {
                    first: first.clone(),
                    last: last.clone(),
                    next_hops: next_hops.clone(),
                });
                start = cut;
            }
        }
        ranges
    }

    /// The synthetic flows `node` is the source or the sink of.
    fn flow_tasks(&self, node: &str) -> Vec<pb::FlowTask> {
        self.plan
            .flows
            .iter()
            .filter_map(|f| {
                let (role, peer) = if f.src == node {
                    (pb::FlowRole::Source, &f.dst)
                } else if f.dst == node {
                    (pb::FlowRole::Sink, &f.src)
                } else {
                    return None;
                };
                let (peer, _) = self.node(peer)?;
                let p = &f.params;
                let (size_bytes, size_cdf, duration_us) = match &p.amount {
                    FlowAmount::Bytes(b) => (*b, Vec::new(), 0),
                    FlowAmount::Cdf(points) => (
                        0,
                        points
                            .iter()
                            .map(|&(bytes, probability)| pb::CdfPoint { bytes, probability })
                            .collect(),
                        0,
                    ),
                    FlowAmount::DurationUs(us) => (0, Vec::new(), *us),
                    FlowAmount::Unbounded => (0, Vec::new(), 0),
                };
                Some(pb::FlowTask {
                    name: f.name.clone(),
                    defined_generation: u64::try_from(f.defined_generation).unwrap_or(0),
                    role: role as i32,
                    peer_addr: peer.overlay.to_string(),
                    protocol: match p.protocol {
                        FlowProtocol::Tcp => pb::FlowProtocol::Tcp as i32,
                        FlowProtocol::Udp => pb::FlowProtocol::Udp as i32,
                    },
                    count: p.count,
                    parallelism: p.parallelism,
                    size_bytes,
                    size_cdf,
                    duration_us,
                    rate_bps: p.rate_bps.unwrap_or(0),
                    start_delay_us: p.start_delay_us,
                    mean_interarrival_us: p.mean_interarrival_us.unwrap_or(0),
                    seed: p.seed,
                    // A route that no longer follows the links was left out of the
                    // view: the flow then takes the shortest path.
                    route_id: f
                        .route_id
                        .filter(|id| self.routes.contains_key(id))
                        .unwrap_or(0),
                    window_bytes: p.window_bytes,
                    dscp: u32::from(p.dscp),
                    dscp_by_size: p
                        .dscp_by_size
                        .iter()
                        .map(|&(max_bytes, dscp)| pb::DscpBySize {
                            max_bytes,
                            dscp: u32::from(dscp),
                        })
                        .collect(),
                    congestion_control: p.congestion_control.as_str().to_owned(),
                    mode: match p.mode {
                        RelayMode::Normal => pb::RelayMode::Normal as i32,
                        RelayMode::Max => pb::RelayMode::Max as i32,
                    },
                })
            })
            .collect()
    }
}

/// What the hub keeps of the config it sent an agent: a hash of each part a
/// delta compares. Keeping the snapshot itself held the whole topology's
/// destinations and peers once per agent (about a quarter of a MiB each at
/// 1,000 nodes); this is a few dozen bytes per link of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentConfig {
    generation: u64,
    node: u64,
    report_interval_ms: u32,
    idle_report_interval_ms: u32,
    flows: u64,
    routes: u64,
    links: BTreeMap<String, u64>,
}

/// A hash of a message's encoding (prost encodes the same content the same
/// way: the protocol has no map fields).
fn digest_of(message: &impl prost::Message) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    message.encode_to_vec().hash(&mut hasher);
    hasher.finish()
}

impl SentConfig {
    pub fn of(snapshot: &pb::Snapshot) -> SentConfig {
        let flows = {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            for f in &snapshot.flows {
                digest_of(f).hash(&mut hasher);
            }
            hasher.finish()
        };
        SentConfig {
            generation: snapshot.generation,
            node: snapshot.node.as_ref().map(digest_of).unwrap_or(0),
            report_interval_ms: snapshot.report_interval_ms,
            idle_report_interval_ms: snapshot.idle_report_interval_ms,
            flows,
            routes: snapshot.routes.as_ref().map(digest_of).unwrap_or(0),
            links: snapshot
                .links
                .iter()
                .map(|l| (l.name.clone(), digest_of(l)))
                .collect(),
        }
    }

    /// Whether an agent that runs this config runs `other`'s too: everything
    /// but the generation it was sent at is the same.
    pub fn runs_same_as(&self, other: &SentConfig) -> bool {
        self.node == other.node
            && self.report_interval_ms == other.report_interval_ms
            && self.idle_report_interval_ms == other.idle_report_interval_ms
            && self.flows == other.flows
            && self.routes == other.routes
            && self.links == other.links
    }
}

/// The delta from the config an agent has to `new`, or None when only a full
/// snapshot will do (its node, flows or report interval changed).
pub fn delta(old: &SentConfig, new: &pb::Snapshot) -> Option<pb::Delta> {
    let next = SentConfig::of(new);
    // Deltas carry no flows: a change of flows goes as a full snapshot.
    if old.node != next.node
        || old.report_interval_ms != next.report_interval_ms
        || old.idle_report_interval_ms != next.idle_report_interval_ms
        || old.flows != next.flows
    {
        return None;
    }
    let upsert_links = new
        .links
        .iter()
        .filter(|l| old.links.get(&l.name) != next.links.get(&l.name))
        .cloned()
        .collect();
    let remove_links = old
        .links
        .keys()
        .filter(|name| !next.links.contains_key(*name))
        .cloned()
        .collect();
    Some(pb::Delta {
        generation: new.generation,
        base_generation: old.generation,
        upsert_links,
        remove_links,
        routes: (old.routes != next.routes).then(|| new.routes.clone().unwrap_or_default()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::plan::fixtures::line3;

    #[test]
    fn a_recorded_endpoint_is_what_the_peers_dial() {
        let before = TopologyView::new(line3(), 7);
        let mut view = TopologyView::new(line3(), 8);
        view.underlay = Underlay::PodDns {
            service: "nm-line3".into(),
            namespace: "lab".into(),
        };
        view.endpoints = Arc::new(HashMap::from([(
            "c".to_owned(),
            "198.18.9.7:31000".to_owned(),
        )]));
        let dialed = |node: &str, peer: &str| {
            view.snapshot(node)
                .expect("a node")
                .links
                .into_iter()
                .find(|l| l.peer_node == peer)
                .expect("a link to the peer")
                .peer_addr
        };
        assert_eq!(dialed("b", "c"), "198.18.9.7:31000");
        assert_eq!(dialed("b", "a"), format!("a.nm-line3.lab.svc:{LINK_PORT}"));
        let mut same = TopologyView::new(line3(), 8);
        same.underlay = view.underlay.clone();
        assert!(
            !same.same_outside_affected(&view),
            "a moved endpoint reaches every dialer"
        );
        assert!(!view.same_outside_affected(&before));
    }

    #[test]
    fn middle_node_dials_one_peer_accepts_the_other_and_routes_both_ways() {
        let view = TopologyView::new(line3(), 7);
        let s = view.snapshot("b").expect("b is a node");
        assert_eq!(s.generation, 7);
        let node = s.node.expect("node config");
        assert_eq!(node.overlay_addr, "198.18.0.2");
        assert_eq!(node.overlay_prefix_len, 16);
        assert_eq!(node.listen_addr, format!("198.19.0.2:{LINK_PORT}"));
        assert!(node.peers.is_empty(), "names go only to SOCKS nodes");

        let links: Vec<(String, String, i32, String)> = s
            .links
            .iter()
            .map(|l| {
                (
                    l.name.clone(),
                    l.peer_node.clone(),
                    l.role,
                    l.peer_addr.clone(),
                )
            })
            .collect();
        assert_eq!(
            links,
            [
                (
                    "a-b".into(),
                    "a".into(),
                    pb::LinkRole::Accept as i32,
                    format!("198.19.0.1:{LINK_PORT}")
                ),
                (
                    "b-c".into(),
                    "c".into(),
                    pb::LinkRole::Dial as i32,
                    format!("198.19.0.3:{LINK_PORT}")
                ),
            ]
        );

        let routes = s.routes.expect("routes");
        assert!(routes.destinations.is_empty(), "the hub sends ranges");
        let via = |dst: &str| {
            let addr: std::net::Ipv4Addr = dst.parse().expect("address");
            routes
                .ranges
                .iter()
                .find(|r| {
                    let first: std::net::Ipv4Addr = r.first.parse().expect("first");
                    let last: std::net::Ipv4Addr = r.last.parse().expect("last");
                    (first..=last).contains(&addr)
                })
                .map(|r| {
                    r.next_hops
                        .iter()
                        .map(|h| h.link.clone())
                        .collect::<Vec<_>>()
                })
        };
        assert_eq!(via("198.18.0.1"), Some(vec!["a-b".to_string()]));
        assert_eq!(via("198.18.0.3"), Some(vec!["b-c".to_string()]));
        assert_eq!(
            via("198.18.0.2"),
            Some(vec![]),
            "own address is delivered locally"
        );
        assert_eq!(via("198.18.0.4"), None, "no route beyond the nodes");
    }

    fn ring(nodes: usize) -> Plan {
        let text = format!(
            "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: ring}}\n\
             spec: {{generator: {{ring: {{nodes: {nodes}}}}}}}\n"
        );
        let manifest = crate::plan::parse_manifest("ring.yaml", &text).expect("parses");
        crate::plan::plan_manifest(&manifest)
            .expect("plans")
            .remove(0)
    }

    /// Where `addr` goes by `ranges`: the next hop's link, "" for local, or
    /// None when no range holds it.
    fn range_lookup(ranges: &[pb::DestinationRange], addr: std::net::Ipv4Addr) -> Option<String> {
        let hit: Vec<&pb::DestinationRange> = ranges
            .iter()
            .filter(|r| {
                let first: std::net::Ipv4Addr = r.first.parse().expect("first");
                let last: std::net::Ipv4Addr = r.last.parse().expect("last");
                first <= last && (first..=last).contains(&addr)
            })
            .collect();
        assert!(hit.len() <= 1, "{addr} is in {} ranges", hit.len());
        hit.first().map(|r| {
            r.next_hops
                .first()
                .map(|h| h.link.clone())
                .unwrap_or_default()
        })
    }

    /// Issue 16.2: every node's ranges send each address where the
    /// shortest-path table does, and a ring's node holds at most four ranges
    /// at any size: its forwarding state does not grow with the topology.
    #[test]
    fn destination_ranges_follow_the_shortest_paths_in_a_few_ranges() {
        let plan = ring(41);
        let table = crate::plan::next_hops(&plan);
        let view = TopologyView::new(plan, 1);
        for node in view.plan.nodes.iter() {
            let ranges = view
                .snapshot(&node.name)
                .and_then(|s| s.routes)
                .expect("routes")
                .ranges;
            assert!(ranges.len() <= 4, "{}: {} ranges", node.name, ranges.len());
            for hop in &table[&node.name] {
                let (dst, _) = view.node(&hop.dst).expect("node");
                assert_eq!(
                    range_lookup(&ranges, dst.overlay),
                    Some(hop.link.clone().unwrap_or_default()),
                    "{} -> {}",
                    node.name,
                    hop.dst
                );
            }
        }
        let big = TopologyView::new(ring(2_000), 1);
        let runs: usize = big.hops.iter().map(Vec::len).sum();
        assert!(runs <= 4 * 2_000, "{runs} runs for 2,000 nodes");
        for name in ["n0", "n999", "n1999"] {
            let s = big.snapshot(name).expect("node");
            let routes = s.routes.expect("routes");
            assert!(
                routes.ranges.len() <= 4,
                "{name}: {} ranges",
                routes.ranges.len()
            );
            let node = s.node.expect("node config");
            assert!(node.peers.is_empty());
            let size = prost::Message::encoded_len(&routes) + prost::Message::encoded_len(&node);
            assert!(
                size < 1024,
                "{name}: {size} bytes of node config and routes"
            );
        }
    }

    #[test]
    fn idle_agents_of_a_large_topology_report_less_often() {
        assert_eq!(
            idle_report_interval_ms(1000, 3),
            1000,
            "small: every interval"
        );
        assert_eq!(idle_report_interval_ms(100, 10), 100);
        assert_eq!(idle_report_interval_ms(1000, 1000), 5000);
        assert_eq!(idle_report_interval_ms(1000, 10_000), 30_000);
        assert_eq!(
            idle_report_interval_ms(60_000, 10),
            60_000,
            "never below the interval"
        );
        let s = TopologyView::new(ring(2_000), 1)
            .snapshot("n0")
            .expect("node");
        assert_eq!(s.idle_report_interval_ms, 10_000);
    }

    /// Addresses that do not follow each other split a run of next hops:
    /// a range never covers an address no node has.
    #[test]
    fn a_gap_between_overlay_addresses_cuts_the_range() {
        let mut plan = ring(8);
        for node in plan.nodes_mut().iter_mut().skip(2) {
            node.overlay = std::net::Ipv4Addr::from(u32::from(node.overlay) + 10);
        }
        let view = TopologyView::new(plan, 1);
        let ranges = view
            .snapshot("n0")
            .and_then(|s| s.routes)
            .expect("routes")
            .ranges;
        let gap: std::net::Ipv4Addr = "198.18.0.5".parse().expect("address");
        assert_eq!(range_lookup(&ranges, gap), None, "{ranges:?}");
        for node in view.plan.nodes.iter() {
            assert!(
                range_lookup(&ranges, node.overlay).is_some(),
                "{} unreachable",
                node.name
            );
        }
    }

    /// The guard must let a packet cross the longest planned path: a 300-node
    /// line's ends are 299 links apart (the fixed guard of 64 cut them off).
    #[test]
    fn the_hop_limit_covers_the_longest_planned_path() {
        let text = "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: long}\n\
                    spec: {generator: {line: {nodes: 300}}}\n";
        let manifest = crate::plan::parse_manifest("long.yaml", text).expect("parses");
        let plan = crate::plan::plan_manifest(&manifest)
            .expect("plans")
            .remove(0);
        let longest = plan.nodes.len() - 1;
        let view = TopologyView::new(plan, 1);
        let first = view.plan.nodes[0].name.clone();
        let limit = view
            .snapshot(&first)
            .and_then(|s| s.routes)
            .map(|r| r.hop_limit);
        assert!(
            limit.is_some_and(|l| l as usize >= longest),
            "{limit:?} < {longest}"
        );
        assert_eq!(hop_limit(3), 64, "small topologies keep the former guard");
        assert_eq!(
            hop_limit(1 << 20),
            u32::from(u16::MAX),
            "the wire's width caps it"
        );
    }

    #[test]
    fn unknown_node_gets_no_snapshot() {
        let view = TopologyView::new(line3(), 1);
        assert!(view.snapshot("z").is_none());
    }

    /// In the shaped example the router dials `access` and the client accepts it: each
    /// gets the direction it sends, with every parameter of the shaped `core` link.
    #[test]
    fn each_end_gets_the_direction_it_sends() {
        let text = include_str!("../../../manifests/examples/shaped.yaml");
        let manifest = crate::plan::parse_manifest("shaped.yaml", text).expect("parses");
        let plan = crate::plan::plan_manifest(&manifest)
            .expect("plans")
            .remove(0);
        let view = TopologyView::new(plan, 1);
        let params = |node: &str, link: &str| {
            view.snapshot(node)
                .and_then(|s| s.links.into_iter().find(|l| l.name == link))
                .and_then(|l| l.params)
                .unwrap_or_else(|| panic!("{node} has no params for {link}"))
        };
        let router = params("router", "access");
        let client = params("client", "access");
        assert_eq!((router.rate_bps, router.burst_bytes), (20_000_000, 0));
        assert_eq!((client.rate_bps, client.burst_bytes), (2_000_000, 16_000));
        assert_eq!((router.loss_ppm, client.loss_ppm), (1_000, 5_000));
        assert_eq!(client.loss_correlation_ppm, 250_000);
        for p in [&router, &client] {
            assert_eq!((p.delay_us, p.jitter_us), (10_000, 2_000));
            assert_eq!(p.jitter_distribution, pb::JitterDistribution::Normal as i32);
            assert_eq!(p.queue.as_ref().map(|q| q.limit_packets), Some(1000));
        }

        let core = params("server", "core");
        assert_eq!(core, params("router", "core"), "no override on core");
        assert_eq!((core.rate_bps, core.delay_us), (100_000_000, 20_000));
        assert_eq!(
            core.queue.and_then(|q| q.aqm),
            Some(pb::queue_config::Aqm::Red(pb::Red {
                min_packets: 50,
                max_packets: 150,
                max_p_ppm: 100_000,
                weight_ppm: 2_000,
                ecn: true,
            }))
        );
        assert_eq!(
            core.scheduler.and_then(|s| s.kind),
            Some(pb::scheduler_config::Kind::Wrr(pb::Wrr {
                weights: vec![4, 1]
            }))
        );
        let rule = |dscp, protocol, src_port, dst_port| pb::ClassRule {
            queue: 0,
            dscp,
            src_port,
            dst_port,
            protocol,
            max_packet_bytes: None,
        };
        assert_eq!(
            core.classes,
            [
                rule(Some(46), None, None, None),
                rule(None, Some(6), None, Some(22)),
                rule(None, Some(6), Some(22), None),
            ]
        );
    }

    fn diamond() -> Plan {
        let text = "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {name: dia}\nspec:\n  nodes: [{name: s}, {name: x}, {name: y}, {name: d}]\n  links:\n    - endpoints: [s, x]\n    - endpoints: [x, d]\n    - endpoints: [s, y]\n    - endpoints: [y, d]\n";
        let manifest = crate::plan::parse_manifest("dia.yaml", text).expect("parses");
        crate::plan::plan_manifest(&manifest)
            .expect("plans")
            .remove(0)
    }

    fn route(id: u32, path: &[&str]) -> RouteRow {
        RouteRow {
            id,
            name: format!("r{id}"),
            path: path.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn rule(id: i64, route_id: u32, dst_port: Option<u16>, weight: u32) -> RouteRuleRow {
        RouteRuleRow {
            id,
            src: "s".into(),
            dst: "d".into(),
            protocol: dst_port.map(|_| 6),
            src_port: None,
            dst_port,
            route_id,
            weight,
        }
    }

    #[test]
    fn explicit_routes_become_labels_along_the_path_and_rules_at_the_source() {
        let view = TopologyView::new(diamond(), 3).with_routes(
            vec![
                route(1, &["s", "x", "d"]),
                route(2, &["s", "y", "d"]),
                route(9, &["s", "d"]),
            ],
            vec![
                rule(1, 1, None, 1),
                rule(2, 2, None, 3),
                rule(3, 2, Some(5201), 1),
                rule(4, 9, None, 1),
            ],
            None,
        );
        let routes = |node: &str| view.snapshot(node).and_then(|s| s.routes).expect("routes");
        let label = |node: &str, id: u32| {
            routes(node)
                .labels
                .iter()
                .find(|l| l.route_id == id)
                .map(|l| l.next_link.clone())
        };
        assert_eq!(label("s", 2), Some("s-y".into()));
        assert_eq!(label("y", 2), Some("y-d".into()));
        assert_eq!(
            label("d", 2),
            Some(String::new()),
            "the last hop delivers locally"
        );
        assert_eq!(label("x", 2), None, "x is not on route 2");
        assert_eq!(
            label("s", 9),
            None,
            "route 9 does not follow the links and is left out"
        );

        let rules = routes("s").flow_rules;
        assert_eq!(rules.len(), 2, "{rules:?}");
        assert_eq!(
            rules[0].dst_port, 5201,
            "the port rule comes before the aggregate"
        );
        assert_eq!(rules[0].route_id, 2);
        assert_eq!(rules[1].dst_addr, "198.18.0.4");
        let choices: Vec<(u32, u32)> = rules[1]
            .choices
            .iter()
            .map(|c| (c.route_id, c.weight))
            .collect();
        assert_eq!(
            choices,
            [(1, 1), (2, 3)],
            "weighted multipath over routes 1 and 2"
        );
        assert!(routes("x").flow_rules.is_empty());
    }

    #[test]
    fn deltas_carry_only_what_changed_for_each_agent() {
        let before = TopologyView::new(diamond(), 1);
        let after = TopologyView::new(diamond(), 2).with_routes(
            vec![route(2, &["s", "y", "d"])],
            vec![rule(1, 2, Some(5201), 1)],
            None,
        );
        let d = |node: &str| {
            delta(
                &SentConfig::of(&before.snapshot(node).expect("before")),
                &after.snapshot(node).expect("after"),
            )
            .expect("a delta applies")
        };
        let s = d("s");
        assert_eq!((s.base_generation, s.generation), (1, 2));
        assert!(s.routes.is_some() && s.upsert_links.is_empty() && s.remove_links.is_empty());
        let x = d("x");
        assert!(x.routes.is_none(), "x's table did not change: {x:?}");

        let mut faster = diamond();
        faster.link_mut(0).forward.rate_bps = Some(5_000_000);
        let relinked = TopologyView::new(faster, 2);
        let name = relinked.plan.links[0].name.clone();
        let dialer = relinked.plan.links[0].dialer.clone();
        let changed = delta(
            &SentConfig::of(&before.snapshot(&dialer).expect("before")),
            &relinked.snapshot(&dialer).expect("after"),
        )
        .expect("delta");
        assert_eq!(changed.upsert_links.len(), 1);
        assert_eq!(changed.upsert_links[0].name, name);
        assert!(changed.routes.is_none());
    }

    #[test]
    fn a_change_that_keeps_the_graph_keeps_the_next_hop_table() {
        let before = TopologyView::new(diamond(), 1);
        let mut faster = diamond();
        faster.link_mut(0).forward.rate_bps = Some(5_000_000);
        let after = TopologyView::after(faster, 2, Some(&before));
        assert!(
            Arc::ptr_eq(&after.hops, &before.hops),
            "a rate change must not search all pairs again"
        );
        // A link fewer changes the paths: the table is computed again, and it
        // is the one a fresh view computes.
        let mut cut = diamond();
        cut.links.remove(0);
        let after = TopologyView::after(cut.clone(), 3, Some(&before));
        assert!(!Arc::ptr_eq(&after.hops, &before.hops));
        assert_eq!(*after.hops, *TopologyView::new(cut, 3).hops);
        assert_ne!(*after.hops, *before.hops);
    }

    /// The snapshot with its generation cleared, for comparing content.
    fn content(view: &TopologyView, node: &str) -> pb::Snapshot {
        pb::Snapshot {
            generation: 0,
            ..view.snapshot(node).expect("a node")
        }
    }

    #[test]
    fn nodes_outside_a_confined_change_keep_their_snapshot_but_the_generation() {
        let before = TopologyView::new(diamond(), 1);
        // A rate change of one link, and a route with a rule: both confined.
        let mut faster = diamond();
        faster.link_mut(0).forward.rate_bps = Some(5_000_000);
        let rerouted = TopologyView::new(diamond(), 2).with_routes(
            vec![route(2, &["s", "y", "d"])],
            vec![rule(1, 2, Some(5201), 1)],
            None,
        );
        for after in [TopologyView::new(faster, 2), rerouted] {
            assert!(after.same_outside_affected(&before));
            let affected = after.affected_nodes(&before);
            let outside: Vec<&str> = ["s", "x", "y", "d"]
                .into_iter()
                .filter(|n| !affected.contains(*n))
                .collect();
            assert!(!outside.is_empty(), "{affected:?}");
            for node in outside {
                assert_eq!(content(&before, node), content(&after, node), "{node}");
            }
        }
        // A link removed changes shortest paths: every node is served in full.
        let mut fewer = diamond();
        fewer.links.remove(0);
        assert!(!TopologyView::new(fewer, 2).same_outside_affected(&before));
        // So does anything outside the links, such as the report interval.
        let mut slower = diamond();
        slower.report_interval_ms += 1;
        assert!(!TopologyView::new(slower, 2).same_outside_affected(&before));
    }

    /// The view's own path check answers as the planner's does, parallel
    /// links (the lowest name) included.
    #[test]
    fn a_views_path_check_is_the_planners() {
        let mut plan = diamond();
        let mut parallel = (*plan.links[0]).clone();
        parallel.name = format!("{}-0", plan.links[0].name);
        std::mem::swap(&mut parallel.dialer, &mut parallel.acceptor);
        plan.links.push(Arc::new(parallel));
        plan.links.sort_by(|a, b| a.name.cmp(&b.name));
        let view = TopologyView::new(plan.clone(), 1);
        let paths: [&[&str]; 7] = [
            &["s", "x", "d"],
            &["d", "x", "s"],
            &["s", "y", "d", "x"],
            &["s", "d"],
            &["s", "q"],
            &["s"],
            &[],
        ];
        for path in paths {
            let path: Vec<String> = path.iter().map(|s| s.to_string()).collect();
            assert_eq!(
                view.path_links(&path),
                crate::plan::path_links(&plan, &path),
                "{path:?}"
            );
        }
    }

    /// Issue 16.4: links changed in place give a view that shares everything
    /// but the plan's links, names exactly their ends as affected, and serves
    /// every node what a view loaded in full would.
    #[test]
    fn links_changed_in_place_touch_only_their_ends() {
        use crate::store::{ChangedLinks, FaultyPart, RowFault};
        let before = TopologyView::new(diamond(), 1);
        let mut slower = diamond();
        let i = slower
            .links
            .iter()
            .position(|l| l.name == "x-d")
            .expect("x-d");
        slower.link_mut(i).forward.delay = Some(std::time::Duration::from_millis(7));
        let changed = ChangedLinks {
            links: vec![(*slower.links[i]).clone()],
            faults: Vec::new(),
        };
        let after = TopologyView::with_links_changed(&before, 2, changed);
        assert!(Arc::ptr_eq(&after.hops, &before.hops) && Arc::ptr_eq(&after.nodes, &before.nodes));
        assert_eq!(*after.plan, slower);
        assert!(after.same_outside_affected(&before));
        let mut affected: Vec<String> = after.affected_nodes(&before).into_iter().collect();
        affected.sort();
        assert_eq!(affected, ["d", "x"]);
        let full = TopologyView::new(slower.clone(), 2);
        for node in ["s", "x", "y", "d"] {
            assert_eq!(after.snapshot(node), full.snapshot(node), "{node}");
        }
        // Measured against any other view, nothing is assumed.
        let other = TopologyView::new(diamond(), 1);
        assert_eq!(after.affected_nodes(&other), full.affected_nodes(&other));

        // A changed row that breaks the rules runs its last good parameters
        // and is listed; once good again, it is no longer listed.
        let broken = ChangedLinks {
            links: vec![crate::plan::PlannedLink {
                forward: Default::default(),
                ..(*slower.links[i]).clone()
            }],
            faults: vec![RowFault {
                part: FaultyPart::LinkForward("x-d".into()),
                subject: "links x-d params_forward".into(),
                problem: "params_forward: unknown key rate".into(),
            }],
        };
        let faulty = TopologyView::with_links_changed(&after, 3, broken);
        assert_eq!(
            faulty.plan.links[i].forward.delay,
            Some(std::time::Duration::from_millis(7))
        );
        assert_eq!(faulty.problems().len(), 1, "{:?}", faulty.problems());
        let repaired = ChangedLinks {
            links: vec![(*slower.links[i]).clone()],
            faults: Vec::new(),
        };
        let good = TopologyView::with_links_changed(&faulty, 4, repaired);
        assert!(good.problems().is_empty(), "{:?}", good.problems());
    }

    #[test]
    fn flows_go_to_their_source_and_sink_and_change_by_snapshot() {
        let text = include_str!("../../tests/fixtures/workloads.yaml");
        let manifest = crate::plan::parse_manifest("workloads.yaml", text).expect("parses");
        let mut plan = crate::plan::plan_manifest(&manifest)
            .expect("plans")
            .remove(0);
        for f in &mut plan.flows {
            f.defined_generation = 4;
            if f.name == "web" {
                f.route_id = Some(1);
            }
        }
        let view = TopologyView::new(plan.clone(), 5).with_routes(
            vec![route(1, &["a", "b", "c"])],
            vec![],
            None,
        );
        let tasks = |view: &TopologyView, node: &str| view.snapshot(node).expect("node").flows;
        let role = |tasks: &[pb::FlowTask], name: &str| {
            tasks
                .iter()
                .find(|t| t.name == name)
                .map(|t| pb::FlowRole::try_from(t.role).expect("role"))
        };
        let a = tasks(&view, "a");
        assert_eq!(role(&a, "web"), Some(pb::FlowRole::Source));
        assert_eq!(role(&a, "back"), Some(pb::FlowRole::Sink));
        assert_eq!(role(&a, "cbr"), None, "a has no part in cbr");
        let web = a.iter().find(|t| t.name == "web").expect("web");
        assert_eq!(web.peer_addr, "198.18.0.3");
        assert_eq!((web.defined_generation, web.route_id), (4, 1));
        assert_eq!(web.size_cdf.len(), 12);
        assert!(web.mean_interarrival_us > 0);
        assert_eq!((web.seed, web.count, web.window_bytes), (7, 500, 65536));
        assert_eq!(web.dscp_by_size[0].dscp, 46);
        let b = tasks(&view, "b");
        assert_eq!(b.len(), 1);
        assert_eq!(role(&b, "cbr"), Some(pb::FlowRole::Sink));
        assert_eq!(b[0].protocol, pb::FlowProtocol::Udp as i32);

        // Without its route (it no longer follows the links) the flow takes the
        // shortest path: no label.
        let unrouted = TopologyView::new(plan.clone(), 5);
        let web = tasks(&unrouted, "a").into_iter().find(|t| t.name == "web");
        assert_eq!(web.map(|t| t.route_id), Some(0));

        // A change of flows is a full snapshot; the same flows allow a delta.
        let before = view.snapshot("a").expect("a");
        let mut changed = plan.clone();
        changed.flows.retain(|f| f.name != "back");
        let after = TopologyView::new(changed, 6)
            .with_routes(vec![route(1, &["a", "b", "c"])], vec![], None)
            .snapshot("a")
            .expect("a");
        assert!(delta(&SentConfig::of(&before), &after).is_none());
        let same = TopologyView::new(plan, 6)
            .with_routes(vec![route(1, &["a", "b", "c"])], vec![], None)
            .snapshot("a")
            .expect("a");
        assert!(delta(&SentConfig::of(&before), &same).is_some());
    }
}
