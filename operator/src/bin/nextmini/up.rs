//! `nextmini up -f`: validate → plan → store → start nodes → wait for every agent
//! to run its snapshot. Validation happens before anything is created; a failure
//! after that removes what this run made.

use crate::local::Local;
use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use nextmini_operator::pki::Credentials;
use nextmini_operator::plan::{self, NodeChanges, Plan};
use nextmini_operator::runtime::{Runtime, Stage, names, netlink};
use nextmini_operator::store::Store;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// Manifest with Topology, Link and Flow documents.
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    /// How long to wait for every agent to be ready.
    #[arg(long, default_value = "120")]
    timeout_secs: u64,
}

/// Reads and plans a manifest; errors name the document, the field and the reason.
pub fn load(file: &Path) -> anyhow::Result<(String, Vec<Plan>)> {
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{}: not UTF-8 (invalid byte at offset {})",
            file.display(),
            e.utf8_error().valid_up_to()
        )
    })?;
    let source = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| file.display().to_string());
    let manifest = plan::parse_manifest(&source, &text).map_err(invalid)?;
    let mut plans = plan::plan_manifest_here(&manifest).map_err(invalid)?;
    plan::check_local(&manifest).map_err(invalid)?;
    // A topology that names its namespace is known by both, as in a cluster:
    // two manifests may each bring a "wan" in their own namespace.
    for p in &mut plans {
        let namespace = manifest
            .topologies
            .iter()
            .find(|d| d.object.metadata.name.as_deref() == Some(p.topology.as_str()))
            .and_then(|d| d.object.metadata.namespace.as_deref());
        p.topology = nextmini_proto::topology_key::join(namespace, &p.topology);
    }
    for w in plan::local_warnings(&manifest) {
        eprintln!("warning: {w}");
    }
    if plans.is_empty() {
        bail!("{source}: no Topology document");
    }
    for p in &plans {
        for w in plan::warnings(p) {
            eprintln!("warning: topology {}: {w}", p.topology);
        }
    }
    Ok((text, plans))
}

fn invalid(errors: plan::ValidationErrors) -> anyhow::Error {
    anyhow::anyhow!("invalid manifest, nothing was created:\n{errors}")
}

pub fn print_plan(file: &Path) -> anyhow::Result<i32> {
    let (_, plans) = load(file)?;
    for p in &plans {
        println!(
            "topology {} ({} nodes, {} links)",
            p.topology,
            p.nodes.len(),
            p.links.len()
        );
        for n in p.nodes.iter() {
            let mut site = String::new();
            if let Some(region) = &n.region {
                site.push_str(&format!("  region {region}"));
            }
            if let Some(cluster) = &n.cluster {
                site.push_str(&format!("  cluster {cluster}"));
            }
            println!(
                "  node {:<12} overlay {:<15} underlay {}{site}",
                n.name, n.overlay, n.underlay
            );
            for s in &n.socks {
                let auth = if s.users.is_empty() {
                    "no authentication".to_string()
                } else {
                    format!("{} user(s)", s.users.len())
                };
                println!(
                    "    socks {} ({} mode, {auth})",
                    s.listen,
                    match s.mode {
                        plan::RelayMode::Normal => "normal",
                        plan::RelayMode::Max => "max",
                    }
                );
            }
        }
        for l in &p.links {
            println!("  link {:<12} {} dials {}", l.name, l.dialer, l.acceptor);
        }
    }
    Ok(0)
}

pub async fn up(local: &Local, args: UpArgs) -> anyhow::Result<i32> {
    let (source, plans) = load(&args.file)?;
    local.require_root()?;
    let store = local.store().await?;
    local.ensure_hub()?;
    let timeout = Duration::from_secs(args.timeout_secs);
    for plan in &plans {
        let topology = &plan.topology;
        if let Some((running, _)) = store.load_plan(topology).await? {
            let changes = running.node_changes(plan);
            match changes {
                Some(changes) if local.runtime()?.is_running(&running) => {
                    change(local, &store, &running, plan, &source, &changes, timeout).await?;
                    continue;
                }
                Some(_) => {
                    println!("replacing topology {topology}: not all of its nodes were running")
                }
                None => println!(
                    "replacing running topology {topology}: its addressing or dataplane settings changed, so every node restarts"
                ),
            }
        }
        if !start(local, &store, plan, &source, timeout).await? {
            return Ok(1);
        }
    }
    Ok(0)
}

/// Tokens and certificates of the store's control CA for `nodes`, and the
/// tokens' hashes the store keeps.
async fn new_credentials<'a>(
    store: &Store,
    topology: &str,
    nodes: impl Iterator<Item = &'a String>,
) -> anyhow::Result<(Credentials, BTreeMap<String, String>)> {
    let ca = store.control_ca().await?;
    let credentials = Credentials::issue(&ca, topology, nodes)?;
    let hashes = credentials.token_hashes(credentials.nodes.keys());
    Ok((credentials, hashes))
}

