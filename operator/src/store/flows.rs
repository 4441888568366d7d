//! Flows and their results. A re-applied manifest keeps a flow whose definition
//! did not change (its generation, route and results stay, and agents do not
//! run it again); a changed or new flow gets the new generation, a fresh route
//! for its path, and loses the results of its earlier definition.

use super::{FaultyPart, Result, RowFault, StoreError};
use crate::plan::{FlowParams, Plan, PlannedFlow};
use sqlx::{PgPool, Postgres, Row, Transaction};
use std::collections::HashMap;

/// Name of the route row carrying a flow's explicit path.
pub fn route_name(flow: &str) -> String {
    format!("flow/{flow}")
}

/// What a source reported of one instance.
#[derive(Debug, Clone, PartialEq)]
pub struct SentRow {
    pub flow: String,
    pub defined_generation: i64,
    pub instance: i32,
    pub protocol: String,
    pub size_bytes: Option<i64>,
    pub bytes: i64,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
    pub fct_us: Option<i64>,
    pub throughput_bps: Option<f64>,
    pub retransmissions: i64,
    pub error: Option<String>,
}

/// What a sink counted of one udp instance.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedRow {
    pub flow: String,
    pub defined_generation: i64,
    pub instance: i32,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub received_bytes: i64,
}

/// One stored instance, as `nextmini results` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowResultRow {
    pub topology: String,
    pub flow: String,
    pub instance: i32,
    pub src: String,
    pub dst: String,
    pub protocol: String,
    pub size_bytes: Option<i64>,
    pub bytes: i64,
    pub received_bytes: Option<i64>,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
    pub fct_us: Option<i64>,
    pub throughput_bps: Option<f64>,
    pub retransmissions: Option<i64>,
    pub error: Option<String>,
    /// The fidelity guard saw the emulator limit some link of the topology
    /// while the flow ran: its figures may measure the emulator.
    pub unfaithful: bool,
}

/// A flow as defined now, with how many instances it has.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowRow {
    pub topology: String,
    pub name: String,
    pub src: String,
    pub dst: String,
    pub count: u32,
    pub defined_generation: i64,
}

fn corrupt(topology: &str, reason: String) -> StoreError {
    StoreError::Corrupt {
        topology: topology.to_string(),
        reason,
    }
}

/// The topology's flows, by name, and the rows whose parameters cannot be read
/// (left out of the list).
pub(super) async fn load(
    executor: impl sqlx::PgExecutor<'_>,
    id: i64,
) -> Result<(Vec<PlannedFlow>, Vec<RowFault>)> {
    let mut faults = Vec::new();
    let flows = sqlx::query(
        "SELECT name, src, dst, path, params::text AS params, defined_generation, route_id \
         FROM flows WHERE topology_id = $1 ORDER BY name",
    )
    .bind(id)
    .fetch_all(executor)
    .await?
    .into_iter()
    .filter_map(|r| {
        let name: String = r.get("name");
        let params: FlowParams = match serde_json::from_str(&r.get::<String, _>("params")) {
            Ok(params) => params,
            Err(e) => {
                faults.push(RowFault {
                    part: FaultyPart::Flow(name.clone()),
                    subject: format!("flows {name} params"),
                    problem: format!("params: {e}"),
                });
                return None;
            }
        };
        Some(PlannedFlow {
            src: r.get("src"),
            dst: r.get("dst"),
            path: r.get("path"),
            params,
            defined_generation: r.get("defined_generation"),
            route_id: r.get::<Option<i32>, _>("route_id").map(|v| v as u32),
            name,
        })
    })
    .collect();
    Ok((flows, faults))
}

