//! `nextmini worker`: what runs in a packed worker pod. It makes a network
//! namespace per node of its share (the netns runtime's namespaces, without the
//! bridge and veth: no node has an underlay of its own), a cgroup per node with
//! limits, starts each node's agent and restarts it when it dies. On SIGTERM it
//! stops the agents and removes every namespace and cgroup it made.
//!
//! The agents stay in the pod's network namespace, where the hub Service, the
//! other workers' pods and the cluster DNS are, and put only their TUN device
//! into the node's namespace (`nextmini-agent --tun-netns`). Their links and
//! relays listen on the node's own ports of the pod, so no address is
//! translated anywhere.

use super::packed::WorkerNode;
use super::{RuntimeError, cgroup, names, netlink, node_hosts};
use crate::pki::files;
use futures::StreamExt;
use rtnetlink::LinkUnspec;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// Namespaces set up at once.
const PARALLEL_NODES: usize = 8;
/// Restart delays of an agent that keeps dying.
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// An agent that ran this long before it died starts again without delay.
const HEALTHY_RUN: Duration = Duration::from_secs(60);
/// SIGTERM, then this long, then SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub topology: String,
    /// What agents dial (the hub Service).
    pub hub: String,
    /// `<dir>/<node>` holds each node's credential.
    pub credential_dir: PathBuf,
    pub agent_binary: PathBuf,
    pub nodes: Vec<WorkerNode>,
    /// The hosts ConfigMaps' files, which become every node's /etc/hosts.
    pub hosts_dir: Option<PathBuf>,
    /// Agents serve metrics and captures on sockets below it
    /// (`observe::sockets::agent_socket`).
    pub state_dir: PathBuf,
}

/// Where `ip netns exec` finds each namespace's hosts file.
const ETC_NETNS: &str = "/etc/netns";

impl WorkerConfig {
    fn netns(&self, node: &str) -> String {
        names::netns(&self.topology, node)
    }

    /// The agent's command line; `--tun-netns` keeps the agent in the pod's
    /// namespace with only its TUN device in the node's.
    pub fn agent_command(&self, node: &WorkerNode) -> Command {
        let mut command = Command::new(&self.agent_binary);
        command
            .arg("--tun-netns")
            .arg(self.netns(&node.name))
            .arg("--hub")
            .arg(&self.hub)
            .arg("--topology")
            .arg(&self.topology)
            .arg("--node")
            .arg(&node.name)
            .arg("--credential-file")
            .arg(self.credential_dir.join(files::token(&node.name)))
            .arg("--metrics-socket")
            .arg(crate::observe::sockets::agent_socket(
                &self.state_dir,
                &self.topology,
                &node.name,
            ));
        for addr in &node.socks {
            command.arg("--socks-listen").arg(addr.to_string());
        }
        command
    }
}

/// Runs the worker until `shutdown` resolves, then cleans up. Fails only when
/// a node cannot be set up at all (the pod then restarts and says why).
/// Container runtimes mount /proc/sys read-only, so the settings each node's
/// namespace gets when it is made (`netlink::create_netns`: IPv6 off, ICMP echo
/// sockets allowed) would not take. The worker holds CAP_SYS_ADMIN already (it
/// makes namespaces and cgroups); remounting that one bind mount read-write
/// grants nothing the capability does not.
fn make_proc_sys_writable() -> Result<(), RuntimeError> {
    use nix::mount::{MsFlags, mount};
    use nix::sys::statvfs::{FsFlags, statvfs};
    let dir = std::path::Path::new("/proc/sys");
    let read_only = statvfs(dir).is_ok_and(|s| s.flags().contains(FsFlags::ST_RDONLY));
    if !read_only {
        return Ok(());
    }
    let flags = MsFlags::MS_REMOUNT
        | MsFlags::MS_BIND
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | MsFlags::MS_NOEXEC;
    mount(None::<&str>, dir, None::<&str>, flags, None::<&str>)
        .map_err(|e| RuntimeError::io("remounting /proc/sys writable", e.into()))
}

