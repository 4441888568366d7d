//! Local mode's moving parts: the state directory, the private PostgreSQL, the
//! background hub, the namespace runtime.

use anyhow::{Context, bail};
use nextmini_operator::hub::Hub;
use nextmini_operator::localpg::{DEFAULT_PORT, LocalPg};
use nextmini_operator::runtime::netns::NetnsRuntime;
use nextmini_operator::runtime::{Removal, Runtime, names, tunables};
use nextmini_operator::store::Store;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct LocalArgs {
    /// Where local mode keeps its database, credentials, sockets and logs.
    #[arg(
        long,
        global = true,
        env = "NEXTMINI_STATE_DIR",
        default_value = "/var/lib/nextmini"
    )]
    state_dir: PathBuf,
    /// Use this PostgreSQL instead of the private one (e.g. postgres://user@host/db).
    #[arg(long, global = true, env = "NEXTMINI_DATABASE_URL")]
    database_url: Option<String>,
    /// Port (socket name) of the private PostgreSQL.
    #[arg(long, global = true, env = "NEXTMINI_PG_PORT", default_value_t = DEFAULT_PORT)]
    pg_port: u16,
    /// Where the hub serves Prometheus metrics (its own and every local agent's), or "off".
    #[arg(long, global = true, env = "NEXTMINI_METRICS_ADDR", default_value = nextmini_operator::observe::DEFAULT_METRICS_ADDR)]
    metrics_addr: nextmini_operator::observe::MetricsAddr,
}

pub struct Local {
    pub state_dir: PathBuf,
    database_url: Option<String>,
    pg_port: u16,
    pub metrics_addr: nextmini_operator::observe::MetricsAddr,
}

impl Local {
    pub fn new(args: LocalArgs) -> anyhow::Result<Local> {
        let state_dir = if args.state_dir.is_absolute() {
            args.state_dir
        } else {
            std::env::current_dir()?.join(args.state_dir)
        };
        Ok(Local {
            state_dir,
            database_url: args.database_url,
            pg_port: args.pg_port,
            metrics_addr: args.metrics_addr,
        })
    }

    fn localpg(&self) -> anyhow::Result<LocalPg> {
        Ok(LocalPg::new(&self.state_dir, self.pg_port)?)
    }

    pub fn require_root(&self) -> anyhow::Result<()> {
        if !nix::unistd::geteuid().is_root() {
            bail!(
                "local namespace mode needs root (it creates network namespaces and TUN devices); run with sudo"
            );
        }
        Ok(())
    }

    /// The store, starting the private PostgreSQL first when it is the one in use.
    pub async fn store(&self) -> anyhow::Result<Store> {
        let url = match &self.database_url {
            Some(url) => url.clone(),
            None => {
                std::fs::create_dir_all(&self.state_dir)
                    .with_context(|| format!("creating {}", self.state_dir.display()))?;
                let pg = self.localpg()?;
                tokio::task::spawn_blocking(move || pg.ensure_running().map(|()| pg.url()))
                    .await??
            }
        };
        Store::connect(&url)
            .await
            .context("connecting to PostgreSQL")
    }

    /// The store if the database is already up; `None` when nothing was started.
    pub async fn existing_store(&self) -> anyhow::Result<Option<Store>> {
        if self.database_url.is_none() && !self.localpg()?.is_running() {
            return Ok(None);
        }
        Ok(Some(self.store().await?))
    }

    pub fn hub_socket(&self) -> PathBuf {
        self.state_dir.join("hub.sock")
    }

    fn hub_pidfile(&self) -> PathBuf {
        self.state_dir.join("hub.pid")
    }

    pub fn runtime(&self) -> anyhow::Result<NetnsRuntime> {
        Ok(NetnsRuntime {
            state_dir: self.state_dir.clone(),
            agent_binary: agent_binary()?,
            hub: format!("unix:{}", self.hub_socket().display()),
        })
    }