/// Replaces the topology's flows with the plan's, after its nodes and links are
/// in place (a flow's route is checked against them). With `keep_unchanged`,
/// flows defined as before keep their generation and route; otherwise (the
/// nodes were replaced, and with them the agents) every flow runs anew.
/// Returns the topology's generation once everything is written.
pub(super) async fn replace(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    plan: &Plan,
    keep_unchanged: bool,
) -> Result<i64> {
    let (old, _) = load(&mut **tx, id).await?;
    let old: HashMap<&str, &PlannedFlow> = old.iter().map(|f| (f.name.as_str(), f)).collect();
    let kept = |f: &PlannedFlow| {
        old.get(f.name.as_str())
            .filter(|o| keep_unchanged && o.same_definition(f))
            .copied()
    };
    // Routes of flows that go or change go with them.
    for o in old.values() {
        let stays = plan
            .flows
            .iter()
            .any(|f| f.name == o.name && kept(f).is_some());
        if !stays && let Some(route) = o.route_id {
            sqlx::query("DELETE FROM routes WHERE topology_id = $1 AND id = $2 AND name = $3")
                .bind(id)
                .bind(route as i32)
                .bind(route_name(&o.name))
                .execute(&mut **tx)
                .await?;
        }
    }
    sqlx::query("DELETE FROM flows WHERE topology_id = $1")
        .bind(id)
        .execute(&mut **tx)
        .await?;
    let mut routes: HashMap<&str, u32> = HashMap::new();
    for f in &plan.flows {
        let Some(path) = f.path.as_ref().filter(|_| kept(f).is_none()) else {
            continue;
        };
        sqlx::query("DELETE FROM routes WHERE topology_id = $1 AND name = $2")
            .bind(id)
            .bind(route_name(&f.name))
            .execute(&mut **tx)
            .await?;
        let route: i32 = sqlx::query_scalar(
            "INSERT INTO routes (topology_id, id, name, path) \
             VALUES ($1, (SELECT COALESCE(max(id), 0) + 1 FROM routes WHERE topology_id = $1), $2, $3) \
             RETURNING id",
        )
        .bind(id)
        .bind(route_name(&f.name))
        .bind(path)
        .fetch_one(&mut **tx)
        .await?;
        routes.insert(&f.name, route as u32);
    }
    // Read last: the route triggers above moved the generation on.
    let generation: i64 = sqlx::query_scalar("SELECT generation FROM topologies WHERE id = $1")
        .bind(id)
        .fetch_one(&mut **tx)
        .await?;
    let mut redefined = Vec::new();
    for f in &plan.flows {
        let (defined, route) = match kept(f) {
            Some(o) => (o.defined_generation, o.route_id),
            None => {
                redefined.push(f.name.clone());
                (generation, routes.get(f.name.as_str()).copied())
            }
        };
        let params = serde_json::to_string(&f.params)
            .map_err(|e| corrupt(&plan.topology, format!("flow {} params: {e}", f.name)))?;
        sqlx::query(
            "INSERT INTO flows (topology_id, name, src, dst, size_bytes, count, path, params, defined_generation, route_id) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10)",
        )
        .bind(id)
        .bind(&f.name)
        .bind(&f.src)
        .bind(&f.dst)
        .bind(f.params.size_bytes().map(|v| v as i64))
        .bind(f.params.count as i32)
        .bind(f.path.clone())
        .bind(params)
        .bind(defined)
        .bind(route.map(|r| r as i32))
        .execute(&mut **tx)
        .await?;
    }
    sqlx::query("DELETE FROM flow_results WHERE topology_id = $1 AND flow = ANY($2)")
        .bind(id)
        .bind(&redefined)
        .execute(&mut **tx)
        .await?;
    Ok(generation)
}

