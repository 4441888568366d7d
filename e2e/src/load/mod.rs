//! Control-plane load (issue 9, point 2): one hub, a large real topology stored by
//! the same planner and store code `nextmini up` uses, and a fleet of lightweight
//! agents in this process impersonating its nodes. Each fake agent opens a real
//! control session with its node's credential, acknowledges snapshots and deltas
//! and reports counters at the topology's interval, like `nextmini-agent` does, but
//! has no TUN device, links or processors. A driver flips a route rule over SQL
//! while the fleet reports, and times each committed change to its arrival at
//! every agent (one process, one monotonic clock).
//!
//! What the run measures: the hub's CPU and resident memory (from /proc), the
//! database's write rate (`pg_stat_user_tables`), the control-delta latency, and
//! that nothing is dropped silently: every counter row sent is in the metrics
//! history or counted by the hub's `nextmini_hub_counter_rows_dropped_total`, and
//! every change reaches every agent.

mod fleet;
mod measure;
mod report;
mod session;

pub use fleet::{Fleet, FleetStats};
pub use measure::{cpu_time, rss_bytes, sample, scrape};
pub use report::{Latencies, LoadReport};
pub use session::{HubAddress, Identity, Session, open_session, store_topology};

use crate::Env;
use anyhow::{Context, bail};
use measure::{metrics_addr, postgres_pids, table_writes, total_cpu};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The topology the load runs: a ring, every node with two links.
pub const TOPOLOGY: &str = "load";

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub agents: usize,
    /// How long the fleet reports while it is measured.
    pub duration: Duration,
    /// The topology's `spec.telemetry.interval`.
    pub report_interval: Duration,
    /// Time between changes.
    pub change_every: Duration,
    /// What each change is.
    pub change: Change,
}

/// The change the driver commits every `change_every`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The route rule a→c flipped between two routes a→b→c: its three nodes
    /// need it.
    RouteRule,
    /// Link a-b's forward delay toggled by a script's UPDATE in place: its two
    /// ends need it.
    LinkDelay,
}

impl std::str::FromStr for Change {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Change> {
        match s {
            "route" => Ok(Change::RouteRule),
            "link" => Ok(Change::LinkDelay),
            other => bail!("change: must be route or link, got {other:?}"),
        }
    }
}

impl Change {
    /// How many agents the change may be sent to.
    pub fn nodes_touched(self) -> usize {
        match self {
            Change::RouteRule => 3,
            Change::LinkDelay => 2,
        }
    }
}

/// A ring of `agents` nodes reporting every `interval`, with two explicit routes
/// a→b→c (ids 1 and 2, the same path) for the driver's rule to flip between.
pub fn manifest(agents: usize, interval: Duration) -> String {
    format!(
        "apiVersion: nextmini.io/v1alpha1\nkind: Topology\nmetadata: {{name: {TOPOLOGY}}}\n\
         spec:\n  generator: {{ring: {{nodes: {agents}}}}}\n  telemetry: {{interval: {}ms}}\n",
        interval.as_millis()
    )
}

/// Whether the store shows every node of the topology at `generation` or later.
async fn every_node_acked(pool: &sqlx::PgPool, generation: i64) -> anyhow::Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(min(n.acked_generation) >= $2, false) FROM nodes n \
         JOIN topologies t ON t.id = n.topology_id WHERE t.name = $1",
    )
    .bind(TOPOLOGY)
    .bind(generation)
    .fetch_one(pool)
    .await?)
}

