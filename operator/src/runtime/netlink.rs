//! Netlink (through rtnetlink) and namespace plumbing for the netns runtime.

use super::RuntimeError;
use futures::TryStreamExt;
use rtnetlink::packet_route::link::{
    AfSpecInet6, AfSpecUnspec, In6AddrGenMode, InfoData, InfoVeth, LinkAttribute,
};
use rtnetlink::packet_route::neighbour::{NeighbourFlags, NeighbourState};
use rtnetlink::{Handle, LinkBridge, LinkBridgePort, LinkUnspec, LinkVeth};
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

pub const NETNS_DIR: &str = "/run/netns";

pub fn netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

/// Whether a named network namespace exists (made by anyone, `ip netns` included).
pub fn netns_exists(name: &str) -> bool {
    netns_path(name).exists()
}

/// A netlink handle in the caller's namespace.
pub fn connect_here() -> Result<Handle, RuntimeError> {
    let (conn, handle, _) =
        rtnetlink::new_connection().map_err(|e| RuntimeError::io("netlink socket", e))?;
    tokio::spawn(conn);
    Ok(handle)
}

/// A netlink handle whose socket lives in the named namespace: the socket is
/// opened on a short-lived thread that entered the namespace, and keeps talking
/// to that namespace after the thread is gone.
pub async fn connect_in(ns: &str) -> Result<Handle, RuntimeError> {
    let path = netns_path(ns);
    let runtime = tokio::runtime::Handle::current();
    let opened = std::thread::spawn(move || -> std::io::Result<_> {
        let file = File::open(&path)?;
        nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)?;
        let _guard = runtime.enter();
        rtnetlink::new_connection()
    })
    .join()
    .map_err(|_| RuntimeError::Netlink("namespace thread panicked".into()))?;
    let (conn, handle, _) = opened.map_err(|e| RuntimeError::io(format!("netlink in {ns}"), e))?;
    tokio::spawn(conn);
    Ok(handle)
}

/// What a new namespace is for, which decides the settings written in it.
///
/// Each sysctl written in a new namespace costs a path lookup that grows with
/// the number of namespaces (the kernel keeps every namespace's
/// `/proc/sys/net` entry in one hash chain): at 6,000 namespaces those lookups
/// were a tenth of the machine's CPU while nodes were made. So namespace mode's
/// nodes, thousands of them, get none; their interfaces keep IPv6 quiet through
/// netlink instead (`configure_inside`, and the agent for its TUN device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamespaceRole {
    /// A namespace-mode node: root enters it, nothing is written.
    Node,
    /// A packed worker's node: its pod drops CAP_NET_RAW, so ICMP echo sockets
    /// are allowed for everyone; IPv6 off for every interface.
    PackedNode,
    /// A topology's underlay, holding its bridges and the nodes' veth ends:
    /// IPv6 off for every interface, bridged frames not through iptables.
    Underlay,
}

/// Creates `/run/netns/<name>` the way iproute2 does, so `ip netns exec` works
/// on it: a thread unshares a new network namespace and bind-mounts it there.
pub async fn create_netns(name: &str, role: NamespaceRole) -> Result<(), RuntimeError> {
    let name = name.to_string();
    tokio::task::spawn_blocking(move || create_netns_blocking(&name, role))
        .await
        .map_err(|e| RuntimeError::Netlink(e.to_string()))?
}

fn create_netns_blocking(name: &str, role: NamespaceRole) -> Result<(), RuntimeError> {
    use nix::mount::{MsFlags, mount};
    std::fs::create_dir_all(NETNS_DIR).map_err(|e| RuntimeError::io(NETNS_DIR, e))?;
    make_netns_dir_shared()?;
    let path = netns_path(name);
    if path.exists() {
        return Err(RuntimeError::Conflict(format!(
            "network namespace {name} already exists"
        )));
    }
    File::create(&path).map_err(|e| RuntimeError::io(path.display().to_string(), e))?;
    let target = path.clone();
    let made = std::thread::spawn(move || -> nix::Result<()> {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)?;
        // /proc/sys/net is the calling thread's namespace: this one's now.
        match role {
            NamespaceRole::Node => {}
            NamespaceRole::PackedNode => {
                disable_ipv6_by_default();
                allow_ping_sockets();
            }
            NamespaceRole::Underlay => {
                disable_ipv6_by_default();
                bridged_frames_skip_iptables();
            }
        }
        mount(
            Some("/proc/thread-self/ns/net"),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
    })
    .join()
    .map_err(|_| RuntimeError::Netlink("namespace thread panicked".into()))?;
    if let Err(e) = made {
        let _ = std::fs::remove_file(&path);
        return Err(RuntimeError::io(
            format!("creating namespace {name}"),
            e.into(),
        ));
    }
    Ok(())
}