pub async fn run(
    config: WorkerConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), RuntimeError> {
    if !config.agent_binary.exists() {
        return Err(RuntimeError::Conflict(format!(
            "agent binary {} not found",
            config.agent_binary.display()
        )));
    }
    // The token and the control-stream certificate, key and CA, laid out as
    // the agent looks for them beside its credential file.
    for node in &config.nodes {
        let n = &node.name;
        for file in [files::token(n), files::cert(n), files::key(n)]
            .into_iter()
            .chain([files::CA.to_string()])
        {
            let path = config.credential_dir.join(file);
            if !path.exists() {
                return Err(RuntimeError::Conflict(format!(
                    "node {n}: no credential file {}",
                    path.display()
                )));
            }
        }
    }
    // A restarted container finds the files of its predecessor's namespaces
    // (their mounts went with its mount namespace).
    remove_namespaces(&config).await;
    if let Err(e) = make_proc_sys_writable() {
        tracing::warn!(error = %e, "nodes keep the kernel's defaults (IPv6 on, ping needing CAP_NET_RAW)");
    }
    let limits = config
        .nodes
        .iter()
        .any(|n| n.cpu_millis.is_some() || n.memory_bytes.is_some());
    let cgroups = limits
        && match cgroup::prepare_nested() {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "nodes run without limits of their own; the pod's limits hold them all");
                false
            }
        };
    let started = Instant::now();
    let made: Vec<Result<(), RuntimeError>> = futures::stream::iter(&config.nodes)
        .map(|node| {
            let config = &config;
            async move { make_node(config, node, cgroups).await }
        })
        .buffer_unordered(PARALLEL_NODES)
        .collect()
        .await;
    if let Some(e) = made.into_iter().find_map(Result::err) {
        remove_namespaces(&config).await;
        return Err(e);
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let namespaces: Vec<String> = config.nodes.iter().map(|n| config.netns(&n.name)).collect();
    let hosts = config.hosts_dir.clone().map(|dir| {
        tokio::spawn(node_hosts::keep_current(
            dir,
            ETC_NETNS.into(),
            namespaces.clone(),
            stop_rx.clone(),
        ))
    });
    let supervisors: Vec<_> = config
        .nodes
        .iter()
        .map(|node| {
            tokio::spawn(supervise(
                config.clone(),
                node.clone(),
                cgroups,
                stop_rx.clone(),
            ))
        })
        .collect();
    tracing::info!(
        topology = %config.topology,
        nodes = config.nodes.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "namespaces made and agents started"
    );
    shutdown.await;
    tracing::info!("stopping the agents");
    let _ = stop_tx.send(true);
    for s in supervisors.into_iter().chain(hosts) {
        let _ = s.await;
    }
    remove_namespaces(&config).await;
    tracing::info!("worker stopped; its namespaces and cgroups are gone");
    Ok(())
}

/// The node's namespace with loopback up, and its cgroup.
async fn make_node(
    config: &WorkerConfig,
    node: &WorkerNode,
    cgroups: bool,
) -> Result<(), RuntimeError> {
    let ns = config.netns(&node.name);
    netlink::create_netns(&ns, netlink::NamespaceRole::PackedNode).await?;
    let inside = netlink::connect_in(&ns).await?;
    let lo = netlink::require_index(&inside, "lo").await?;
    inside
        .link()
        .set(LinkUnspec::new_with_index(lo).up().build())
        .execute()
        .await
        .map_err(|e| RuntimeError::Netlink(format!("node {}: loopback: {e}", node.name)))?;
    if cgroups {
        cgroup::create(&cgroup::group_name(&ns), &node.resources())?;
    }
    Ok(())
}

