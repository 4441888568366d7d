//! The local runtime: every virtual node in its own network namespace, joined to
//! the topology's bridge by a veth, with one agent process per node. The bridges
//! and the veths' outer ends live in the topology's own underlay namespace, not
//! the host's: the host keeps its interface list and routing to itself, and
//! every interface there starts with IPv6 off without a write per interface.

use super::netlink::{self, connect_here};
use super::process::{self, AgentLaunch};
use super::start_gate::StartGate;
use super::{
    Progress, Removal, RemovalProgress, Removed, Runtime, RuntimeError, Stage, cgroup, names,
};
use crate::pki::{Credentials, NodeCredential, files};
use crate::plan::{Plan, PlannedNode};
use futures::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Nodes set up at once; netlink calls are quick, this only hides their latency.
const PARALLEL_NODES: usize = 8;
/// Where iproute2's `ip netns exec` finds per-namespace files such as `hosts`.
const ETC_NETNS: &str = "/etc/netns";

/// Where a node's veth goes: the handle of the topology's underlay namespace,
/// the bridge of the node's segment there, and the link peers it knows.
struct Attachment<'a> {
    underlay: &'a rtnetlink::Handle,
    bridge_index: u32,
    peers: &'a [std::net::Ipv4Addr],
}

pub struct NetnsRuntime {
    /// Private state: credentials and agent logs live below it.
    pub state_dir: PathBuf,
    pub agent_binary: PathBuf,
    /// Hub address handed to agents, e.g. `unix:/var/lib/nextmini/hub.sock`.
    pub hub: String,
}

impl NetnsRuntime {
    /// Whether every namespace of the topology exists with its agent running:
    /// only then can a change be applied in place.
    pub fn is_running(&self, plan: &Plan) -> bool {
        plan.nodes.iter().all(|n| {
            let ns = names::netns(&plan.topology, &n.name);
            netlink::netns_exists(&ns) && !process::find_agents_in(&ns).is_empty()
        })
    }

