//! PostgreSQL store: desired state (topologies, nodes, links, flows), the agents'
//! state, and what they report. Schema changes go through versioned migrations in
//! `operator/migrations`. Every statement binds its values; none is built by
//! formatting user input into SQL.

mod counters;
mod endpoints;
mod faults;
mod fidelity;
mod flows;
mod forwarding;
pub mod identity;
mod metrics;
mod plan_rows;
mod routes;
pub mod rules;
mod scenario;
mod status;

pub use counters::CounterRow;
pub use faults::{FaultyPart, RowFault, TopologyProblem};
pub use fidelity::{FIDELITY_HOLD_SECS, FidelityEpisode};
pub use flows::{FlowResultRow, FlowRow, Readiness, ReceivedRow, SentRow, flow_status, route_name};
pub use forwarding::LinkNotForwarding;
pub use identity::LinkIdentity;
pub use plan_rows::{ChangedLinks, LoadedPlan};
pub use routes::{RouteRow, RouteRuleRow};
pub use scenario::{AppliedRow, PendingNodeEvent, TimelineRow};
pub use status::{LinkStatusRow, NodeStatusRow, TopologyStatusRow};

use crate::plan::Plan;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Row};
use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored topology {topology} is inconsistent: {reason}")]
    Corrupt { topology: String, reason: String },
    #[error(transparent)]
    Pki(#[from] crate::pki::PkiError),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {
    /// The connection broke under the statement (the database restarted or
    /// ended the backend, a socket closed): the same statement on another
    /// connection may succeed.
    pub fn is_connection_lost(&self) -> bool {
        let StoreError::Db(e) = self else {
            return false;
        };
        match e {
            sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => true,
            // Class 08 (connection exception) and 57P (the backend was shut
            // down or terminated): a backend ended while idle says so in the
            // answer to the next statement on its connection.
            _ => e
                .as_database_error()
                .and_then(|d| d.code())
                .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
        }
    }
}

/// SQLSTATE 40P01: PostgreSQL aborted this statement to break a deadlock.
fn is_deadlock(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| code == "40P01")
}

/// Channel the migrations' trigger notifies with a topology name on each change.
pub const TOPOLOGY_CHANNEL: &str = "nextmini_topology";

/// The session setting that tells the database's row checks who writes
/// (migration 0011), and the value the operator's connections carry.
pub const WRITER_SETTING: &str = "nextmini.writer";
pub const OPERATOR_WRITER: &str = "operator";

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

#[derive(Clone)]
pub struct Store {
    pool: PgPool,
}

/// A topology row's identity and generation. A name deleted and applied again
/// is a new creation (a new `id`) whose generation starts again at 1, so a
/// generation alone never tells two creations apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    pub id: i64,
    pub generation: i64,
}

/// What the hub needs to check an agent's Hello.
#[derive(Debug, Clone)]
pub struct NodeIdentity {
    pub topology_id: i64,
    pub credential_sha256: String,
}

impl Store {
    /// Connects, brings the schema up to date and installs this binary's rules
    /// for what a row may hold (`rules::install`).
    ///
    /// Every connection is marked `nextmini.writer=operator`: the database's row
    /// checks are for control scripts, while the operator's writes come from plans
    /// the YAML validation passed (a test holds every planned row to the same rules).
    pub async fn connect(url: &str) -> Result<Store> {
        let options = PgConnectOptions::from_str(url)?.options([(WRITER_SETTING, OPERATOR_WRITER)]);
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        MIGRATOR.run(&pool).await?;
        rules::install(&pool).await?;
        Ok(Store { pool })
    }