/// Starts a topology from nothing (removing whatever an earlier, crashed run
/// left). False when the agents did not all become ready in time.
async fn start(
    local: &Local,
    store: &Store,
    plan: &Plan,
    source: &str,
    timeout: Duration,
) -> anyhow::Result<bool> {
    let topology = &plan.topology;
    local.remove_topology(store, topology).await?;
    let (credentials, hashes) =
        new_credentials(store, topology, plan.nodes.iter().map(|n| &n.name)).await?;
    let generation = store.apply_plan(plan, "netns", source, &hashes).await?;
    store.ensure_link_identity(topology).await?;

    let bar = NodeProgress::new(plan.nodes.len(), topology, "");
    let created = local
        .runtime()?
        .create(plan, &credentials, &|stage, _node: &str| bar.advance(stage))
        .await;
    bar.finish();
    let pids = match created {
        Ok(p) => p,
        Err(e) => {
            local.remove_topology(store, topology).await?;
            return Err(anyhow::Error::new(e).context(format!(
                "starting topology {topology} failed; everything it made was removed"
            )));
        }
    };
    for (node, pid) in &pids {
        store
            .set_node_pid(topology, node, Some(*pid as i32))
            .await?;
    }
    if let Err(e) = wait_ready(local, store, plan, generation, timeout).await {
        eprintln!("{e:#}");
        eprintln!(
            "the topology is left running for inspection; `nextmini down {topology}` removes it"
        );
        return Ok(false);
    }
    println!(
        "topology {topology} is up: {} nodes, {} links (generation {generation})",
        plan.nodes.len(),
        plan.links.len()
    );
    // A thousand lines would bury what matters; `status` lists every node.
    const LISTED: usize = 20;
    for n in plan.nodes.iter().take(LISTED) {
        println!("  {:<12} {}", n.name, n.overlay);
    }
    if plan.nodes.len() > LISTED {
        println!(
            "  … and {} more (`nextmini status {topology}` lists every node)",
            plan.nodes.len() - LISTED
        );
    }
    if let (Some(first), Some(last)) = (plan.nodes.first(), plan.nodes.last()) {
        println!(
            "try: nextmini exec {} -- ping -c 3 {}",
            first.name, last.name
        );
    }
    Ok(true)
}

/// Changes a running topology without restarting the nodes that stay: new nodes
/// are started first and the store changed in one transaction; if either fails,
/// what this run started is removed and the topology runs on as it was. Only
/// then are removed nodes stopped, and nodes whose addresses or limits changed
/// restarted.
async fn change(
    local: &Local,
    store: &Store,
    running: &Plan,
    plan: &Plan,
    source: &str,
    changes: &NodeChanges,
    timeout: Duration,
) -> anyhow::Result<()> {
    let topology = &plan.topology;
    let runtime = local.runtime()?;
    let restarted: Vec<String> = changes
        .added
        .iter()
        .filter(|n| changes.removed.contains(n))
        .cloned()
        .collect();
    let fresh: Vec<String> = changes
        .added
        .iter()
        .filter(|n| !restarted.contains(n))
        .cloned()
        .collect();
    let (credentials, hashes) = new_credentials(store, topology, changes.added.iter()).await?;
    // Only what this run made is undone: a namespace that was there before is
    // not ours to remove (add_nodes refuses to start over one).
    let made_here: Vec<String> = fresh
        .iter()
        .filter(|n| !netlink::netns_exists(&names::netns(topology, n)))
        .cloned()
        .collect();
    let rollback = |e: anyhow::Error| async {
        if let Err(cleanup) = runtime.remove_nodes(topology, &made_here).await {
            eprintln!("warning: removing the nodes this run started failed: {cleanup}");
        }
        runtime.write_hosts(running);
        e.context(format!(
            "changing topology {topology} failed; it runs on unchanged"
        ))
    };

    let mut pids = BTreeMap::new();
    if !fresh.is_empty() {
        let bar = NodeProgress::new(fresh.len(), topology, "new ");
        let created = runtime
            .add_nodes(plan, &fresh, &credentials, &|stage, _n: &str| {
                bar.advance(stage)
            })
            .await;
        bar.finish();
        match created {
            Ok(p) => pids.extend(p),
            Err(e) => return Err(rollback(e.into()).await),
        }
    }
    let generation = match store
        .apply_node_changes(plan, source, &changes.removed, &hashes)
        .await
    {
        Ok(g) => g,
        Err(e) => return Err(rollback(e.into()).await),
    };
    if !changes.removed.is_empty() {
        runtime.remove_nodes(topology, &changes.removed).await?;
    }
    if !restarted.is_empty() {
        pids.extend(
            runtime
                .add_nodes(plan, &restarted, &credentials, &|_, _| {})
                .await?,
        );
    }
    runtime.write_hosts(plan);
    for (node, pid) in &pids {
        store
            .set_node_pid(topology, node, Some(*pid as i32))
            .await?;
    }
    wait_ready(local, store, plan, generation, timeout).await?;
    println!(
        "topology {topology} changed in place (generation {generation}): {} node(s) started, {} stopped, {} restarted; links and flows updated",
        fresh.len(),
        changes.removed.len() - restarted.len(),
        restarted.len()
    );
    Ok(())
}