/// Keeps the node's agent running until told to stop, then stops it.
async fn supervise(
    config: WorkerConfig,
    node: WorkerNode,
    cgroups: bool,
    mut stop: watch::Receiver<bool>,
) {
    let group = cgroup::group_name(&config.netns(&node.name));
    let mut backoff = BACKOFF_MIN;
    loop {
        let began = Instant::now();
        let mut child = match start(&config, &node) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(node = %node.name, error = %e, "starting the agent failed");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => return,
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        if cgroups
            && let Some(pid) = child.id()
            && let Err(e) = cgroup::join(&group, pid)
        {
            tracing::warn!(node = %node.name, error = %e, "the agent runs outside its cgroup");
        }
        tracing::info!(node = %node.name, pid = child.id(), "agent started");
        tokio::select! {
            status = child.wait() => {
                let ran = began.elapsed();
                tracing::warn!(node = %node.name, ?status, ran_s = ran.as_secs(), "agent exited; restarting it");
                if ran >= HEALTHY_RUN {
                    backoff = BACKOFF_MIN;
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => return,
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
            _ = stop.changed() => {
                stop_child(&mut child).await;
                return;
            }
        }
    }
}

/// Starts the agent with its output prefixed by the node's name, so the pod's
/// log tells the nodes apart.
fn start(config: &WorkerConfig, node: &WorkerNode) -> std::io::Result<Child> {
    let mut child = config
        .agent_command(node)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    if let Some(out) = child.stdout.take() {
        tokio::spawn(prefix_lines(node.name.clone(), out));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(prefix_lines(node.name.clone(), err));
    }
    Ok(child)
}

async fn prefix_lines(node: String, from: impl tokio::io::AsyncRead + Unpin) {
    use std::io::Write;
    let mut lines = BufReader::new(from).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "[{node}] {line}");
    }
}

async fn stop_child(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    if tokio::time::timeout(STOP_GRACE, child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

/// Every namespace and cgroup of this topology here (by name, so also those
/// of an earlier run of the worker).
async fn remove_namespaces(config: &WorkerConfig) {
    let prefix = names::netns_prefix(&config.topology);
    let mut removed = 0;
    for ns in netlink::list_netns(&prefix) {
        match netlink::delete_netns(&ns) {
            Ok(true) => removed += 1,
            Ok(false) => {}
            Err(e) => tracing::warn!(namespace = %ns, error = %e, "removing a namespace failed"),
        }
    }
    if config.hosts_dir.is_some() {
        node_hosts::remove(
            std::path::Path::new(ETC_NETNS),
            config.nodes.iter().map(|n| config.netns(&n.name)),
        );
    }
    let groups = cgroup::remove_matching(&|g: &str| g.starts_with(&prefix));
    if removed + groups > 0 {
        tracing::info!(namespaces = removed, cgroups = groups, "removed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> WorkerConfig {
        WorkerConfig {
            topology: "line3".into(),
            hub: "http://nm-hub.nextmini.svc:50051".into(),
            credential_dir: "/var/run/nextmini".into(),
            agent_binary: "/usr/local/bin/nextmini-agent".into(),
            nodes: vec![],
            hosts_dir: None,
            state_dir: "/var/lib/nextmini".into(),
        }
    }

    #[test]
    fn agents_keep_the_pod_namespace_and_put_their_tun_in_the_nodes() {
        let node = WorkerNode {
            name: "b".into(),
            cpu_millis: None,
            memory_bytes: None,
            socks: vec!["0.0.0.0:1080".parse().expect("addr")],
        };
        let command = config().agent_command(&node);
        let args: Vec<String> = command
            .as_std()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let after = |flag: &str| {
            let at = args.iter().position(|a| a == flag).expect(flag);
            args[at + 1].clone()
        };
        assert_eq!(after("--tun-netns"), names::netns("line3", "b"));
        assert!(
            !args.iter().any(|a| a == "--netns"),
            "the agent stays in the pod's namespace"
        );
        assert_eq!(after("--credential-file"), "/var/run/nextmini/b");
        assert_eq!(after("--socks-listen"), "0.0.0.0:1080");
        assert_eq!(after("--node"), "b");
        // Where `nextmini capture --node b` in the pod looks.
        assert_eq!(
            after("--metrics-socket"),
            "/var/lib/nextmini/metrics/line3/b.sock"
        );
    }

    #[tokio::test]
    async fn a_missing_agent_or_credential_is_an_error_before_anything_is_made() {
        let mut c = config();
        c.agent_binary = "/nonexistent/nextmini-agent".into();
        let e = run(c, std::future::ready(())).await.expect_err("refused");
        assert!(e.to_string().contains("agent binary"), "{e}");
        let mut c = config();
        c.agent_binary = std::env::current_exe().expect("exe");
        c.credential_dir = "/nonexistent".into();
        c.nodes = vec![WorkerNode {
            name: "a".into(),
            cpu_millis: None,
            memory_bytes: None,
            socks: vec![],
        }];
        let e = run(c, std::future::ready(())).await.expect_err("refused");
        assert!(e.to_string().contains("node a: no credential file"), "{e}");
    }
}