    /// A second, small pool to the same database, so a latency-critical path
    /// (the hub turning a committed change into deltas) never queues behind
    /// bulk work such as hundreds of agents' acknowledgements.
    ///
    /// Its connections are not pinged before use: the ping is a round trip
    /// before every statement, half of the hub's time to the changed agents
    /// at 10,000 nodes. A connection is still pinged when it is given back
    /// (sqlx does that always), so one that died idle fails only its next
    /// statement with [`StoreError::is_connection_lost`]; callers retry that.
    pub fn dedicated(&self, max_connections: u32) -> Store {
        let options = (*self.pool.connect_options()).clone();
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(options);
        Store { pool }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Closes the pool's idle connections; the next statements open new ones.
    /// A connection's read and write buffers keep the size of the largest
    /// batch it carried (a 1,000-agent topology's acknowledgements and
    /// counters), and its statement cache the statements it ran, for as long
    /// as it lives. Returns how many were closed.
    pub async fn recycle_idle_connections(&self) -> usize {
        let mut closed = 0;
        for _ in 0..self.pool.num_idle() {
            let Some(connection) = self.pool.try_acquire() else {
                break;
            };
            if let Err(e) = connection.close().await {
                tracing::debug!(error = %e, "closing an idle connection failed");
            }
            closed += 1;
        }
        closed
    }

    /// Writes a topology's desired state in one transaction, replacing any earlier
    /// version of it: either all of it is stored or none. Returns the new generation.
    pub async fn apply_plan(
        &self,
        plan: &Plan,
        runtime: &str,
        source: &str,
        credential_sha256: &BTreeMap<String, String>,
    ) -> Result<i64> {
        let mut tx = self.pool.begin().await?;
        let (id, generation) = plan_rows::upsert_topology(&mut tx, plan, runtime, source).await?;
        plan_rows::replace_children(&mut tx, id, plan, credential_sha256).await?;
        tx.commit().await?;
        Ok(generation)
    }

    /// Gives the topology a link identity unless it has one (a re-applied
    /// topology keeps its own); returns the identity in force.
    pub async fn ensure_link_identity(&self, topology: &str) -> Result<Option<LinkIdentity>> {
        let fresh = identity::generate().map_err(|e| StoreError::Corrupt {
            topology: topology.to_string(),
            reason: format!("cannot make a link certificate: {e}"),
        })?;
        identity::ensure(&self.pool, topology, &fresh).await
    }

    /// The store's control CA, made the first time anyone asks (the first `up`,
    /// or the operator's first start). Concurrent first callers agree on one.
    pub async fn control_ca(&self) -> Result<crate::pki::ControlCa> {
        if let Some(ca) = self.load_control_ca().await? {
            return Ok(ca);
        }
        let fresh = crate::pki::ControlCa::generate()?;
        sqlx::query(
            "INSERT INTO control_ca (cert_pem, key_pem) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        )
        .bind(fresh.cert_pem())
        .bind(fresh.key_pem())
        .execute(&self.pool)
        .await?;
        match self.load_control_ca().await? {
            Some(ca) => Ok(ca),
            None => Err(StoreError::Corrupt {
                topology: "-".into(),
                reason: "the control CA vanished right after it was stored".into(),
            }),
        }
    }

    async fn load_control_ca(&self) -> Result<Option<crate::pki::ControlCa>> {
        let row = sqlx::query("SELECT cert_pem, key_pem FROM control_ca")
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            Some(r) => Some(crate::pki::ControlCa::from_pem(
                r.get("cert_pem"),
                r.get("key_pem"),
            )?),
            None => None,
        })
    }

    pub async fn link_identity(&self, topology: &str) -> Result<Option<LinkIdentity>> {
        identity::load(&self.pool, topology).await
    }

    /// Changes a running topology node by node in one transaction: `removed`
    /// node rows go, nodes with an entry in `added_credentials` (SHA-256 of their
    /// new credential) come, links and flows are replaced, the rest is kept.
    pub async fn apply_node_changes(
        &self,
        plan: &Plan,
        source: &str,
        removed: &[String],
        added_credentials: &BTreeMap<String, String>,
    ) -> Result<i64> {
        let mut tx = self.pool.begin().await?;
        let runtime: String = sqlx::query_scalar("SELECT runtime FROM topologies WHERE key = $1")
            .bind(&plan.topology)
            .fetch_one(&mut *tx)
            .await?;
        let (id, generation) = plan_rows::upsert_topology(&mut tx, plan, &runtime, source).await?;
        plan_rows::change_nodes_links_and_flows(&mut tx, id, plan, removed, added_credentials)
            .await?;
        tx.commit().await?;
        Ok(generation)
    }