/// Stores what sources reported. Results of a definition that is no longer
/// current (the flow changed or went meanwhile) are dropped; a result stored
/// before is written again with the same values.
pub(super) async fn record_sent(pool: &PgPool, topology_id: i64, rows: &[SentRow]) -> Result<u64> {
    if rows.is_empty() {
        return Ok(0);
    }
    let col = |f: fn(&SentRow) -> String| rows.iter().map(f).collect::<Vec<_>>();
    let done = sqlx::query(
        "INSERT INTO flow_results (topology_id, flow, instance, src, dst, bytes, started_at, finished_at, \
           fct_us, throughput_bps, retransmissions, defined_generation, protocol, size_bytes, error) \
         SELECT $1, r.flow, r.instance, f.src, f.dst, r.bytes, r.started_at, r.finished_at, r.fct_us, \
           r.throughput_bps, r.retransmissions, r.gen, r.protocol, r.size_bytes, r.error \
         FROM UNNEST($2::text[], $3::int[], $4::bigint[], $5::timestamptz[], $6::timestamptz[], $7::bigint[], \
           $8::float8[], $9::bigint[], $10::bigint[], $11::text[], $12::bigint[], $13::text[]) \
           AS r(flow, instance, bytes, started_at, finished_at, fct_us, throughput_bps, retransmissions, gen, \
                protocol, size_bytes, error) \
         JOIN flows f ON f.topology_id = $1 AND f.name = r.flow AND f.defined_generation = r.gen \
         ON CONFLICT (topology_id, flow, instance) DO UPDATE SET bytes = EXCLUDED.bytes, \
           started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at, fct_us = EXCLUDED.fct_us, \
           throughput_bps = EXCLUDED.throughput_bps, retransmissions = EXCLUDED.retransmissions, \
           defined_generation = EXCLUDED.defined_generation, protocol = EXCLUDED.protocol, \
           size_bytes = EXCLUDED.size_bytes, error = EXCLUDED.error",
    )
    .bind(topology_id)
    .bind(col(|r| r.flow.clone()))
    .bind(rows.iter().map(|r| r.instance).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.bytes).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.started_at).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.finished_at).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.fct_us).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.throughput_bps).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.retransmissions).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.defined_generation).collect::<Vec<_>>())
    .bind(col(|r| r.protocol.clone()))
    .bind(rows.iter().map(|r| r.size_bytes).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.error.clone()).collect::<Vec<_>>())
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// Stores what sinks counted (udp), beside the sources' rows.
pub(super) async fn record_received(
    pool: &PgPool,
    topology_id: i64,
    rows: &[ReceivedRow],
) -> Result<u64> {
    if rows.is_empty() {
        return Ok(0);
    }
    let done = sqlx::query(
        "INSERT INTO flow_results (topology_id, flow, instance, src, dst, bytes, started_at, received_bytes, \
           defined_generation, protocol) \
         SELECT $1, r.flow, r.instance, f.src, f.dst, 0, r.started_at, r.received, r.gen, 'udp' \
         FROM UNNEST($2::text[], $3::int[], $4::timestamptz[], $5::bigint[], $6::bigint[]) \
           AS r(flow, instance, started_at, received, gen) \
         JOIN flows f ON f.topology_id = $1 AND f.name = r.flow AND f.defined_generation = r.gen \
         ON CONFLICT (topology_id, flow, instance) DO UPDATE SET received_bytes = EXCLUDED.received_bytes",
    )
    .bind(topology_id)
    .bind(rows.iter().map(|r| r.flow.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.instance).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.started_at).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.received_bytes).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.defined_generation).collect::<Vec<_>>())
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// How far a topology is for its flows to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readiness {
    /// The lowest generation every node has acknowledged.
    pub acked: i64,
    /// Whether both ends of every link last reported it connected. Agents
    /// acknowledge a config before their links have dialled, and a flow that
    /// started then would wait for them inside its first completion time.
    pub links_up: bool,
}

impl Readiness {
    /// The generation whose flows may start now (0: none yet).
    pub fn ready(&self) -> i64 {
        if self.links_up { self.acked } else { 0 }
    }
}

pub(super) async fn readiness(pool: &PgPool, topology_id: i64) -> Result<Readiness> {
    let row = sqlx::query(
        "SELECT COALESCE((SELECT min(acked_generation) FROM nodes WHERE topology_id = $1), 0) AS acked, \
           NOT EXISTS (SELECT 1 FROM links l WHERE l.topology_id = $1 AND \
             (SELECT count(*) FROM link_counters c WHERE c.topology_id = $1 AND c.link = l.name \
                AND c.connected AND (c.node = l.dialer OR c.node = l.acceptor)) < 2) AS links_up",
    )
    .bind(topology_id)
    .fetch_one(pool)
    .await?;
    Ok(Readiness {
        acked: row.get("acked"),
        links_up: row.get("links_up"),
    })
}

/// Stored results, by topology, flow and instance; `None` filters nothing.
pub(super) async fn results(
    pool: &PgPool,
    topology: Option<&str>,
    flow: Option<&str>,
) -> Result<Vec<FlowResultRow>> {
    let rows = sqlx::query(
        "SELECT t.key AS topology, r.flow, r.instance, r.src, r.dst, r.protocol, r.size_bytes, r.bytes, \
           r.received_bytes, r.started_at, r.finished_at, r.fct_us, r.throughput_bps, r.retransmissions, r.error, r.unfaithful \
         FROM flow_results_checked r JOIN topologies t ON t.id = r.topology_id \
         WHERE ($1::text IS NULL OR t.key = $1) AND ($2::text IS NULL OR r.flow = $2) \
         ORDER BY t.key, r.flow, r.instance",
    )
    .bind(topology)
    .bind(flow)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| FlowResultRow {
            topology: r.get("topology"),
            flow: r.get("flow"),
            instance: r.get("instance"),
            src: r.get("src"),
            dst: r.get("dst"),
            protocol: r.get("protocol"),
            size_bytes: r.get("size_bytes"),
            bytes: r.get("bytes"),
            received_bytes: r.get("received_bytes"),
            started_at: r.get("started_at"),
            finished_at: r.get("finished_at"),
            fct_us: r.get("fct_us"),
            throughput_bps: r.get("throughput_bps"),
            retransmissions: r.get("retransmissions"),
            error: r.get("error"),
            unfaithful: r.get("unfaithful"),
        })
        .collect())
}