/// Turns IPv6 off for every interface created in or moved into the calling
/// thread's namespace from now on.
///
/// The emulated network is IPv4. Left on, every veth, bridge port and TUN device
/// that comes up sends router solicitations, MLD reports and DAD probes as
/// multicast, which the topology's bridge floods to every other node, where the
/// kernel routes each copy: work that grows with the square of the node count
/// (17% of the machine's CPU while 500 nodes started, in softirq). Loopback
/// keeps ::1, as it exists before the namespace's default changes. A kernel
/// without IPv6 has no such file, which is fine.
///
/// Only ever the namespace's default: writing one interface's `disable_ipv6`
/// needs the kernel's RTNL lock, which the kernel only tries to take and, while
/// any other node's set-up or agent holds it, restarts the write from user
/// space again and again. With the bridge ports in the host's namespace, these
/// writes were 53% of `up`'s samples at 3,000 nodes (perf); so the ports live
/// in the topology's underlay namespace instead, whose default is off.
fn disable_ipv6_by_default() {
    let path = "/proc/sys/net/ipv6/conf/default/disable_ipv6";
    if let Err(e) = std::fs::write(path, "1")
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::debug!(%path, error = %e, "cannot turn IPv6 off");
    }
}

/// Bridged frames in the calling thread's namespace no longer pass through
/// iptables. With `br_netfilter` loaded (container hosts load it), a new
/// namespace sends every frame its bridges forward through the IPv4 hooks,
/// whatever the bridge's own setting says; the underlay has no rules to match.
/// Without the module there is no such file, which is fine.
fn bridged_frames_skip_iptables() {
    for table in ["iptables", "ip6tables", "arptables"] {
        let path = format!("/proc/sys/net/bridge/bridge-nf-call-{table}");
        if let Err(e) = std::fs::write(&path, "0")
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::debug!(%path, error = %e, "bridged frames still pass through netfilter");
        }
    }
}

/// The range of group ids that may open ICMP echo sockets in a namespace.
pub const PING_GROUP_RANGE: &str = "0 2147483647";

/// Lets every process in the calling thread's namespace ping without raw
/// sockets (`net.ipv4.ping_group_range`): in a worker pod that drops
/// CAP_NET_RAW, `nextmini exec <node> -- ping` otherwise fails with
/// "permission denied (are you root?)".
pub fn allow_ping_sockets() {
    let path = "/proc/sys/net/ipv4/ping_group_range";
    if let Err(e) = std::fs::write(path, PING_GROUP_RANGE) {
        tracing::warn!(%path, error = %e, "cannot allow ICMP echo sockets: ping needs CAP_NET_RAW in this namespace");
    }
}

/// Whether /run/netns has been made a shared mount point by this process.
static NETNS_DIR_SHARED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Like iproute2: /run/netns is a shared mount point, so namespaces mounted
/// later are seen by every mount namespace (e.g. inside `ip netns exec`).
/// Done once per process: remounting with MS_REC walks every namespace
/// already mounted below it.
fn make_netns_dir_shared() -> Result<(), RuntimeError> {
    use std::sync::atomic::Ordering;
    if NETNS_DIR_SHARED.load(Ordering::Acquire) {
        return Ok(());
    }
    make_netns_dir_shared_now()?;
    NETNS_DIR_SHARED.store(true, Ordering::Release);
    Ok(())
}

fn make_netns_dir_shared_now() -> Result<(), RuntimeError> {
    use nix::mount::{MsFlags, mount};
    let flags = MsFlags::MS_SHARED | MsFlags::MS_REC;
    if mount(None::<&str>, NETNS_DIR, None::<&str>, flags, None::<&str>).is_ok() {
        return Ok(());
    }
    // Not a mount point yet: bind it onto itself first.
    mount(
        Some(NETNS_DIR),
        NETNS_DIR,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| RuntimeError::io("bind-mounting /run/netns", e.into()))?;
    mount(None::<&str>, NETNS_DIR, None::<&str>, flags, None::<&str>)
        .map_err(|e| RuntimeError::io("sharing /run/netns", e.into()))
}