    /// Moves creation `topology_id` from `generation` to the next, unless it
    /// moved already: the hub's way to say the stored rows changed without
    /// the triggers that track changes (a full load follows, as for any
    /// change other than routes or links in place). Returns whether it moved.
    pub async fn move_generation(&self, topology_id: i64, generation: i64) -> Result<bool> {
        let moved = sqlx::query(
            "UPDATE topologies SET generation = generation + 1, updated_at = now() \
             WHERE id = $1 AND generation = $2",
        )
        .bind(topology_id)
        .bind(generation)
        .execute(&self.pool)
        .await?;
        Ok(moved.rows_affected() == 1)
    }

    /// Which runtime runs the topology (`netns`, or `kubernetes/<namespace>`).
    /// See [`endpoints::record`].
    pub async fn record_endpoints(
        &self,
        topology: &str,
        endpoints: &BTreeMap<String, Option<String>>,
    ) -> Result<bool> {
        endpoints::record(&self.pool, topology, endpoints).await
    }

    /// See [`endpoints::load`].
    pub async fn endpoints(
        &self,
        topology: &str,
    ) -> Result<std::collections::HashMap<String, String>> {
        endpoints::load(&self.pool, topology).await
    }

    pub async fn runtime_of(&self, topology: &str) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT runtime FROM topologies WHERE key = $1")
                .bind(topology)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    /// The manifest text the topology was last stored from.
    pub async fn source_of(&self, topology: &str) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT source FROM topologies WHERE key = $1")
                .bind(topology)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    /// Deletes a topology and every row it owns. Returns whether it existed.
    ///
    /// The cascade can deadlock with the hub's batched counter upserts: an
    /// upsert locks `link_counters` rows and then, checking its foreign key, the
    /// topology row, which the DELETE locked before cascading to those rows.
    /// PostgreSQL aborts one of the two (seen with 1,000 agents reporting), and
    /// the DELETE, which has nothing to lose, simply runs again.
    pub async fn delete_topology(&self, name: &str) -> Result<bool> {
        const ATTEMPTS: u32 = 5;
        let mut attempt = 1;
        loop {
            match sqlx::query("DELETE FROM topologies WHERE key = $1")
                .bind(name)
                .execute(&self.pool)
                .await
            {
                Ok(done) => return Ok(done.rows_affected() > 0),
                Err(e) if attempt < ATTEMPTS && is_deadlock(&e) => {
                    tracing::debug!(
                        topology = name,
                        attempt,
                        "deleting the topology deadlocked; again"
                    );
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
                    attempt += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub async fn topology_names(&self) -> Result<Vec<String>> {
        let rows = sqlx::query("SELECT key FROM topologies ORDER BY key")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(|r| r.get("key")).collect())
    }

    /// The topology's current generation, or `None` when it does not exist.
    pub async fn generation(&self, topology: &str) -> Result<Option<i64>> {
        Ok(self.version(topology).await?.map(|v| v.generation))
    }

    /// The desired state of a topology as a plan, with its generation.
    pub async fn load_plan(&self, topology: &str) -> Result<Option<(Plan, i64)>> {
        Ok(self
            .load_plan_version(topology)
            .await?
            .map(|(plan, v)| (plan, v.generation)))
    }

    /// The desired state of a topology as a plan, with the creation and
    /// generation it was read at. Faulty rows (see [`LoadedPlan::faults`]) read as
    /// their stand-ins.
    pub async fn load_plan_version(&self, topology: &str) -> Result<Option<(Plan, Version)>> {
        Ok(self
            .load_checked(topology)
            .await?
            .map(|loaded| (loaded.plan, loaded.version)))
    }

    /// The desired state of a topology with every row held to the rules the
    /// database applies to writes, and the rows that break them.
    pub async fn load_checked(&self, topology: &str) -> Result<Option<LoadedPlan>> {
        plan_rows::load(&self.pool, topology).await
    }

    /// The links of creation `topology_id` changed in place after generation
    /// `since`, held to the rules as [`Store::load_checked`] holds them; `mtu`
    /// is the topology's, which the rules check packet sizes against.
    pub async fn links_changed_since(
        &self,
        topology_id: i64,
        since: i64,
        mtu: u32,
    ) -> Result<ChangedLinks> {
        plan_rows::links_changed_since(&self.pool, topology_id, since, mtu).await
    }

    /// Records what the hub found wrong in a topology's rows (replacing the
    /// earlier list) and, when the list changed, tells listeners on
    /// `nextmini_topology` with the payload `<topology> problems=<n>`.
    pub async fn record_problems(
        &self,
        topology_id: i64,
        topology: &str,
        problems: &[TopologyProblem],
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let before: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT subject, problem, consequence FROM topology_problems \
             WHERE topology_id = $1 ORDER BY subject",
        )
        .bind(topology_id)
        .fetch_all(&mut *tx)
        .await?;
        let mut now: Vec<(String, String, String)> = problems
            .iter()
            .map(|p| (p.subject.clone(), p.problem.clone(), p.consequence.clone()))
            .collect();
        now.sort();
        now.dedup_by(|a, b| a.0 == b.0);
        if before == now {
            return Ok(());
        }
        sqlx::query("DELETE FROM topology_problems WHERE topology_id = $1")
            .bind(topology_id)
            .execute(&mut *tx)
            .await?;
        for (subject, problem, consequence) in &now {
            sqlx::query(
                "INSERT INTO topology_problems (topology_id, subject, problem, consequence) \
                 SELECT id, $2, $3, $4 FROM topologies WHERE id = $1",
            )
            .bind(topology_id)
            .bind(subject)
            .bind(problem)
            .bind(consequence)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(TOPOLOGY_CHANNEL)
            .bind(format!("{topology} problems={}", now.len()))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Which creation of the named topology exists now, and at which generation.
    pub async fn version(&self, topology: &str) -> Result<Option<Version>> {
        Ok(self.plan_version(topology).await?.map(|(v, _)| v))
    }

    /// [`Store::version`] with the generation at which the plan last changed
    /// other than by routes, route rules, or links changed in place (see
    /// [`Store::links_changed_since`]).
    pub async fn plan_version(&self, topology: &str) -> Result<Option<(Version, i64)>> {
        let row =
            sqlx::query("SELECT id, generation, plan_generation FROM topologies WHERE key = $1")
                .bind(topology)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|r| {
            let version = Version {
                id: r.get("id"),
                generation: r.get("generation"),
            };
            (version, r.get("plan_generation"))
        }))
    }

    pub async fn node_identity(&self, topology: &str, node: &str) -> Result<Option<NodeIdentity>> {
        let row = sqlx::query(
            "SELECT n.topology_id, n.credential_sha256 FROM nodes n \
             JOIN topologies t ON t.id = n.topology_id WHERE t.key = $1 AND n.name = $2",
        )
        .bind(topology)
        .bind(node)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| NodeIdentity {
            topology_id: r.get("topology_id"),
            credential_sha256: r.get("credential_sha256"),
        }))
    }