/// Runs the load against a fresh private PostgreSQL and hub in `env`, prints
/// progress to stderr, and returns the figures.
pub async fn run(env: &Env, cfg: &LoadConfig) -> anyhow::Result<LoadReport> {
    env.ok(&["db", "start"]);
    let url = env.ok(&["db", "url"]).trim().to_string();
    let text = manifest(cfg.agents, cfg.report_interval);
    let (plan, identities) = store_topology(&env.state_dir, &url, &text).await?;
    let metrics = metrics_addr();
    let out = env
        .command(&["hub", "--background"])
        .env("NEXTMINI_METRICS_ADDR", &metrics)
        .output()?;
    if !out.status.success() {
        bail!(
            "nextmini hub --background: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let hub_pid = env.hub_pid().context("the hub's pid")?;
    let pg_pid = env.postgres_pid().context("PostgreSQL's pid")?;
    let socket = env.state_dir.join("hub.sock");
    let pool = sqlx::PgPool::connect(&url).await?;

    // Route rule a→c flipped between two routes along the ring's first nodes.
    let names: Vec<&str> = plan.nodes.iter().map(|n| n.name.as_str()).collect();
    let (a, b, c) = (names[0], names[1], names[2]);
    sqlx::query(
        "WITH t AS (SELECT id FROM topologies WHERE name = $1) \
         INSERT INTO routes (topology_id, id, name, path) \
         SELECT id, 1, 'one', ARRAY[$2,$3,$4] FROM t UNION ALL SELECT id, 2, 'two', ARRAY[$2,$3,$4] FROM t",
    )
    .bind(TOPOLOGY)
    .bind(a)
    .bind(b)
    .bind(c)
    .execute(&pool)
    .await?;
    sqlx::query(
        "INSERT INTO route_rules (topology_id, src, dst, protocol, dst_port, route_id) \
         SELECT id, $2, $3, 17, 9000, 1 FROM topologies WHERE name = $1",
    )
    .bind(TOPOLOGY)
    .bind(a)
    .bind(c)
    .execute(&pool)
    .await?;

    let link_ab = plan
        .links
        .iter()
        .find(|l| [&l.dialer, &l.acceptor] == [a, b] || [&l.dialer, &l.acceptor] == [b, a])
        .map(|l| l.name.clone())
        .context("the ring's link between its first two nodes")?;

    let started = Instant::now();
    let fleet = Fleet::start(HubAddress::Unix(socket), identities).await;
    let stats = fleet.stats();
    let connect_deadline = Instant::now() + Duration::from_secs(120);
    while stats.connected.load(Ordering::Relaxed) < cfg.agents as u64 {
        if Instant::now() > connect_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let connect_secs = started.elapsed().as_secs_f64();
    eprintln!(
        "load: {} of {} agents connected in {connect_secs:.1} s",
        stats.connected.load(Ordering::Relaxed),
        cfg.agents
    );
    // Settle: the first reports and the connect-time writes pass.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let t0 = Instant::now();
    let hub_cpu0 = cpu_time(hub_pid).unwrap_or_default();
    let pg_cpu0 = total_cpu(&postgres_pids(pg_pid));
    let fleet_cpu0 = cpu_time(std::process::id() as i32).unwrap_or_default();
    let writes0 = table_writes(&pool).await?;
    let reports0 = stats.reports.load(Ordering::Relaxed);
    let mut rss_max = 0u64;
    let mut report = LoadReport {
        agents: cfg.agents,
        connected: stats.connected.load(Ordering::Relaxed),
        connect_secs,
        report_interval_ms: cfg.report_interval.as_millis(),
        ..Default::default()
    };
    let mut route = 1;
    let mut next_progress = Instant::now() + Duration::from_secs(30);
    while t0.elapsed() < cfg.duration {
        let round = Instant::now();
        route = 3 - route;
        let mut tx = pool.begin().await?;
        match cfg.change {
            Change::RouteRule => sqlx::query(
                "UPDATE route_rules SET route_id = $2 \
                 WHERE topology_id = (SELECT id FROM topologies WHERE name = $1)",
            )
            .bind(TOPOLOGY)
            .bind(route),
            Change::LinkDelay => sqlx::query(
                "UPDATE links SET params_forward = jsonb_set(params_forward, '{delay_us}', to_jsonb($2::bigint)) \
                 WHERE topology_id = (SELECT id FROM topologies WHERE name = $1) AND name = $3",
            )
            .bind(TOPOLOGY)
            .bind(i64::from(route) * 1000)
            .bind(&link_ab),
        }
        .execute(&mut *tx)
        .await?;
        let generation: i64 =
            sqlx::query_scalar("SELECT generation FROM topologies WHERE name = $1")
                .bind(TOPOLOGY)
                .fetch_one(&mut *tx)
                .await?;
        tx.commit().await?;
        let committed = Instant::now();
        report.changes += 1;
        // Wait until the store shows every node at this generation (or give
        // up on this change after 10 s). Nodes the change leaves alone are sent
        // nothing; the hub records them at the new generation itself.
        let deadline = committed + Duration::from_secs(10);
        let (reached, acked) = loop {
            let acked = every_node_acked(&pool, generation).await?;
            if acked || Instant::now() > deadline {
                break (stats.reached(generation as u64), acked.then(Instant::now));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let ms = |at: &Instant| at.saturating_duration_since(committed).as_secs_f64() * 1e3;
        match acked {
            Some(at) => report.all_acked.0.push(ms(&at)),
            None => report.changes_incomplete += 1,
        }
        if let Some(at) = reached.get(&0) {
            report.affected.0.push(ms(at));
        }
        if let Some(last) = reached.values().max() {
            report.needed.0.push(ms(last));
        }
        report.sent_to_max = report.sent_to_max.max(reached.len());
        rss_max = rss_max.max(rss_bytes(hub_pid).unwrap_or(0));
        if Instant::now() > next_progress {
            next_progress += Duration::from_secs(30);
            eprintln!(
                "load: {:.0} s, {} changes, {} reports, hub RSS {:.0} MiB",
                t0.elapsed().as_secs_f64(),
                report.changes,
                stats.reports.load(Ordering::Relaxed),
                rss_max as f64 / 1048576.0
            );
        }
        let rest = cfg.change_every.saturating_sub(round.elapsed());
        tokio::time::sleep(rest).await;
    }
    let measured = t0.elapsed();
    let secs = measured.as_secs_f64();
    let percent = |d: Duration| d.as_secs_f64() / secs * 100.0;
    report.measured_secs = secs;
    report.hub_cpu_percent = percent(
        cpu_time(hub_pid)
            .unwrap_or_default()
            .saturating_sub(hub_cpu0),
    );
    report.postgres_cpu_percent =
        percent(total_cpu(&postgres_pids(pg_pid)).saturating_sub(pg_cpu0));
    report.fleet_cpu_percent = percent(
        cpu_time(std::process::id() as i32)
            .unwrap_or_default()
            .saturating_sub(fleet_cpu0),
    );
    report.hub_rss_end = rss_bytes(hub_pid).unwrap_or(0);
    report.hub_rss_max = rss_max.max(report.hub_rss_end);
    report.reports_per_sec = (stats.reports.load(Ordering::Relaxed) - reports0) as f64 / secs;
    report.target_reports_per_sec =
        cfg.agents as f64 * 1000.0 / cfg.report_interval.as_millis() as f64;
    // PostgreSQL publishes a backend's counts when it goes idle (at most 1 s late).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let writes1 = table_writes(&pool).await?;
    let delta = |table: &str| {
        let (i0, u0) = writes0.get(table).copied().unwrap_or_default();
        let (i1, u1) = writes1.get(table).copied().unwrap_or_default();
        ((i1 - i0) as f64, (u1 - u0) as f64)
    };
    let window = secs + 1.5;
    report.metrics_rows_per_sec = delta("link_metrics").0 / window;
    let (ins, upd) = delta("link_counters");
    report.counter_upserts_per_sec = (ins + upd) / window;
    report.node_updates_per_sec = delta("nodes").1 / window;

    // Stop the fleet, then let the hub write what it holds.
    fleet.stop().await;
    report.rows_sent = stats.rows.load(Ordering::Relaxed);
    report.resyncs = stats.resyncs.load(Ordering::Relaxed);
    report.disconnects = stats.disconnects.load(Ordering::Relaxed);
    report.rejected = stats.rejected.load(Ordering::Relaxed);
    let settle = Instant::now() + Duration::from_secs(60);
    loop {
        let scraped = scrape(&metrics).unwrap_or_default();
        report.rows_dropped_by_hub = ["db_backlog", "topology_deleted", "writer_stopped"]
            .iter()
            .map(|r| {
                sample(
                    &scraped,
                    &format!("nextmini_hub_counter_rows_dropped_total{{reason=\"{r}\"}}"),
                )
            })
            .sum();
        report.messages_dropped_by_hub = ["queue_full", "closed"]
            .iter()
            .map(|r| {
                sample(
                    &scraped,
                    &format!("nextmini_hub_control_messages_dropped_total{{reason=\"{r}\"}}"),
                )
            })
            .sum();
        report.rows_stored = sqlx::query_scalar(
            "SELECT count(*) FROM link_metrics m JOIN topologies t ON t.id = m.topology_id WHERE t.name = $1",
        )
        .bind(TOPOLOGY)
        .fetch_one(&pool)
        .await?;
        if report.rows_stored + report.rows_dropped_by_hub as i64 >= report.rows_sent as i64
            || Instant::now() > settle
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    pool.close().await;
    Ok(report)
}