/// Unmounts and removes a namespace; missing is fine.
pub fn delete_netns(name: &str) -> Result<bool, RuntimeError> {
    let path = netns_path(name);
    if !path.exists() {
        return Ok(false);
    }
    let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
    std::fs::remove_file(&path).map_err(|e| RuntimeError::io(path.display().to_string(), e))?;
    Ok(true)
}

pub fn list_netns(prefix: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(NETNS_DIR) else {
        return vec![];
    };
    let mut names: Vec<String> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names
}

pub async fn link_index(handle: &Handle, name: &str) -> Result<Option<u32>, RuntimeError> {
    let mut links = handle.link().get().match_name(name).execute();
    match links.try_next().await {
        Ok(Some(msg)) => Ok(Some(msg.header.index)),
        Ok(None) => Ok(None),
        // The kernel answers ENODEV for an unknown name.
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -19 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

pub async fn require_index(handle: &Handle, name: &str) -> Result<u32, RuntimeError> {
    link_index(handle, name)
        .await?
        .ok_or_else(|| RuntimeError::Netlink(format!("interface {name} not found")))
}

/// Creates the topology's bridge (up, no address: the underlay never touches the
/// host's routing) unless it exists. Bridged frames skip iptables, so a host
/// firewall with a DROP forward policy cannot cut the emulated links. Made in
/// the topology's underlay namespace, whose IPv6 default is off (see
/// `create_netns`), as it is for every interface below.
pub async fn ensure_bridge(handle: &Handle, name: &str) -> Result<u32, RuntimeError> {
    if let Some(index) = link_index(handle, name).await? {
        return Ok(index);
    }
    handle
        .link()
        .add(
            LinkBridge::new(name)
                .nf_call_iptables(false)
                .nf_call_ip6tables(false)
                .nf_call_arptables(false)
                .build(),
        )
        .execute()
        .await?;
    let index = require_index(handle, name).await?;
    handle
        .link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await?;
    Ok(index)
}

/// Chains two bridges with a veth pair (`a_name` on `a_bridge`, `b_name` on
/// `b_bridge`), unless the pair exists.
pub async fn ensure_bridge_chain(
    host: &Handle,
    a_name: &str,
    a_bridge: u32,
    b_name: &str,
    b_bridge: u32,
) -> Result<(), RuntimeError> {
    if link_index(host, a_name).await?.is_some() {
        return Ok(());
    }
    host.link()
        .add(LinkVeth::new(a_name, b_name).controller(a_bridge).build())
        .execute()
        .await?;
    host.link()
        .set(
            LinkUnspec::new_with_name(b_name)
                .controller(b_bridge)
                .up()
                .build(),
        )
        .execute()
        .await?;
    host.link()
        .set(LinkUnspec::new_with_name(a_name).up().build())
        .execute()
        .await?;
    Ok(())
}

/// Creates a veth pair whose outer end joins the bridge (in the namespace of
/// `host`, the topology's underlay) and whose other end is made directly inside
/// the node's namespace, already named `inside_name`.
///
/// Made in place rather than made here and moved: moving an interface between
/// namespaces unregisters and registers it again and waits for RCU grace
/// periods while holding the kernel's RTNL lock, which every other node's
/// set-up (and every agent's TUN device) needs. Measured with 200 namespaces,
/// made and moved took 38 ms per node, made in place 9.6 ms.
pub async fn plug_veth(
    host: &Handle,
    host_name: &str,
    inside_name: &str,
    inside_mac: [u8; 6],
    bridge_index: u32,
    ns: &str,
) -> Result<(), RuntimeError> {
    let ns_file =
        File::open(netns_path(ns)).map_err(|e| RuntimeError::io(format!("opening {ns}"), e))?;
    // The inside end must not come up here: the kernel opens it before the two
    // ends know each other, and a veth without its peer refuses with ENOTCONN.
    // configure_inside brings it up.
    let inside = LinkUnspec::new_with_name(inside_name)
        .setns_by_fd(ns_file.as_raw_fd())
        .address(inside_mac.to_vec())
        .build();
    host.link()
        .add(
            LinkVeth::new(host_name, inside_name)
                .set_info_data(InfoData::Veth(InfoVeth::Peer(inside)))
                .controller(bridge_index)
                .build(),
        )
        .execute()
        .await?;
    let port = require_index(host, host_name).await?;
    // Unknown unicast (a frame to a node that has not sent yet, or is not made
    // yet) is flooded only to the ports between bridges, not to every node:
    // each port is told its node's address instead of learning it. Flooded to
    // every port, each SYN an agent retried towards a peer not yet made was
    // copied to all the nodes, a fifth of the machine's CPU while 6,000 nodes
    // came up.
    host.neighbours()
        .add_bridge(port, &inside_mac)
        .state(NeighbourState::Noarp)
        .flags(NeighbourFlags::Controller)
        .replace()
        .execute()
        .await?;
    host.link()
        .set_port(LinkBridgePort::new(port).flood(false).up().build())
        .execute()
        .await?;
    Ok(())
}

/// The MAC address of the node whose underlay address is `addr`: locally
/// administered, and the address itself in the last four bytes, so that any
/// node knows any other's without asking.
pub fn underlay_mac(addr: Ipv4Addr) -> [u8; 6] {
    let [a, b, c, d] = addr.octets();
    [0x02, 0x6e, a, b, c, d]
}

/// Inside the namespace: gives the veth end its underlay address, the link
/// peers' addresses permanent neighbour entries, and brings it and loopback up.
///
/// The entries spare the underlay ARP: a request is a broadcast, which the
/// topology's bridges copy to every node, where the kernel looks up a route
/// for each copy; at 10,000 nodes that is 10,000 copies per request, and
/// every node asks for each peer (and again while a peer is not up yet). A
/// peer without an entry (a link added later) is still found by ARP.
pub async fn configure_inside(
    ns: &Handle,
    iface: &str,
    addr: Ipv4Addr,
    prefix_len: u8,
    peers: &[Ipv4Addr],
) -> Result<(), RuntimeError> {
    let index = require_index(ns, iface).await?;
    ns.address()
        .add(index, IpAddr::V4(addr), prefix_len)
        .execute()
        .await?;
    for peer in peers {
        ns.neighbours()
            .add(index, IpAddr::V4(*peer))
            .link_layer_address(&underlay_mac(*peer))
            .replace()
            .execute()
            .await?;
    }
    // No IPv6 address, so none of the multicast an address brings (DAD,
    // router solicitations, MLD reports), which the bridges would copy to
    // every node: set before the interface comes up, when the kernel would
    // make its link-local address.
    ns.link()
        .set(
            LinkUnspec::new_with_index(index)
                .append_extra_attribute(no_ipv6_addresses())
                .build(),
        )
        .execute()
        .await?;
    ns.link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await?;
    ns.link()
        .set(LinkUnspec::new_with_name("lo").up().build())
        .execute()
        .await?;
    Ok(())
}

/// `addrgenmode none`: the interface gets no IPv6 address of its own.
fn no_ipv6_addresses() -> LinkAttribute {
    LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet6(vec![AfSpecInet6::AddrGenMode(
        In6AddrGenMode::None,
    )])])
}