    /// Pid of the running background hub, if any.
    pub fn hub_pid(&self) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.hub_pidfile())
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_hub = args.first().is_some_and(|a| a.ends_with(b"nextmini"))
            && args.iter().any(|a| *a == b"hub");
        is_hub.then_some(pid)
    }

    /// Starts the hub in the background unless it runs, and waits for its socket.
    pub fn ensure_hub(&self) -> anyhow::Result<()> {
        if self.hub_pid().is_some()
            && std::os::unix::net::UnixStream::connect(self.hub_socket()).is_ok()
        {
            return Ok(());
        }
        let logs = self.state_dir.join("logs");
        std::fs::create_dir_all(&logs)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(logs.join("hub.log"))?;
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.arg("--state-dir").arg(&self.state_dir);
        cmd.arg("--pg-port").arg(self.pg_port.to_string());
        cmd.arg("--metrics-addr").arg(self.metrics_addr.to_string());
        if let Some(url) = &self.database_url {
            cmd.arg("--database-url").arg(url);
        }
        let child = cmd
            .arg("hub")
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env(
                tunables::VARIABLE,
                tunables::for_hub(std::env::var(tunables::VARIABLE).ok()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .context("starting the hub")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if std::os::unix::net::UnixStream::connect(self.hub_socket()).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "the hub (pid {}) did not start within 30 s; see {}",
            child.id(),
            logs.join("hub.log").display()
        )
    }

    /// The hub in the foreground, until SIGTERM or Ctrl-C.
    pub async fn run_hub(&self) -> anyhow::Result<()> {
        let store = self.store().await?;
        std::fs::write(self.hub_pidfile(), std::process::id().to_string())?;
        let socket = self.hub_socket();
        tracing::info!(socket = %socket.display(), "hub listening");
        let hub = Hub::new(store.clone());
        crate::observe::start_for_hub(self, &hub, &store).await;
        // The local runtime's half of "a dead agent is restarted", and the
        // timed scenarios' node events, which hold a killed agent down.
        let held = nextmini_operator::runtime::scenario_nodes::Held::default();
        tokio::spawn(nextmini_operator::runtime::supervise::run(
            self.runtime()?,
            store.clone(),
            held.clone(),
            Duration::from_millis(500),
        ));
        tokio::spawn(nextmini_operator::runtime::scenario_nodes::run(
            self.runtime()?,
            store.clone(),
            held,
            Duration::from_millis(200),
        ));
        let served = hub
            .serve_unix(&socket, nextmini_operator::shutdown::signal())
            .await;
        crate::observe::hub_stopped(self);
        let _ = std::fs::remove_file(&socket);
        let _ = std::fs::remove_file(self.hub_pidfile());
        served
    }

    fn stop_hub(&self) -> bool {
        let Some(pid) = self.hub_pid() else {
            return false;
        };
        nextmini_operator::runtime::process::stop(&[pid], Duration::from_secs(3));
        let _ = std::fs::remove_file(self.hub_pidfile());
        let _ = std::fs::remove_file(self.hub_socket());
        crate::observe::hub_stopped(self);
        true
    }

    /// Tears down the named topologies, or everything when none is named; stops
    /// the hub and the private PostgreSQL once no topology is left.
    pub async fn down(&self, topologies: &[String], all: bool) -> anyhow::Result<()> {
        self.require_root()?;
        let runtime = self.runtime()?;
        // After a crash the private PostgreSQL may be down with its data intact:
        // start it, so `down` knows which topologies this state directory made.
        let store = if self.database_url.is_some() || self.localpg()?.is_initialised() {
            Some(self.store().await?)
        } else {
            None
        };
        let names = if topologies.is_empty() {
            // The store and the credentials this state directory wrote both
            // name its topologies; either alone can be behind after a crash.
            let mut names = runtime.topologies_with_credentials();
            if let Some(s) = &store {
                names.extend(s.topology_names().await?);
            }
            names.sort();
            names.dedup();
            names
        } else {
            topologies.to_vec()
        };
        for t in &names {
            // Rows first: the hub's supervisor restarts only agents of nodes it
            // still finds in the store. The agents are paused meanwhile, so
            // none reconnects as its session ends; they go on if the rows stay.
            let paused = runtime.pause_agents(t);
            let existed = match &store {
                Some(s) => match s.delete_topology(t).await {
                    Ok(existed) => existed,
                    Err(e) => {
                        nextmini_operator::runtime::process::resume(&paused);
                        return Err(e.into());
                    }
                },
                None => false,
            };
            let bar = removal_bar(t);
            let removed = runtime
                .destroy_showing(t, &|step| show_removal(&bar, t, step))
                .await;
            bar.finish_and_clear();
            let removed = removed?;
            crate::observe::forget_topology(self, t);
            if !existed && removed == Default::default() {
                println!("topology {t} is not running");
            } else {
                println!(
                    "removed topology {t}: {} agent process(es), {} namespace(s), {} interface(s)",
                    removed.processes, removed.namespaces, removed.links
                );
            }
        }
        if all {
            let removed = runtime.destroy_everything().await?;
            println!(
                "swept the machine: {} agent process(es), {} namespace(s), {} interface(s)",
                removed.processes, removed.namespaces, removed.links
            );
        }
        let remaining = match &store {
            Some(s) => s.topology_names().await?,
            None => vec![],
        };
        if remaining.is_empty() {
            drop(store);
            if self.stop_hub() {
                println!("stopped the hub");
            }
            if self.database_url.is_none() && self.localpg()?.stop()? {
                println!(
                    "stopped the private PostgreSQL (data kept in {})",
                    self.state_dir.display()
                );
            }
        }
        Ok(())
    }

    /// Replaces this process with `ip netns exec <ns> <command>`, which also
    /// bind-mounts the node's /etc/hosts so node names resolve.
    pub fn exec(
        &self,
        topology: Option<&str>,
        node: &str,
        command: &[String],
    ) -> anyhow::Result<i32> {
        self.require_root()?;
        let topology = match topology {
            Some(t) => t.to_string(),
            None => self.only_topology_with(node)?,
        };
        let ns = names::netns(&topology, node);
        if !PathBuf::from("/run/netns").join(&ns).exists() {
            bail!("node {node} of topology {topology} is not running (no namespace {ns})");
        }
        // The command runs under the node's CPU and memory limits, like its
        // agent: this process joins the node's group and the command inherits it.
        nextmini_operator::runtime::cgroup::join(
            &nextmini_operator::runtime::cgroup::group_name(&ns),
            std::process::id(),
        )
        .with_context(|| format!("joining node {node}'s cgroup"))?;
        let err = Command::new("ip")
            .args(["netns", "exec", &ns])
            .args(command)
            .exec();
        Err(err).context("running ip netns exec")
    }

    /// Finds which running topology has a node of that name, from the
    /// credentials on this machine (no database needed): a node's token file
    /// in `credentials/<name>/`, or `credentials/<namespace>/<name>/` for a
    /// topology of a namespace.
    fn only_topology_with(&self, node: &str) -> anyhow::Result<String> {
        let dirs = |dir: &Path| -> Vec<(String, PathBuf)> {
            std::fs::read_dir(dir)
                .map(|d| {
                    d.filter_map(|e| e.ok())
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut tops = Vec::new();
        for (name, dir) in dirs(&self.state_dir.join("credentials")) {
            if dir.join(node).is_file() {
                tops.push(name.clone());
            }
            for (inner, inner_dir) in dirs(&dir) {
                if inner_dir.join(node).is_file() {
                    tops.push(format!("{name}/{inner}"));
                }
            }
        }
        tops.sort();
        match tops.as_slice() {
            [one] => Ok(one.clone()),
            [] => bail!("no running topology has a node named {node}"),
            many => bail!(
                "several topologies have a node named {node} ({}): pick one with --topology",
                many.join(", ")
            ),
        }
    }
}

/// `nextmini-agent` next to this binary, or $NEXTMINI_AGENT_BIN.
pub fn agent_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("NEXTMINI_AGENT_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let sibling = exe.with_file_name("nextmini-agent");
    if sibling.exists() {
        return Ok(sibling);
    }
    bail!(
        "nextmini-agent not found next to {} (build it with `cargo build --release`, or set NEXTMINI_AGENT_BIN)",
        exe.display()
    )
}

pub enum DbAction {
    Start,
    Stop,
    Url,
}

impl Local {
    pub async fn db(&self, action: DbAction) -> anyhow::Result<()> {
        match action {
            DbAction::Start => {
                self.store().await?;
                println!("PostgreSQL is up: {}", self.database_url()?);
            }
            DbAction::Stop => {
                if self.database_url.is_some() {
                    bail!(
                        "an external database is in use (--database-url); nextmini does not manage it"
                    );
                }
                if self.localpg()?.stop()? {
                    println!("stopped the private PostgreSQL");
                }
            }
            DbAction::Url => println!("{}", self.database_url()?),
        }
        Ok(())
    }

    fn database_url(&self) -> anyhow::Result<String> {
        Ok(match &self.database_url {
            Some(u) => u.clone(),
            None => self.localpg()?.url(),
        })
    }

    /// Removes a topology's nodes and rows (used by `up` to replace or roll back).
    pub async fn remove_topology(&self, store: &Store, topology: &str) -> anyhow::Result<()> {
        // Rows first, so the hub's supervisor does not restart what is being removed.
        store.delete_topology(topology).await?;
        self.runtime()?.destroy(topology).await?;
        crate::observe::forget_topology(self, topology);
        Ok(())
    }
}

/// A bar for `down`: a spinner while the agents stop, then namespaces removed
/// out of all (a 10,000-node topology takes half a minute).
fn removal_bar(topology: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_message(format!("{topology}: removing"));
    bar
}

fn show_removal(bar: &indicatif::ProgressBar, topology: &str, step: Removal) {
    match step {
        Removal::StoppingAgents(n) => {
            bar.set_message(format!("{topology}: stopping {n} agent(s)"));
            bar.tick();
        }
        Removal::Namespaces { done, total } => {
            if bar.length() != Some(total as u64) {
                bar.set_length(total as u64);
                crate::up::counting_style(bar);
                bar.set_message(format!("{topology}: removing namespaces"));
            }
            bar.set_position(done as u64);
        }
    }
}