/// Waits until every agent runs `generation` and then until every link
/// forwards (both ends connected, a probe across it): `up` means the network
/// carries traffic, not only that the agents took their configuration.
async fn wait_ready(
    local: &Local,
    store: &Store,
    plan: &Plan,
    generation: i64,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    wait_acked(local, store, plan, generation, deadline, timeout).await?;
    wait_forwarding(local, store, plan, deadline, timeout).await
}

async fn wait_acked(
    local: &Local,
    store: &Store,
    plan: &Plan,
    generation: i64,
    deadline: Instant,
    timeout: Duration,
) -> anyhow::Result<()> {
    let topology = &plan.topology;
    let bar = progress_bar(
        plan.nodes.len() as u64,
        &format!("{topology}: agents ready"),
    );
    loop {
        let (ready, total) = store.ack_progress(topology, generation).await?;
        bar.set_position(ready as u64);
        if ready == total {
            bar.finish_and_clear();
            return Ok(());
        }
        if Instant::now() > deadline {
            bar.finish_and_clear();
            let status = store.status(topology).await?;
            let waiting: Vec<String> = status
                .map(|s| {
                    s.nodes
                        .into_iter()
                        .filter(|n| n.acked_generation < generation || n.agent_state != "connected")
                        .map(|n| n.name)
                        .collect()
                })
                .unwrap_or_default();
            bail!(
                "{ready}/{total} agents of {topology} ready after {timeout:?}; waiting for: {} (logs in {})",
                waiting.join(", "),
                local.runtime()?.log_dir(topology).display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Links named in a failure message; the rest are counted.
const LINKS_NAMED: usize = 20;

async fn wait_forwarding(
    local: &Local,
    store: &Store,
    plan: &Plan,
    deadline: Instant,
    timeout: Duration,
) -> anyhow::Result<()> {
    let topology = &plan.topology;
    let total = plan.links.len() as u64;
    let bar = progress_bar(total, &format!("{topology}: links forwarding"));
    loop {
        let waiting = store.links_not_forwarding(topology).await?;
        bar.set_position(total.saturating_sub(waiting.len() as u64));
        if waiting.is_empty() {
            bar.finish_and_clear();
            return Ok(());
        }
        if Instant::now() > deadline {
            bar.finish_and_clear();
            let named: Vec<String> = waiting
                .iter()
                .take(LINKS_NAMED)
                .map(|l| format!("  {}: {}", l.link, l.reason))
                .collect();
            let more = waiting.len().saturating_sub(LINKS_NAMED);
            bail!(
                "{} of {total} links of {topology} do not forward after {timeout:?}:\n{}{} (agent logs in {})",
                waiting.len(),
                named.join("\n"),
                if more > 0 {
                    format!("\n  … and {more} more")
                } else {
                    String::new()
                },
                local.runtime()?.log_dir(topology).display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn progress_bar(len: u64, message: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    counting_style(&bar);
    bar.set_message(message.to_string());
    bar
}

/// The look of every counting bar of `up` and `down`.
pub(crate) fn counting_style(bar: &ProgressBar) {
    if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {elapsed}") {
        bar.set_style(style.progress_chars("=> "));
    }
}

/// Counts agents started; its message also counts nodes wired (namespace and
/// interfaces made), which runs ahead: an agent starts once its node and its
/// link peers are wired.
struct NodeProgress {
    bar: ProgressBar,
    message: String,
    wired: std::sync::atomic::AtomicUsize,
}

impl NodeProgress {
    fn new(nodes: usize, topology: &str, which: &str) -> NodeProgress {
        let message = format!("{topology}: starting {which}nodes");
        NodeProgress {
            bar: progress_bar(nodes as u64, &message),
            message,
            wired: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn advance(&self, stage: Stage) {
        match stage {
            Stage::Wired => {
                let wired = self
                    .wired
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    + 1;
                self.bar
                    .set_message(format!("{} ({wired} wired)", self.message));
            }
            Stage::Started => self.bar.inc(1),
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
