//! Timed scenarios in the store (migration 0015): the planned events, written
//! with the topology; the run's start, chosen once by the hub; and when each
//! event took effect on each agent.

use super::{Result, StoreError};
use crate::plan::{DirectionPair, EventChange, LinkParams, PlannedEvent, RouteChange};
use chrono::{DateTime, Utc};
use sqlx::{PgPool, Postgres, Row, Transaction};
use std::time::Duration;

/// Replaces the topology's planned events (a re-applied manifest).
pub(super) async fn replace(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    topology: &str,
    events: &[PlannedEvent],
) -> Result<()> {
    sqlx::query("DELETE FROM scenario_events WHERE topology_id = $1")
        .bind(id)
        .execute(&mut **tx)
        .await?;
    let json = |p: &LinkParams| {
        serde_json::to_string(p).map_err(|e| StoreError::Corrupt {
            topology: topology.to_string(),
            reason: format!("scenario parameters do not serialize: {e}"),
        })
    };
    let route_ids = replace_routes(tx, id, events).await?;
    for (i, event) in events.iter().enumerate() {
        let (forward, backward) = match &event.change {
            EventChange::Params(pair) => (Some(json(&pair.forward)?), Some(json(&pair.backward)?)),
            EventChange::Up(_) | EventChange::Node { .. } | EventChange::Route(_) => (None, None),
        };
        let route = match &event.change {
            EventChange::Route(route) => {
                Some(
                    serde_json::to_string(route).map_err(|e| StoreError::Corrupt {
                        topology: topology.to_string(),
                        reason: format!("a route event does not serialize: {e}"),
                    })?,
                )
            }
            _ => None,
        };
        // A node's event, and a route event at its source node.
        let (link, node) = if event.change.is_node() || route.is_some() {
            (None, Some(&event.target))
        } else {
            (Some(&event.target), None)
        };
        sqlx::query(
            "INSERT INTO scenario_events (topology_id, idx, at_us, link, node, kind, params_forward, params_backward, route, route_id) \
             VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8::jsonb, $9::jsonb, $10)",
        )
        .bind(id)
        .bind(i32::try_from(i).unwrap_or(i32::MAX))
        .bind(i64::try_from(event.at.as_micros()).unwrap_or(i64::MAX))
        .bind(link)
        .bind(node)
        .bind(event.change.kind())
        .bind(forward)
        .bind(backward)
        .bind(route)
        .bind(route_ids.get(&i).copied())
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// Name of the route row carrying route event `idx`'s path.
pub fn route_name(idx: usize) -> String {
    format!("scenario/{idx}")
}

/// Writes the paths of the route events as routes (checked by the database
/// like any route), keeping the id of a row whose name stays, since agents
/// running the scenario refer to it; drops the rows of events gone. Returns
/// each event's route id by index.
async fn replace_routes(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    events: &[PlannedEvent],
) -> Result<std::collections::HashMap<usize, i32>> {
    let mut ids = std::collections::HashMap::new();
    for (i, event) in events.iter().enumerate() {
        let EventChange::Route(route) = &event.change else {
            continue;
        };
        let Some(path) = &route.path else {
            continue;
        };
        let route_id: i32 = sqlx::query_scalar(
            "INSERT INTO routes (topology_id, id, name, path) \
             VALUES ($1, (SELECT COALESCE(max(id), 0) + 1 FROM routes WHERE topology_id = $1), $2, $3) \
             ON CONFLICT (topology_id, name) DO UPDATE SET path = EXCLUDED.path \
             RETURNING id",
        )
        .bind(id)
        .bind(route_name(i))
        .bind(path)
        .fetch_one(&mut **tx)
        .await?;
        ids.insert(i, route_id);
    }
    let kept: Vec<String> = ids.keys().map(|&i| route_name(i)).collect();
    sqlx::query(
        "DELETE FROM routes WHERE topology_id = $1 AND name LIKE 'scenario/%' AND NOT (name = ANY($2))",
    )
    .bind(id)
    .bind(&kept)
    .execute(&mut **tx)
    .await?;
    Ok(ids)
}

/// The topology's planned events, in order.
pub(super) async fn load(pool: &PgPool, id: i64, topology: &str) -> Result<Vec<PlannedEvent>> {
    let rows = sqlx::query(
        "SELECT at_us, COALESCE(link, node) AS target, kind, params_forward::text AS f, params_backward::text AS b, \
                route::text AS route, route_id \
         FROM scenario_events WHERE topology_id = $1 ORDER BY idx",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    let corrupt = |reason: String| StoreError::Corrupt {
        topology: topology.to_string(),
        reason,
    };
    let params = |text: Option<String>| -> Result<LinkParams> {
        let text = text.ok_or_else(|| corrupt("a set event without parameters".into()))?;
        serde_json::from_str(&text).map_err(|e| corrupt(format!("scenario parameters: {e}")))
    };
    rows.into_iter()
        .map(|r| {
            let change = match r.get::<String, _>("kind").as_str() {
                "set" => EventChange::Params(Box::new(DirectionPair {
                    forward: params(r.get("f"))?,
                    backward: params(r.get("b"))?,
                })),
                "up" => EventChange::Up(true),
                "down" => EventChange::Up(false),
                "kill" => EventChange::Node { restart: false },
                "restart" => EventChange::Node { restart: true },
                "route" => {
                    let text: Option<String> = r.get("route");
                    let text =
                        text.ok_or_else(|| corrupt("a route event without its route".into()))?;
                    let mut route: RouteChange = serde_json::from_str(&text)
                        .map_err(|e| corrupt(format!("scenario route: {e}")))?;
                    route.route_id = r
                        .get::<Option<i32>, _>("route_id")
                        .and_then(|id| u32::try_from(id).ok());
                    EventChange::Route(Box::new(route))
                }
                other => return Err(corrupt(format!("scenario event kind {other:?}"))),
            };
            Ok(PlannedEvent {
                at: Duration::from_micros(u64::try_from(r.get::<i64, _>("at_us")).unwrap_or(0)),
                target: r.get("target"),
                change,
            })
        })
        .collect()
}

/// The run's start: the stored one, or `lead` from now when there is none yet
/// (concurrent callers agree on the first).
pub(super) async fn start(pool: &PgPool, id: i64, lead: Duration) -> Result<DateTime<Utc>> {
    sqlx::query(
        "INSERT INTO scenario_runs (topology_id, starts_at) \
         VALUES ($1, clock_timestamp() + $2 * interval '1 microsecond') ON CONFLICT DO NOTHING",
    )
    .bind(id)
    .bind(i64::try_from(lead.as_micros()).unwrap_or(i64::MAX))
    .execute(pool)
    .await?;
    Ok(
        sqlx::query_scalar("SELECT starts_at FROM scenario_runs WHERE topology_id = $1")
            .bind(id)
            .fetch_one(pool)
            .await?,
    )
}

/// The run's start, if it started.
pub(super) async fn started(pool: &PgPool, id: i64) -> Result<Option<DateTime<Utc>>> {
    Ok(
        sqlx::query_scalar("SELECT starts_at FROM scenario_runs WHERE topology_id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await?,
    )
}

/// One agent's report of an event.
#[derive(Debug, Clone, PartialEq)]
pub struct AppliedRow {
    pub idx: i32,
    pub planned_at: DateTime<Utc>,
    pub applied_at: DateTime<Utc>,
    pub error: String,
}

/// Stores reports; an event's first report from a node counts.
pub(super) async fn record_applied(
    pool: &PgPool,
    id: i64,
    node: &str,
    rows: &[AppliedRow],
) -> Result<()> {
    for r in rows {
        let skew = (r.applied_at - r.planned_at)
            .num_microseconds()
            .unwrap_or(i64::MAX);
        sqlx::query(
            "INSERT INTO scenario_applied (topology_id, idx, node, planned_at, applied_at, skew_us, error) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
        )
        .bind(id)
        .bind(r.idx)
        .bind(node)
        .bind(r.planned_at)
        .bind(r.applied_at)
        .bind(skew)
        .bind(&r.error)
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// One event of a topology's timeline as `nextmini status` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TimelineRow {
    pub idx: i32,
    pub at_us: i64,
    /// The link the event changes, or the node it acts on.
    pub target: String,
    pub kind: String,
    pub planned_at: Option<DateTime<Utc>>,
    pub last_applied_at: Option<DateTime<Utc>>,
    pub worst_skew_us: Option<i64>,
    /// Agents that reported it (2 when both ends of the link did).
    pub agents: i64,
    pub errors: String,
}

pub(super) async fn timeline(pool: &PgPool, topology: &str) -> Result<Vec<TimelineRow>> {
    let rows = sqlx::query(
        "SELECT idx, at_us, target, kind, planned_at, last_applied_at, worst_skew_us, agents, errors \
         FROM scenario_timeline WHERE topology_key = $1 ORDER BY idx",
    )
    .bind(topology)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| TimelineRow {
            idx: r.get("idx"),
            at_us: r.get("at_us"),
            target: r.get("target"),
            kind: r.get("kind"),
            planned_at: r.get("planned_at"),
            last_applied_at: r.get("last_applied_at"),
            worst_skew_us: r.get("worst_skew_us"),
            agents: r.get("agents"),
            errors: r.get("errors"),
        })
        .collect())
}

/// A node's event of a started scenario that no one has applied yet.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingNodeEvent {
    pub topology_id: i64,
    pub topology: String,
    pub idx: i32,
    pub node: String,
    pub restart: bool,
    pub planned_at: DateTime<Utc>,
}

/// Node events of started scenarios of topologies that run on `runtime`,
/// not yet applied, in order of their instants.
pub(super) async fn pending_node_events(
    pool: &PgPool,
    runtime: &str,
) -> Result<Vec<PendingNodeEvent>> {
    let rows = sqlx::query(
        "SELECT t.id, t.key AS name, e.idx, e.node, e.kind, \
                r.starts_at + e.at_us * interval '1 microsecond' AS planned_at \
         FROM scenario_events e JOIN topologies t ON t.id = e.topology_id \
         JOIN scenario_runs r ON r.topology_id = e.topology_id \
         WHERE e.kind IN ('kill', 'restart') AND t.runtime = $1 AND NOT EXISTS ( \
           SELECT 1 FROM scenario_applied a WHERE a.topology_id = e.topology_id AND a.idx = e.idx) \
         ORDER BY planned_at, e.idx",
    )
    .bind(runtime)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| PendingNodeEvent {
            topology_id: r.get("id"),
            topology: r.get("name"),
            idx: r.get("idx"),
            node: r.get("node"),
            restart: r.get::<String, _>("kind") == "restart",
            planned_at: r.get("planned_at"),
        })
        .collect())
}