/// How many interfaces of the handle's namespace have a name that `matches`.
pub async fn count_links(
    handle: &Handle,
    matches: &dyn Fn(&str) -> bool,
) -> Result<usize, RuntimeError> {
    let mut stream = handle.link().get().execute();
    let mut count = 0;
    while let Some(msg) = stream.try_next().await? {
        let named = msg
            .attributes
            .iter()
            .any(|a| matches!(a, LinkAttribute::IfName(n) if matches(n)));
        count += usize::from(named);
    }
    Ok(count)
}

/// Deletes every host interface whose name `matches`.
pub async fn delete_links(
    handle: &Handle,
    matches: &dyn Fn(&str) -> bool,
) -> Result<usize, RuntimeError> {
    let mut stream = handle.link().get().execute();
    let mut doomed = Vec::new();
    while let Some(msg) = stream.try_next().await? {
        let name = msg.attributes.iter().find_map(|a| match a {
            LinkAttribute::IfName(n) => Some(n.clone()),
            _ => None,
        });
        if name.is_some_and(|n| matches(&n)) {
            doomed.push(msg.header.index);
        }
    }
    let mut removed = 0;
    for index in doomed {
        match handle.link().del(index).execute().await {
            Ok(()) => removed += 1,
            // Deleting one end of a veth removes the other: already gone is fine.
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -19 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(removed)
}
