//! Netlink (through rtnetlink) and namespace plumbing for the netns runtime.

use super::RuntimeError;
use futures::TryStreamExt;
use rtnetlink::{Handle, LinkBridge, LinkUnspec, LinkVeth};
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

pub const NETNS_DIR: &str = "/run/netns";

pub fn netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
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

/// Creates `/run/netns/<name>` the way iproute2 does, so `ip netns exec` works
/// on it: a thread unshares a new network namespace and bind-mounts it there.
pub fn create_netns(name: &str) -> Result<(), RuntimeError> {
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

/// Like iproute2: /run/netns is a shared mount point, so namespaces mounted
/// later are seen by every mount namespace (e.g. inside `ip netns exec`).
fn make_netns_dir_shared() -> Result<(), RuntimeError> {
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
/// firewall with a DROP forward policy cannot cut the emulated links.
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
                .up()
                .build(),
        )
        .execute()
        .await?;
    require_index(handle, name).await
}

/// Creates a veth pair, puts the host end on the bridge and moves the other end
/// into the namespace.
pub async fn plug_veth(
    host: &Handle,
    host_name: &str,
    peer_name: &str,
    bridge_index: u32,
    ns: &str,
) -> Result<(), RuntimeError> {
    host.link()
        .add(LinkVeth::new(host_name, peer_name).build())
        .execute()
        .await?;
    let host_index = require_index(host, host_name).await?;
    host.link()
        .set(
            LinkUnspec::new_with_index(host_index)
                .controller(bridge_index)
                .up()
                .build(),
        )
        .execute()
        .await?;
    let ns_file =
        File::open(netns_path(ns)).map_err(|e| RuntimeError::io(format!("opening {ns}"), e))?;
    let peer_index = require_index(host, peer_name).await?;
    host.link()
        .set(
            LinkUnspec::new_with_index(peer_index)
                .setns_by_fd(ns_file.as_raw_fd())
                .build(),
        )
        .execute()
        .await?;
    Ok(())
}

/// Inside the namespace: renames the moved veth end, gives it the underlay
/// address and brings it and loopback up.
pub async fn configure_inside(
    ns: &Handle,
    moved: &str,
    iface: &str,
    addr: Ipv4Addr,
    prefix_len: u8,
) -> Result<(), RuntimeError> {
    let index = require_index(ns, moved).await?;
    ns.link()
        .set(
            LinkUnspec::new_with_index(index)
                .name(iface.to_string())
                .build(),
        )
        .execute()
        .await?;
    ns.address()
        .add(index, IpAddr::V4(addr), prefix_len)
        .execute()
        .await?;
    ns.link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await?;
    let lo = require_index(ns, "lo").await?;
    ns.link()
        .set(LinkUnspec::new_with_index(lo).up().build())
        .execute()
        .await?;
    Ok(())
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
            rtnetlink::packet_route::link::LinkAttribute::IfName(n) => Some(n.clone()),
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