    pub async fn set_node_pid(&self, topology: &str, node: &str, pid: Option<i32>) -> Result<()> {
        sqlx::query(
            "UPDATE nodes SET pid = $3 FROM topologies t \
             WHERE t.id = nodes.topology_id AND t.key = $1 AND nodes.name = $2",
        )
        .bind(topology)
        .bind(node)
        .bind(pid)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records `new` as the node's agent pid only if the row still names `old`:
    /// false when the node (or its whole topology) was removed, or another
    /// process already replaced the agent, in the meantime.
    pub async fn replace_node_pid(
        &self,
        topology: &str,
        node: &str,
        old: i32,
        new: i32,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE nodes SET pid = $4 FROM topologies t \
             WHERE t.id = nodes.topology_id AND t.key = $1 AND nodes.name = $2 AND nodes.pid = $3",
        )
        .bind(topology)
        .bind(node)
        .bind(old)
        .bind(new)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The topology's links that do not forward yet, each with the reason.
    pub async fn links_not_forwarding(&self, topology: &str) -> Result<Vec<LinkNotForwarding>> {
        forwarding::links_not_forwarding(&self.pool, topology).await
    }

    /// Starts a fidelity episode of `node`'s direction of `link`; returns its id.
    pub async fn open_fidelity_episode(
        &self,
        topology_id: i64,
        link: &str,
        node: &str,
        started_at: chrono::DateTime<chrono::Utc>,
        at: chrono::DateTime<chrono::Utc>,
        reason: &str,
    ) -> Result<i64> {
        fidelity::open(&self.pool, topology_id, link, node, started_at, at, reason).await
    }

    pub async fn extend_fidelity_episode(
        &self,
        id: i64,
        at: chrono::DateTime<chrono::Utc>,
        reason: &str,
    ) -> Result<()> {
        fidelity::extend(&self.pool, id, at, reason).await
    }

    /// Ends episodes at `at`, or where they were last seen when `None`.
    pub async fn close_fidelity_episodes(
        &self,
        ids: &[i64],
        at: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<()> {
        fidelity::close(&self.pool, ids, at).await
    }

    /// Records the agent's stream state (`connected` / `disconnected`).
    pub async fn set_agent_state(&self, topology_id: i64, node: &str, state: &str) -> Result<()> {
        sqlx::query(
            "UPDATE nodes SET agent_state = $3, last_seen = now() \
             WHERE topology_id = $1 AND name = $2",
        )
        .bind(topology_id)
        .bind(node)
        .bind(state)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn record_ack(&self, topology_id: i64, node: &str, generation: i64) -> Result<()> {
        sqlx::query(
            "UPDATE nodes SET acked_generation = GREATEST(acked_generation, $3), last_seen = now() \
             WHERE topology_id = $1 AND name = $2",
        )
        .bind(topology_id)
        .bind(node)
        .bind(generation)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Moves the acknowledged generation of nodes a change left untouched to
    /// `generation`, in one statement: each `(node, sent)` runs the config it
    /// was sent at `sent`, which equals the new generation's, so the ack of
    /// `sent` counts for `generation`. A node that has not acknowledged `sent`
    /// yet is left alone; its own ack carries it forward when it comes.
    pub async fn carry_acks(
        &self,
        topology_id: i64,
        generation: i64,
        carried: &[(String, i64)],
    ) -> Result<()> {
        let (names, sent): (Vec<&str>, Vec<i64>) =
            carried.iter().map(|(n, g)| (n.as_str(), *g)).unzip();
        sqlx::query(
            "UPDATE nodes n SET acked_generation = GREATEST(n.acked_generation, $2) \
             FROM unnest($3::text[], $4::bigint[]) AS u(name, sent) \
             WHERE n.topology_id = $1 AND n.name = u.name AND n.acked_generation >= u.sent",
        )
        .bind(topology_id)
        .bind(generation)
        .bind(&names)
        .bind(&sent)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Upserts a batch of link counters (latest values) in one statement.
    pub async fn record_counters(&self, rows: &[CounterRow]) -> Result<()> {
        counters::upsert(&self.pool, rows).await
    }

    /// Appends a batch of reports to the metrics history, all or nothing. Rows of
    /// topologies deleted meanwhile are left out; returns how many.
    pub async fn record_metrics(&self, rows: &[CounterRow]) -> Result<u64> {
        metrics::insert(&self.pool, rows).await
    }

    /// Drops metrics older than the configured retention; returns how many.
    pub async fn trim_metrics(&self) -> Result<u64> {
        metrics::trim(&self.pool).await
    }

    /// Stores what flow sources reported; returns the rows written.
    pub async fn record_flow_sent(&self, topology_id: i64, rows: &[SentRow]) -> Result<u64> {
        flows::record_sent(&self.pool, topology_id, rows).await
    }

    /// Stores what flow sinks counted (udp); returns the rows written.
    pub async fn record_flow_received(
        &self,
        topology_id: i64,
        rows: &[ReceivedRow],
    ) -> Result<u64> {
        flows::record_received(&self.pool, topology_id, rows).await
    }

    /// The lowest generation every node of the topology has acknowledged, and
    /// whether its links are up: flows defined in it or before may start.
    pub async fn readiness(&self, topology_id: i64) -> Result<Readiness> {
        flows::readiness(&self.pool, topology_id).await
    }

    /// The timed scenario's start: the stored one, or `lead` from now if it
    /// has not started (every caller gets the same).
    pub async fn start_scenario(
        &self,
        topology_id: i64,
        lead: Duration,
    ) -> Result<chrono::DateTime<chrono::Utc>> {
        scenario::start(&self.pool, topology_id, lead).await
    }

    /// The timed scenario's start, if it started.
    pub async fn scenario_started(
        &self,
        topology_id: i64,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>> {
        scenario::started(&self.pool, topology_id).await
    }

    /// Stores when scenario events took effect on `node`.
    pub async fn record_scenario_applied(
        &self,
        topology_id: i64,
        node: &str,
        rows: &[AppliedRow],
    ) -> Result<()> {
        scenario::record_applied(&self.pool, topology_id, node, rows).await
    }

    /// Node events of started scenarios on `runtime` that no one applied yet.
    pub async fn pending_node_events(&self, runtime: &str) -> Result<Vec<PendingNodeEvent>> {
        scenario::pending_node_events(&self.pool, runtime).await
    }

    /// The topology's scenario events: planned, applied, worst skew.
    pub async fn scenario_timeline(&self, topology: &str) -> Result<Vec<TimelineRow>> {
        scenario::timeline(&self.pool, topology).await
    }

    /// Stored flow results, optionally of one topology and one flow.
    pub async fn flow_results(
        &self,
        topology: Option<&str>,
        flow: Option<&str>,
    ) -> Result<Vec<FlowResultRow>> {
        flows::results(&self.pool, topology, flow).await
    }

    /// The flows defined now, optionally of one topology.
    pub async fn flows(&self, topology: Option<&str>) -> Result<Vec<FlowRow>> {
        flows::flows(&self.pool, topology).await
    }

    /// The topology's explicit routes and route rules.
    pub async fn routes(&self, topology: &str) -> Result<(Vec<RouteRow>, Vec<RouteRuleRow>)> {
        routes::load(&self.pool, topology).await
    }

    /// Nodes of `runtime` topologies whose agent has a recorded pid but no
    /// session with the hub: (topology, node, pid). The only agents that can
    /// have died unseen, so a supervisor's pass costs one small query however
    /// many nodes run.
    pub async fn agents_without_session(
        &self,
        runtime: &str,
    ) -> Result<Vec<(String, String, i32)>> {
        let rows = sqlx::query(
            "SELECT t.key AS topology, n.name AS node, n.pid \
             FROM nodes n JOIN topologies t ON t.id = n.topology_id \
             WHERE t.runtime = $1 AND n.pid IS NOT NULL AND n.agent_state <> 'connected' \
             ORDER BY t.key, n.idx",
        )
        .bind(runtime)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.get("topology"), r.get("node"), r.get("pid")))
            .collect())
    }

    /// Marks every agent that the store believes connected as disconnected: a
    /// starting hub has no sessions, so those beliefs are stale.
    pub async fn reset_agent_states(&self) -> Result<u64> {
        let done = sqlx::query(
            "UPDATE nodes SET agent_state = 'disconnected' WHERE agent_state = 'connected'",
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// How many nodes of the topology have acknowledged `generation` (or later),
    /// and how many nodes it has.
    pub async fn ack_progress(&self, topology: &str, generation: i64) -> Result<(i64, i64)> {
        let row = sqlx::query(
            "SELECT count(*) FILTER (WHERE n.acked_generation >= $2 AND n.agent_state = 'connected') AS ready, \
                    count(*) AS total \
             FROM nodes n JOIN topologies t ON t.id = n.topology_id WHERE t.key = $1",
        )
        .bind(topology)
        .bind(generation)
        .fetch_one(&self.pool)
        .await?;
        Ok((row.get("ready"), row.get("total")))
    }

    pub async fn status(&self, topology: &str) -> Result<Option<TopologyStatusRow>> {
        status::load(&self.pool, topology).await
    }
}