/// The flows defined now, with their instance counts.
pub(super) async fn flows(pool: &PgPool, topology: Option<&str>) -> Result<Vec<FlowRow>> {
    let rows = sqlx::query(
        "SELECT t.key AS topology, f.name, f.src, f.dst, f.count, f.defined_generation \
         FROM flows f JOIN topologies t ON t.id = f.topology_id \
         WHERE ($1::text IS NULL OR t.key = $1) ORDER BY t.key, f.name",
    )
    .bind(topology)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| FlowRow {
            topology: r.get("topology"),
            name: r.get("name"),
            src: r.get("src"),
            dst: r.get("dst"),
            count: r.get::<i32, _>("count").max(0) as u32,
            defined_generation: r.get("defined_generation"),
        })
        .collect())
}

/// A Flow's status from its stored results: counts, phase and completion-time
/// percentiles (nearest rank) of the instances that completed.
pub fn flow_status(count: u32, results: &[&FlowResultRow]) -> crate::api::FlowStatus {
    use crate::api::{FlowPhase, FlowStatus};
    let mut fcts: Vec<i64> = results
        .iter()
        .filter(|r| r.error.is_none())
        .filter_map(|r| r.fct_us)
        .collect();
    fcts.sort_unstable();
    let failed = results.iter().filter(|r| r.error.is_some()).count() as u32;
    let completed = fcts.len() as u32;
    let percentile = |p: f64| {
        let rank = ((p / 100.0 * fcts.len() as f64).ceil() as usize).clamp(1, fcts.len().max(1));
        fcts.get(rank - 1).map(|&us| {
            crate::units::Duration::from_std(std::time::Duration::from_micros(us.max(0) as u64))
        })
    };
    let ended = completed + failed;
    let phase = if results.is_empty() {
        FlowPhase::Pending
    } else if ended < count {
        FlowPhase::Running
    } else if failed > 0 {
        FlowPhase::Failed
    } else {
        FlowPhase::Succeeded
    };
    FlowStatus {
        phase: Some(phase),
        total: count,
        completed,
        failed,
        unfaithful: results.iter().filter(|r| r.unfaithful).count() as u32,
        fct_p50: percentile(50.0),
        fct_p99: percentile(99.0),
        ..FlowStatus::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(instance: i32, fct_us: Option<i64>, error: Option<&str>) -> FlowResultRow {
        FlowResultRow {
            topology: "t".into(),
            flow: "f".into(),
            instance,
            src: "a".into(),
            dst: "b".into(),
            protocol: "tcp".into(),
            size_bytes: Some(1000),
            bytes: 1000,
            received_bytes: None,
            started_at: chrono::DateTime::default(),
            finished_at: fct_us.map(|_| chrono::DateTime::default()),
            fct_us,
            throughput_bps: None,
            retransmissions: Some(0),
            error: error.map(str::to_owned),
            unfaithful: false,
        }
    }

    #[test]
    fn status_counts_and_percentiles() {
        use crate::api::FlowPhase;
        let rows: Vec<FlowResultRow> = (1..=100)
            .map(|i| row(i, Some(i64::from(i) * 1000), None))
            .collect();
        let refs: Vec<&FlowResultRow> = rows.iter().collect();
        let s = flow_status(100, &refs);
        assert_eq!(
            (s.phase, s.completed, s.failed, s.total),
            (Some(FlowPhase::Succeeded), 100, 0, 100)
        );
        assert_eq!(s.fct_p50.map(|d| d.as_std().as_millis()), Some(50));
        assert_eq!(s.fct_p99.map(|d| d.as_std().as_millis()), Some(99));
        let s = flow_status(200, &refs);
        assert_eq!(s.phase, Some(FlowPhase::Running));
        let failed = [row(0, None, Some("reset"))];
        let s = flow_status(1, &failed.iter().collect::<Vec<_>>());
        assert_eq!(
            (s.phase, s.failed, s.fct_p50),
            (Some(FlowPhase::Failed), 1, None)
        );
        assert_eq!(flow_status(3, &[]).phase, Some(FlowPhase::Pending));
    }
}