    /// Topologies this state directory made nodes for (one credential
    /// directory each, removed by tear-down).
    pub fn topologies_with_credentials(&self) -> Vec<String> {
        std::fs::read_dir(self.state_dir.join("credentials"))
            .map(|dir| {
                dir.filter_map(|e| e.ok())
                    .filter(|e| e.path().is_dir())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn credential_dir(&self, topology: &str) -> PathBuf {
        self.state_dir.join("credentials").join(topology)
    }

    pub fn log_dir(&self, topology: &str) -> PathBuf {
        self.state_dir.join("logs").join(topology)
    }

    /// Makes the node's namespace and plugs it into its segment's bridge, with
    /// its address, link peers' neighbour entries and /etc/hosts: everything
    /// but the agent.
    async fn wire_node(
        &self,
        plan: &Plan,
        node: &PlannedNode,
        attachment: Attachment<'_>,
        hosts: &Path,
    ) -> Result<(), RuntimeError> {
        let topology = &plan.topology;
        let ns = names::netns(topology, &node.name);
        netlink::create_netns(&ns, netlink::NamespaceRole::Node).await?;
        netlink::plug_veth(
            attachment.underlay,
            &names::veth_host(topology, node.index),
            names::UNDERLAY_IFACE,
            netlink::underlay_mac(node.underlay),
            attachment.bridge_index,
            &ns,
        )
        .await?;
        let inside = netlink::connect_in(&ns).await?;
        netlink::configure_inside(
            &inside,
            names::UNDERLAY_IFACE,
            node.underlay,
            plan.underlay.prefix_len(),
            attachment.peers,
        )
        .await?;

        let etc = PathBuf::from(ETC_NETNS).join(&ns);
        std::fs::create_dir_all(&etc)
            .map_err(|e| RuntimeError::io(etc.display().to_string(), e))?;
        link_hosts(hosts, &etc.join("hosts"))
            .map_err(|e| RuntimeError::io(etc.display().to_string(), e))
    }

    /// Puts the node's credential on disk and starts its agent in its (wired)
    /// namespace, inside the node's cgroup.
    fn start_node(
        &self,
        topology: &str,
        node: &PlannedNode,
        credential: &NodeCredential,
    ) -> Result<u32, RuntimeError> {
        let dir = self.credential_dir(topology);
        write_secret(&dir.join(files::token(&node.name)), &credential.token)?;
        write_secret(
            &dir.join(files::cert(&node.name)),
            &credential.cert.cert_pem,
        )?;
        write_secret(&dir.join(files::key(&node.name)), &credential.cert.key_pem)?;
        let ns = names::netns(topology, &node.name);
        cgroup::create(&cgroup::group_name(&ns), &node.resources)?;
        self.start_agent(topology, node)
    }

    /// Suspends every agent of the topology (see [`process::pause`]); returns
    /// their pids, for [`process::resume`] should the removal not go ahead.
    pub fn pause_agents(&self, topology: &str) -> Vec<u32> {
        let pids = process::find_agents(&names::netns_prefix(topology));
        process::pause(&pids);
        pids
    }

    /// Starts the node's agent in its (existing) namespace with the credential
    /// already on disk, inside the node's cgroup when it has one. Used when the
    /// node is made, and by the supervisor when an agent died.
    pub fn start_agent(&self, topology: &str, node: &PlannedNode) -> Result<u32, RuntimeError> {
        let ns = names::netns(topology, &node.name);
        let cred_file = self.credential_dir(topology).join(&node.name);
        let log_dir = self.log_dir(topology);
        std::fs::create_dir_all(&log_dir)
            .map_err(|e| RuntimeError::io(log_dir.display().to_string(), e))?;
        let log_file = log_dir.join(format!("{}.log", node.name));
        let group = cgroup::group_name(&ns);
        let pid = process::spawn_agent(&AgentLaunch {
            binary: &self.agent_binary,
            netns: &ns,
            hub: &self.hub,
            topology,
            node: &node.name,
            credential_file: &cred_file,
            log_file: &log_file,
            metrics_socket: Some(&crate::observe::sockets::agent_socket(
                &self.state_dir,
                topology,
                &node.name,
            )),
            socks_listen: node.socks.iter().map(|s| s.listen).collect(),
        })?;
        cgroup::join(&group, pid)?;
        Ok(pid)
    }
}

/// Checks that every SOCKS address of `node` can be listened on here, in the
/// host's namespace, where its agent will bind it.
fn socks_addresses_free(node: &PlannedNode) -> Result<(), RuntimeError> {
    for (i, socks) in node.socks.iter().enumerate() {
        if let Err(e) = std::net::TcpListener::bind(socks.listen) {
            return Err(RuntimeError::Conflict(format!(
                "node {}: socks[{i}].listen {}: {e} (another topology, another node or another program holds it; choose a free address)",
                node.name, socks.listen
            )));
        }
    }
    Ok(())
}

/// The topology's /etc/hosts, which every node's `/etc/netns/<ns>/hosts`
/// is a hard link to: one file of N lines instead of N (written twice
/// each), 5 GB of writes at 10,000 nodes. `<prefix>.hosts`: no node name
/// starts with a dot, so it is no node's directory, and the topology's
/// sweep takes it with the nodes'.
fn shared_hosts_path(topology: &str) -> PathBuf {
    PathBuf::from(ETC_NETNS).join(format!("{}.hosts", names::netns_prefix(topology)))
}

/// Writes the topology's hosts file in place (its inode is what the nodes'
/// links and running `nextmini exec` bind mounts hold) and returns its path.
fn write_shared_hosts(plan: &Plan) -> Result<PathBuf, RuntimeError> {
    let path = shared_hosts_path(&plan.topology);
    std::fs::create_dir_all(ETC_NETNS).map_err(|e| RuntimeError::io(ETC_NETNS, e))?;
    std::fs::write(&path, hosts_file(plan))
        .map_err(|e| RuntimeError::io(path.display().to_string(), e))?;
    Ok(path)
}

/// Makes `node_hosts` a hard link to `shared`, unless it already is one; a
/// copy where the filesystem takes no hard link.
fn link_hosts(shared: &Path, node_hosts: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let target = std::fs::metadata(shared)?;
    match std::fs::symlink_metadata(node_hosts) {
        Ok(m) if m.dev() == target.dev() && m.ino() == target.ino() => return Ok(()),
        Ok(_) => std::fs::remove_file(node_hosts)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::hard_link(shared, node_hosts).or_else(|e| {
        tracing::debug!(error = %e, "no hard link for /etc/hosts; copied");
        std::fs::copy(shared, node_hosts).map(|_| ())
    })
}

/// Links every running node's /etc/hosts to the topology's `shared` one.
fn link_every_node(plan: &Plan, shared: &Path) {
    for node in plan.nodes.iter() {
        let dir = PathBuf::from(ETC_NETNS).join(names::netns(&plan.topology, &node.name));
        if dir.is_dir()
            && let Err(e) = link_hosts(shared, &dir.join("hosts"))
        {
            tracing::warn!(node = %node.name, error = %e, "updating /etc/hosts failed");
        }
    }
}

/// /etc/hosts for every node: node names resolve to overlay addresses, so
/// `curl http://c:8000/` works from a.
pub fn hosts_file(plan: &Plan) -> String {
    let mut out = String::from("127.0.0.1\tlocalhost\n::1\tlocalhost\n");
    for n in plan.nodes.iter() {
        out.push_str(&format!("{}\t{}\n", n.overlay, n.name));
    }
    out
}

fn write_secret(path: &std::path::Path, secret: &str) -> Result<(), RuntimeError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| RuntimeError::io(dir.display().to_string(), e))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| RuntimeError::io(path.display().to_string(), e))?;
    f.write_all(secret.as_bytes())
        .map_err(|e| RuntimeError::io(path.display().to_string(), e))
}

impl Runtime for NetnsRuntime {
    async fn create(
        &self,
        plan: &Plan,
        credentials: &Credentials,
        progress: Progress<'_>,
    ) -> Result<BTreeMap<String, u32>, RuntimeError> {
        let topology = &plan.topology;
        let leftovers = netlink::list_netns(&names::netns_prefix(topology));
        if !leftovers.is_empty() {
            return Err(RuntimeError::Conflict(format!(
                "namespaces of topology {topology} already exist ({}); run `nextmini down {topology}` first",
                leftovers.join(", ")
            )));
        }
        let all: Vec<String> = plan.nodes.iter().map(|n| n.name.clone()).collect();
        self.add_nodes(plan, &all, credentials, progress).await
    }

    async fn destroy(&self, topology: &str) -> Result<Removed, RuntimeError> {
        self.destroy_showing(topology, &|_| {}).await
    }
}

impl NetnsRuntime {
    /// [`Runtime::destroy`], telling `progress` how far it came.
    pub async fn destroy_showing(
        &self,
        topology: &str,
        progress: RemovalProgress<'_>,
    ) -> Result<Removed, RuntimeError> {
        let ns_prefix = names::netns_prefix(topology);
        let link_prefix = names::link_prefix(topology);
        let doomed_prefix = ns_prefix.clone();
        let removed = sweep(
            process::find_agents(&ns_prefix),
            move |ns| ns.starts_with(&doomed_prefix),
            |link| link.starts_with(&link_prefix) && names::is_ours_link(link),
            progress,
        )
        .await?;
        let _ = std::fs::remove_dir_all(self.credential_dir(topology));
        Ok(removed)
    }

    /// Creates the named nodes of the plan (the topology's bridge too, if it is
    /// missing) and starts their agents; every node's /etc/hosts is rewritten, so
    /// nodes that were running already resolve the new names.
    pub async fn add_nodes(
        &self,
        plan: &Plan,
        nodes: &[String],
        credentials: &Credentials,
        progress: Progress<'_>,
    ) -> Result<BTreeMap<String, u32>, RuntimeError> {
        let topology = &plan.topology;
        let wanted: Vec<&PlannedNode> = plan
            .nodes
            .iter()
            .filter(|n| nodes.contains(&n.name))
            .collect();
        // Before anything is made: a SOCKS address held by another topology or
        // program is an error now, not an agent failing later.
        let mut made: Vec<(&PlannedNode, &NodeCredential)> = Vec::with_capacity(wanted.len());
        for node in wanted {
            // A namespace by that name is someone else's (ours are gone before
            // a node is made again): refuse, and leave it as it is.
            let ns = names::netns(topology, &node.name);
            if netlink::netns_exists(&ns) {
                return Err(RuntimeError::Conflict(format!(
                    "node {}: its network namespace {ns} already exists and this run did not make it; remove it (`ip netns del {ns}`) or run `nextmini down --all`",
                    node.name
                )));
            }
            socks_addresses_free(node)?;
            let credential = credentials.nodes.get(&node.name).ok_or_else(|| {
                RuntimeError::Conflict(format!("no credential for node {}", node.name))
            })?;
            made.push((node, credential));
        }
        write_secret(
            &self.credential_dir(topology).join(files::CA),
            &credentials.ca_pem,
        )?;
        let segments = plan
            .nodes
            .iter()
            .map(|n| names::segment_of(n.index) + 1)
            .max()
            .unwrap_or(1);
        if segments > names::MAX_SEGMENTS {
            return Err(RuntimeError::Conflict(format!(
                "topology {topology} has {} nodes; namespace mode holds at most {} ({} bridges of {} nodes: a Linux bridge takes at most 1,024 ports)",
                plan.nodes.len(),
                names::MAX_SEGMENTS * names::NODES_PER_BRIDGE,
                names::MAX_SEGMENTS,
                names::NODES_PER_BRIDGE
            )));
        }
        // Thousands of agents reach the machine's task and descriptor limits
        // before anything else: raise or refuse before the first node exists.
        let agents = plan.nodes.len() as u64;
        for raised in
            super::limits::make_room_for_agents(agents, &super::limits::Sources::this_machine())?
        {
            tracing::warn!(%topology, "{raised}");
        }
        super::limits::check_open_files(agents)?;
        if let Some(raised) = super::limits::make_room_for_floods(
            agents,
            u64::from(names::NODES_PER_BRIDGE),
            std::path::Path::new("/proc/sys/net/core"),
        )? {
            tracing::warn!(%topology, "{raised}");
        }
        // Each end of a link holds a neighbour entry for the other in the
        // kernel's one table; raise its limits before the first node exists.
        for raised in super::neigh::make_room(2 * plan.links.len() as u64)? {
            tracing::warn!(%topology, "{raised}");
        }
        let underlay = open_underlay(topology).await?;
        let bridges = ensure_segment_bridges(&underlay, topology, segments).await?;
        let hosts = write_shared_hosts(plan)?;
        let peers = link_peers(plan);
        // An agent starts once its node and link peers are wired (see
        // `start_gate`); a failure stops further starts, the wiring under way
        // finishes, and what was made is left for `destroy`/`remove_nodes`.
        let names_made: Vec<&str> = made.iter().map(|(n, _)| n.name.as_str()).collect();
        let mut gate = StartGate::new(plan, &names_made);
        let mut wiring = futures::stream::iter(made.iter().enumerate())
            .map(|(place, (node, _))| {
                let hosts = hosts.as_path();
                let bridges = &bridges;
                let underlay = &underlay;
                let peers = peers.get(node.name.as_str()).map_or(&[][..], Vec::as_slice);
                async move {
                    let bridge_index = bridges[names::segment_of(node.index) as usize];
                    let attachment = Attachment {
                        underlay,
                        bridge_index,
                        peers,
                    };
                    self.wire_node(plan, node, attachment, hosts)
                        .await
                        .map_err(|e| match e {
                            RuntimeError::Netlink(m) => {
                                RuntimeError::Netlink(format!("node {}: {m}", node.name))
                            }
                            other => other,
                        })?;
                    Ok::<_, RuntimeError>(place)
                }
            })
            .buffer_unordered(PARALLEL_NODES);
        let mut created = BTreeMap::new();
        let mut failed = None;
        while let Some(wired) = wiring.next().await {
            let place = match wired {
                Ok(place) => place,
                Err(e) => {
                    failed.get_or_insert(e);
                    continue;
                }
            };
            progress(Stage::Wired, &made[place].0.name);
            if failed.is_some() {
                continue;
            }
            for ready in gate.wired(place) {
                let (node, credential) = made[ready];
                match self.start_node(topology, node, credential) {
                    Ok(pid) => {
                        progress(Stage::Started, &node.name);
                        created.insert(node.name.clone(), pid);
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        // The shared file already names every node of the plan; only nodes
        // made before nodes shared one still hold a file of their own.
        link_every_node(plan, &hosts);
        Ok(created)
    }

    /// Rewrites the topology's /etc/hosts, which every running node of the
    /// plan shares (a node whose file is its own, made before nodes shared
    /// one, is linked to it).
    pub fn write_hosts(&self, plan: &Plan) {
        match write_shared_hosts(plan) {
            Ok(shared) => link_every_node(plan, &shared),
            Err(e) => {
                tracing::warn!(topology = %plan.topology, error = %e, "updating /etc/hosts failed");
            }
        }
    }

    /// Stops and removes the named nodes of a topology (their agents, namespaces,
    /// veths, /etc/netns files, cgroups and credentials); the rest keep running.
    pub async fn remove_nodes(
        &self,
        topology: &str,
        nodes: &[String],
    ) -> Result<Removed, RuntimeError> {
        let namespaces: Vec<String> = nodes.iter().map(|n| names::netns(topology, n)).collect();
        let pids = namespaces
            .iter()
            .flat_map(|ns| process::find_agents_in(ns))
            .collect();
        let doomed = namespaces.clone();
        let removed = sweep(
            pids,
            move |ns| doomed.iter().any(|n| n == ns),
            |_| false,
            &|_| {},
        )
        .await?;
        let dir = self.credential_dir(topology);
        for node in nodes {
            for file in [files::token(node), files::cert(node), files::key(node)] {
                let _ = std::fs::remove_file(dir.join(file));
            }
        }
        Ok(removed)
    }

    /// Removes everything any run of this runtime made on this machine, whether
    /// or not the store still knows the topology (e.g. after its data was wiped).
    pub async fn destroy_everything(&self) -> Result<Removed, RuntimeError> {
        let removed = sweep(
            process::find_agents("nm-"),
            names::is_ours_netns,
            names::is_ours_link,
            &|_| {},
        )
        .await?;
        let _ = std::fs::remove_dir_all(self.state_dir.join("credentials"));
        Ok(removed)
    }
}

/// Each node's link peers' underlay addresses, which its namespace gets
/// neighbour entries for.
fn link_peers(plan: &Plan) -> HashMap<&str, Vec<std::net::Ipv4Addr>> {
    let underlay: HashMap<&str, std::net::Ipv4Addr> = plan
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.underlay))
        .collect();
    let mut peers: HashMap<&str, Vec<std::net::Ipv4Addr>> = HashMap::new();
    for link in &plan.links {
        let (a, b) = (link.dialer.as_str(), link.acceptor.as_str());
        if let (Some(a_addr), Some(b_addr)) = (underlay.get(a), underlay.get(b)) {
            peers.entry(a).or_default().push(*b_addr);
            peers.entry(b).or_default().push(*a_addr);
        }
    }
    for addrs in peers.values_mut() {
        addrs.sort_unstable();
        addrs.dedup();
    }
    peers
}

/// A netlink handle in the topology's underlay namespace, which is made if
/// missing. A topology whose bridge is in the host's namespace was started by a
/// release before the underlay had a namespace of its own; its new nodes could
/// not reach the old, so it is refused before any node is made.
async fn open_underlay(topology: &str) -> Result<rtnetlink::Handle, RuntimeError> {
    let host = connect_here()?;
    if netlink::link_index(&host, &names::bridge(topology))
        .await?
        .is_some()
    {
        return Err(RuntimeError::Conflict(format!(
            "topology {topology} was started by an earlier release (its bridge {} is in the host's namespace); run `nextmini down {topology}` and `up` again before adding nodes",
            names::bridge(topology)
        )));
    }
    let underlay = names::underlay_netns(topology);
    if !netlink::netns_exists(&underlay) {
        netlink::create_netns(&underlay, netlink::NamespaceRole::Underlay).await?;
    }
    netlink::connect_in(&underlay).await
}

/// The topology's bridges, one per segment of `NODES_PER_BRIDGE` nodes, each
/// chained to the first; returns their interface indexes by segment.
async fn ensure_segment_bridges(
    underlay: &rtnetlink::Handle,
    topology: &str,
    segments: u32,
) -> Result<Vec<u32>, RuntimeError> {
    let root = netlink::ensure_bridge(underlay, &names::bridge(topology)).await?;
    let mut bridges = vec![root];
    for segment in 1..segments {
        let index =
            netlink::ensure_bridge(underlay, &names::segment_bridge(topology, segment)).await?;
        let (up, down) = names::segment_uplink(topology, segment);
        netlink::ensure_bridge_chain(underlay, &up, index, &down, root).await?;
        bridges.push(index);
    }
    Ok(bridges)
}

/// Agents first (a namespace with a live process in it would linger), then
/// every other process still inside a doomed namespace (an application a user
/// started with `nextmini exec`, an agent the supervisor restarted a moment
/// ago), then namespaces and their /etc/netns files, then host interfaces. It
/// returns only when those processes are gone, so `down` followed at once by
/// `up` never meets the old agents.
async fn sweep(
    pids: Vec<u32>,
    netns_matches: impl Fn(&str) -> bool + Send + 'static,
    link_matches: impl Fn(&str) -> bool,
    progress: RemovalProgress<'_>,
) -> Result<Removed, RuntimeError> {
    progress(Removal::StoppingAgents(pids.len()));
    let (processes, netns_matches) = tokio::task::spawn_blocking(move || {
        let mut stopped = process::stop(&pids, Duration::from_secs(2));
        let doomed: Vec<PathBuf> = netlink::list_netns("")
            .into_iter()
            .filter(|ns| netns_matches(ns))
            .map(|ns| netlink::netns_path(&ns))
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let inside = process::in_namespaces(&doomed);
            if inside.is_empty() || std::time::Instant::now() > deadline {
                break;
            }
            stopped += process::stop(&inside, Duration::from_millis(500));
        }
        (stopped, netns_matches)
    })
    .await
    .map_err(|e| RuntimeError::Netlink(e.to_string()))?;
    let mut namespaces = 0;
    let mut underlay_links = 0;
    let doomed: Vec<String> = netlink::list_netns("")
        .into_iter()
        .filter(|ns| netns_matches(ns))
        .collect();
    let total = doomed.len();
    for (done, ns) in doomed.into_iter().enumerate() {
        progress(Removal::Namespaces { done, total });
        // The underlay is counted by the interfaces it held, not as a node.
        let underlay = names::is_underlay_netns(&ns);
        if underlay {
            underlay_links += underlay_interfaces(&ns).await;
        }
        if netlink::delete_netns(&ns)? && !underlay {
            namespaces += 1;
        }
    }
    progress(Removal::Namespaces { done: total, total });
    if let Ok(dir) = std::fs::read_dir(ETC_NETNS) {
        for entry in dir.filter_map(|e| e.ok()) {
            if netns_matches(&entry.file_name().to_string_lossy()) {
                // The topology's shared hosts file is a file, the nodes' are directories.
                let _ = match entry.file_type() {
                    Ok(t) if t.is_dir() => std::fs::remove_dir_all(entry.path()),
                    _ => std::fs::remove_file(entry.path()),
                };
            }
        }
    }
    // Host interfaces of topologies started before the underlay had a namespace.
    let host = connect_here()?;
    let links = underlay_links + netlink::delete_links(&host, &link_matches).await?;
    cgroup::remove_matching(&netns_matches);
    Ok(Removed {
        processes,
        namespaces,
        links,
    })
}

/// The topology's bridges and veth ends in its underlay namespace (loopback
/// aside), which go with it.
async fn underlay_interfaces(ns: &str) -> usize {
    match netlink::connect_in(ns).await {
        Ok(handle) => netlink::count_links(&handle, &names::is_ours_link)
            .await
            .unwrap_or(0),
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_knows_exactly_its_link_peers() {
        let plan = crate::plan::fixtures::line3();
        let underlay = |name: &str| {
            plan.nodes
                .iter()
                .find(|n| n.name == name)
                .expect("node")
                .underlay
        };
        let peers = link_peers(&plan);
        let mut middle = vec![underlay("a"), underlay("c")];
        middle.sort_unstable();
        assert_eq!(peers["b"], middle);
        assert_eq!(peers["a"], vec![underlay("b")]);
        assert_eq!(peers["c"], vec![underlay("b")]);
        assert_eq!(
            netlink::underlay_mac("198.18.1.2".parse().expect("address")),
            [0x02, 0x6e, 198, 18, 1, 2]
        );
    }

    #[test]
    fn every_node_links_the_one_hosts_file() {
        let dir = std::env::temp_dir().join(format!("nm-hosts-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a")).expect("dir");
        let shared = dir.join("t.hosts");
        std::fs::write(&shared, "198.18.0.1\ta\n").expect("shared");
        let mine = dir.join("a/hosts");
        std::fs::write(&mine, "an older file of its own\n").expect("own file");
        link_hosts(&shared, &mine).expect("link");
        link_hosts(&shared, &mine).expect("already linked");
        // Rewritten in place, as `write_shared_hosts` does: every node sees it.
        std::fs::write(&shared, "198.18.0.1\ta\n198.18.0.2\tb\n").expect("rewrite");
        assert_eq!(
            std::fs::read_to_string(&mine).expect("read"),
            "198.18.0.1\ta\n198.18.0.2\tb\n"
        );
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
