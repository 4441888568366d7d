//! Plans to rows and back. The store is the source of truth for desired state:
//! the hub builds every snapshot from these rows, so a control script that edits
//! a link row is seen exactly like a re-applied manifest.

use super::{FaultyPart, Result, RowFault, StoreError};
use crate::plan::{
    Dataplane, LinkParams, Mapping, Packing, Placement, Plan, PlannedLink, PlannedNode, Resources,
    Transport,
};
use nextmini_proto::topology_key;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Postgres, Row, Transaction};
use std::collections::{BTreeMap, HashMap};

pub(super) async fn upsert_topology(
    tx: &mut Transaction<'_, Postgres>,
    plan: &Plan,
    runtime: &str,
    source: &str,
) -> Result<(i64, i64)> {
    let row = sqlx::query(
        "INSERT INTO topologies (name, placement, runtime, overlay, underlay, processors, mapping, mtu, source, report_interval_ms, ttl_decrement, seed, namespace) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
         ON CONFLICT (key) DO UPDATE SET generation = topologies.generation + 1, \
           placement = EXCLUDED.placement, runtime = EXCLUDED.runtime, overlay = EXCLUDED.overlay, \
           underlay = EXCLUDED.underlay, processors = EXCLUDED.processors, mapping = EXCLUDED.mapping, \
           mtu = EXCLUDED.mtu, source = EXCLUDED.source, report_interval_ms = EXCLUDED.report_interval_ms, \
           ttl_decrement = EXCLUDED.ttl_decrement, seed = EXCLUDED.seed, updated_at = now() \
         RETURNING id, generation",
    )
    .bind(topology_key::name_of(&plan.topology))
    .bind(placement_str(plan.placement))
    .bind(runtime)
    .bind(plan.overlay.to_string())
    .bind(plan.underlay.to_string())
    .bind(plan.dataplane.processors as i32)
    .bind(mapping_str(plan.dataplane.mapping))
    .bind(plan.dataplane.mtu as i32)
    .bind(source)
    .bind(plan.report_interval_ms as i32)
    .bind(plan.dataplane.ttl_decrement)
    // The bit pattern: a u64 seed above i64::MAX reads back the same.
    .bind(plan.seed.map(|s| s as i64))
    .bind(topology_key::split(&plan.topology).0.unwrap_or_default())
    .fetch_one(&mut **tx)
    .await?;
    Ok((row.get("id"), row.get("generation")))
}

pub(super) async fn replace_children(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    plan: &Plan,
    credential_sha256: &BTreeMap<String, String>,
) -> Result<()> {
    for sql in [
        "DELETE FROM links WHERE topology_id = $1",
        "DELETE FROM link_counters WHERE topology_id = $1",
        "DELETE FROM nodes WHERE topology_id = $1",
    ] {
        sqlx::query(sql).bind(id).execute(&mut **tx).await?;
    }
    insert_nodes(tx, id, plan, credential_sha256).await?;
    insert_links(tx, id, plan).await?;
    super::scenario::replace(tx, id, &plan.topology, &plan.scenario).await?;
    // New nodes mean new agents: every flow runs anew.
    super::flows::replace(tx, id, plan, false).await?;
    Ok(())
}

/// Replaces links and flows but keeps the nodes (and so their agents, their
/// credentials and stream state); counters of links that remain are kept, and
/// so are flows defined as before.
pub(super) async fn replace_links_and_flows(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    plan: &Plan,
) -> Result<()> {
    let kept: Vec<String> = plan.links.iter().map(|l| l.name.clone()).collect();
    sqlx::query("DELETE FROM link_counters WHERE topology_id = $1 AND NOT (link = ANY($2))")
        .bind(id)
        .bind(&kept)
        .execute(&mut **tx)
        .await?;
    sqlx::query("DELETE FROM links WHERE topology_id = $1")
        .bind(id)
        .execute(&mut **tx)
        .await?;
    insert_links(tx, id, plan).await?;
    super::scenario::replace(tx, id, &plan.topology, &plan.scenario).await?;
    // Flow routes move the generation past the one `upsert_topology` returned;
    // agents ack the last one, which is what waiting for the first needs.
    super::flows::replace(tx, id, plan, true).await?;
    Ok(())
}

/// Replaces links and flows, deletes the `removed` nodes and inserts the
/// `added` ones; every other node row (credential, agent state) stays.
pub(super) async fn change_nodes_links_and_flows(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    plan: &Plan,
    removed: &[String],
    added_credentials: &BTreeMap<String, String>,
) -> Result<()> {
    sqlx::query("DELETE FROM nodes WHERE topology_id = $1 AND name = ANY($2)")
        .bind(id)
        .bind(removed)
        .execute(&mut **tx)
        .await?;
    let added = Plan {
        nodes: plan
            .nodes
            .iter()
            .filter(|n| added_credentials.contains_key(&n.name))
            .cloned()
            .collect::<Vec<_>>()
            .into(),
        ..plan.clone()
    };
    insert_nodes(tx, id, &added, added_credentials).await?;
    replace_links_and_flows(tx, id, plan).await
}

async fn insert_nodes(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    plan: &Plan,
    credential_sha256: &BTreeMap<String, String>,
) -> Result<()> {
    let socks = plan
        .nodes
        .iter()
        .map(|n| serde_json::to_string(&n.socks))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| StoreError::Corrupt {
            topology: plan.topology.clone(),
            reason: format!("socks: {e}"),
        })?;
    // Columns as arrays, so the statement is the same for any number of nodes
    // (a VALUES list per size left a prepared statement per size in each
    // pooled connection).
    let nodes = &plan.nodes;
    sqlx::query(
        "INSERT INTO nodes (topology_id, name, idx, overlay_addr, underlay_addr, cpu_millis, memory_bytes, credential_sha256, socks, cluster, region) \
         SELECT $1, name, idx, overlay, underlay, cpu, memory, sha256, socks::jsonb, cluster, region \
         FROM unnest($2::text[], $3::int[], $4::text[], $5::text[], $6::int[], $7::bigint[], $8::text[], $9::text[], $10::text[], $11::text[]) \
           AS n(name, idx, overlay, underlay, cpu, memory, sha256, socks, cluster, region)",
    )
    .bind(id)
    .bind(nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>())
    .bind(nodes.iter().map(|n| n.index as i32).collect::<Vec<_>>())
    .bind(nodes.iter().map(|n| n.overlay.to_string()).collect::<Vec<_>>())
    .bind(nodes.iter().map(|n| n.underlay.to_string()).collect::<Vec<_>>())
    .bind(nodes.iter().map(|n| n.resources.cpu_millis.map(|c| c as i32)).collect::<Vec<_>>())
    .bind(nodes.iter().map(|n| n.resources.memory_bytes.map(|m| m as i64)).collect::<Vec<_>>())
    .bind(
        nodes
            .iter()
            .map(|n| credential_sha256.get(&n.name).cloned().unwrap_or_default())
            .collect::<Vec<_>>(),
    )
    .bind(socks)
    .bind(nodes.iter().map(|n| n.cluster.as_deref()).collect::<Vec<_>>())
    .bind(nodes.iter().map(|n| n.region.as_deref()).collect::<Vec<_>>())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn insert_links(tx: &mut Transaction<'_, Postgres>, id: i64, plan: &Plan) -> Result<()> {
    let links = &plan.links;
    // Bound as text and cast, so sqlx needs no JSON feature; arrays for one
    // statement text at any size (see insert_nodes).
    let (forward, backward): (Vec<String>, Vec<String>) = links
        .iter()
        .map(|l| {
            Ok((
                params_json(plan, &l.forward)?,
                params_json(plan, &l.backward)?,
            ))
        })
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    sqlx::query(
        "INSERT INTO links (topology_id, name, dialer, acceptor, transport, params_forward, params_backward) \
         SELECT $1, name, dialer, acceptor, transport, forward::jsonb, backward::jsonb \
         FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[]) \
           AS l(name, dialer, acceptor, transport, forward, backward)",
    )
    .bind(id)
    .bind(links.iter().map(|l| l.name.as_str()).collect::<Vec<_>>())
    .bind(links.iter().map(|l| l.dialer.as_str()).collect::<Vec<_>>())
    .bind(links.iter().map(|l| l.acceptor.as_str()).collect::<Vec<_>>())
    .bind(links.iter().map(|l| transport_str(l.transport)).collect::<Vec<_>>())
    .bind(forward)
    .bind(backward)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A topology's plan as stored, with the rows it could not take as written.
#[derive(Debug, Clone)]
pub struct LoadedPlan {
    pub plan: Plan,
    pub version: super::Version,
    /// `topologies.plan_generation`: when something other than routes, route
    /// rules or links changed in place last changed.
    pub plan_generation: i64,
    /// Rows that break the rules for what a row may hold; the plan has a
    /// stand-in for each (see [`FaultyPart`]).
    pub faults: Vec<RowFault>,
}

pub(super) async fn load(pool: &PgPool, name: &str) -> Result<Option<LoadedPlan>> {
    let Some(t) = sqlx::query(
        "SELECT id, generation, plan_generation, placement, overlay, underlay, processors, mapping, mtu, report_interval_ms, ttl_decrement, seed FROM topologies WHERE key = $1",
    )
    .bind(name)
    .fetch_optional(pool)
    .await?
    else {
        return Ok(None);
    };
    let corrupt = |reason: String| StoreError::Corrupt {
        topology: name.to_string(),
        reason,
    };
    let id: i64 = t.get("id");
    let mtu = t.get::<i32, _>("mtu") as u32;
    let overlay = t
        .get::<String, _>("overlay")
        .parse()
        .map_err(|e| corrupt(format!("overlay: {e}")))?;
    let underlay = t
        .get::<String, _>("underlay")
        .parse()
        .map_err(|e| corrupt(format!("underlay: {e}")))?;
    let mut faults = Vec::new();
    let nodes = sqlx::query(
        "SELECT name, idx, overlay_addr, underlay_addr, cpu_millis, memory_bytes, socks::text AS socks, cluster, region FROM nodes WHERE topology_id = $1 ORDER BY idx",
    )
    .bind(id)
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| {
        let name: String = r.get("name");
        let socks = match serde_json::from_str(&r.get::<String, _>("socks")) {
            Ok(socks) => socks,
            Err(e) => {
                faults.push(RowFault {
                    part: FaultyPart::NodeSocks(name.clone()),
                    subject: format!("nodes {name} socks"),
                    problem: e.to_string(),
                });
                Vec::new()
            }
        };
        Ok(PlannedNode {
            index: r.get::<i32, _>("idx") as u32,
            cluster: r.get("cluster"),
            region: r.get("region"),
            overlay: r
                .get::<String, _>("overlay_addr")
                .parse()
                .map_err(|e| corrupt(format!("node {name} overlay: {e}")))?,
            underlay: r
                .get::<String, _>("underlay_addr")
                .parse()
                .map_err(|e| corrupt(format!("node {name} underlay: {e}")))?,
            resources: Resources {
                cpu_millis: r.get::<Option<i32>, _>("cpu_millis").map(|v| v as u32),
                memory_bytes: r.get::<Option<i64>, _>("memory_bytes").map(|v| v as u64),
            },
            socks,
            name,
        })
    })
    .collect::<Result<Vec<_>>>()?;
    let rows = sqlx::query(
        "SELECT name, dialer, acceptor, transport, \
           params_forward::text AS params_forward, params_backward::text AS params_backward \
         FROM links WHERE topology_id = $1 ORDER BY name",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    let links = planned_links(rows, mtu, &mut faults);
    let (flows, flow_faults) = super::flows::load(pool, id).await?;
    let scenario = super::scenario::load(pool, id, name).await?;
    faults.extend(flow_faults);
    let plan = Plan {
        topology: name.to_string(),
        overlay,
        underlay,
        placement: parse_placement(&t.get::<String, _>("placement")),
        dataplane: Dataplane {
            processors: t.get::<i32, _>("processors") as u32,
            mapping: if t.get::<String, _>("mapping") == "concurrent" {
                Mapping::Concurrent
            } else {
                Mapping::Sequential
            },
            mtu,
            ttl_decrement: t.get("ttl_decrement"),
        },
        report_interval_ms: t.get::<i32, _>("report_interval_ms") as u32,
        seed: t.get::<Option<i64>, _>("seed").map(|s| s as u64),
        scenario,
        nodes: nodes.into(),
        links: links.into_iter().map(std::sync::Arc::new).collect(),
        flows,
    };
    let version = super::Version {
        id,
        generation: t.get("generation"),
    };
    Ok(Some(LoadedPlan {
        plan,
        version,
        plan_generation: t.get("plan_generation"),
        faults,
    }))
}

/// Link rows as planned links, each direction held to the database's rules;
/// a direction or transport that breaks them is a fault with a stand-in.
fn planned_links(rows: Vec<PgRow>, mtu: u32, faults: &mut Vec<RowFault>) -> Vec<PlannedLink> {
    let mut checker = ParamsChecker::new(mtu);
    let mut links = Vec::with_capacity(rows.len());
    for r in rows {
        let name: String = r.get("name");
        let mut direction = |column: &'static str, part: FaultyPart| match checker
            .check(column, &r.get::<String, _>(column))
        {
            Ok(params) => params,
            Err(problem) => {
                faults.push(RowFault {
                    part,
                    subject: format!("links {name} {column}"),
                    problem,
                });
                LinkParams::default()
            }
        };
        let forward = direction("params_forward", FaultyPart::LinkForward(name.clone()));
        let backward = direction("params_backward", FaultyPart::LinkBackward(name.clone()));
        let transport = match r.get::<String, _>("transport").as_str() {
            "tcp" => Transport::Tcp,
            "quic" => Transport::Quic,
            other => {
                faults.push(RowFault {
                    part: FaultyPart::LinkTransport(name.clone()),
                    subject: format!("links {name} transport"),
                    problem: format!("transport: must be tcp or quic, got {other:?}"),
                });
                Transport::Tcp
            }
        };
        links.push(PlannedLink {
            forward,
            backward,
            dialer: r.get("dialer"),
            acceptor: r.get("acceptor"),
            transport,
            name,
        });
    }
    links
}

/// Links of one topology changed in place after some generation, as the
/// hub's plan holds them, with the faults among their rows.
#[derive(Debug, Clone, Default)]
pub struct ChangedLinks {
    pub links: Vec<PlannedLink>,
    pub faults: Vec<RowFault>,
}

/// The links of topology `id` an UPDATE changed after generation `since`
/// (migration 0018 stamps each changed row): what a view at `since` needs to
/// reach the current one when `plan_generation` did not move.
pub(super) async fn links_changed_since(
    pool: &PgPool,
    id: i64,
    since: i64,
    mtu: u32,
) -> Result<ChangedLinks> {
    let rows = sqlx::query(
        "SELECT name, dialer, acceptor, transport, \
           params_forward::text AS params_forward, params_backward::text AS params_backward \
         FROM links WHERE topology_id = $1 AND changed_generation > $2 ORDER BY name",
    )
    .bind(id)
    .bind(since)
    .fetch_all(pool)
    .await?;
    let mut faults = Vec::new();
    let links = planned_links(rows, mtu, &mut faults);
    Ok(ChangedLinks { links, faults })
}

/// Holds stored link parameters to the rules the database applies to writes.
/// Most links of a topology share one parameter set (generators, linkDefaults),
/// so each distinct text is checked once per load.
struct ParamsChecker {
    rules: &'static serde_json::Value,
    ctx: super::rules::Context,
    seen: HashMap<(&'static str, String), std::result::Result<LinkParams, String>>,
}

impl ParamsChecker {
    fn new(mtu: u32) -> Self {
        ParamsChecker {
            rules: super::rules::link_params_cached(),
            ctx: super::rules::Context {
                mtu: Some(u64::from(mtu)),
            },
            seen: HashMap::new(),
        }
    }

    /// The parameters in `text`, or the problem as `column.key: reason`.
    fn check(
        &mut self,
        column: &'static str,
        text: &str,
    ) -> std::result::Result<LinkParams, String> {
        let key = (column, text.to_string());
        if let Some(known) = self.seen.get(&key) {
            return known.clone();
        }
        let verdict = serde_json::from_str::<serde_json::Value>(text)
            .map_err(|e| format!("{column}: {e}"))
            .and_then(
                |v| match super::rules::problem(self.rules, &v, column, self.ctx) {
                    Some(p) => Err(p),
                    None => serde_json::from_value::<LinkParams>(v)
                        .map_err(|e| format!("{column}: {e}")),
                },
            )
            .and_then(|p| match p.problem_beyond_rules() {
                Some((key, reason)) => Err(format!("{column}.{key}: {reason}")),
                None => Ok(p),
            });
        self.seen.insert(key, verdict.clone());
        verdict
    }
}

fn params_json(plan: &Plan, p: &LinkParams) -> Result<String> {
    serde_json::to_string(p).map_err(|e| StoreError::Corrupt {
        topology: plan.topology.clone(),
        reason: format!("link parameters do not serialize: {e}"),
    })
}

/// `topologies.placement`: the placement, and for packed ones the packing
/// (`packed:nodesPerWorker=50`, `packed:workers=4`), which the hub needs to
/// name every node's worker pod and ports.
pub fn placement_str(p: Placement) -> String {
    match p {
        Placement::Auto => "auto".into(),
        Placement::Netns => "netns".into(),
        Placement::PodPerNode => "pod-per-node".into(),
        Placement::Packed(Packing::NodesPerWorker(n)) => format!("packed:nodesPerWorker={n}"),
        Placement::Packed(Packing::Workers(n)) => format!("packed:workers={n}"),
    }
}

/// The inverse of [`placement_str`]; anything unknown reads as `netns`, the
/// placement of rows older than the column's other values.
pub fn parse_placement(s: &str) -> Placement {
    let number = |v: &str| v.parse::<u32>().ok().filter(|n| *n > 0);
    match s {
        "pod-per-node" => Placement::PodPerNode,
        "auto" => Placement::Auto,
        "packed" => Placement::Packed(Packing::default()),
        other => match other
            .strip_prefix("packed:")
            .and_then(|p| p.split_once('='))
        {
            Some(("nodesPerWorker", v)) => number(v).map_or(Placement::Netns, |n| {
                Placement::Packed(Packing::NodesPerWorker(n))
            }),
            Some(("workers", v)) => {
                number(v).map_or(Placement::Netns, |n| Placement::Packed(Packing::Workers(n)))
            }
            _ => Placement::Netns,
        },
    }
}

pub fn mapping_str(m: Mapping) -> &'static str {
    match m {
        Mapping::Sequential => "sequential",
        Mapping::Concurrent => "concurrent",
    }
}

pub fn transport_str(t: Transport) -> &'static str {
    match t {
        Transport::Tcp => "tcp",
        Transport::Quic => "quic",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_scheme_is_held_to_its_own_settings() {
        let mut checker = ParamsChecker::new(1500);
        let good = r#"{"scheduler": {"scheme": {"name": "pfabric", "settings": {"flows": [{"port": 80, "bytes": 1000}]}}}}"#;
        assert!(checker.check("params_forward", good).is_ok());
        let bad = r#"{"scheduler": {"scheme": {"name": "pfabric", "settings": {"flows": [{"port": 80, "bytes": 0}]}}}}"#;
        assert_eq!(
            checker.check("params_forward", bad).err().as_deref(),
            Some("params_forward.scheduler.scheme.settings.flows[0].bytes: must be greater than 0")
        );
        let classes = r#"{"scheduler": {"scheme": {"name": "pfabric", "settings": {"flows": []}}}, "classes": [{"queue": 0}]}"#;
        assert!(
            checker.check("params_backward", classes).is_err_and(
                |e| e.starts_with("params_backward.classes: the pfabric scheduler sorts")
            )
        );
        let pie = r#"{"queue": {"aqm": {"scheme": {"name": "pie", "settings": {"alpha": -1}}}}}"#;
        assert!(checker.check("params_forward", pie).is_err_and(|e| {
            e.starts_with("params_forward.queue.aqm.scheme.settings.alpha: must be above 0")
        }));
    }

    #[test]
    fn placements_round_trip_through_their_column() {
        for p in [
            Placement::Auto,
            Placement::Netns,
            Placement::PodPerNode,
            Placement::Packed(Packing::NodesPerWorker(50)),
            Placement::Packed(Packing::Workers(3)),
        ] {
            assert_eq!(parse_placement(&placement_str(p)), p, "{p:?}");
        }
        assert_eq!(
            placement_str(Placement::Packed(Packing::Workers(3))),
            "packed:workers=3"
        );
        assert_eq!(parse_placement("packed:workers=0"), Placement::Netns);
        assert_eq!(parse_placement("packed:cores=2"), Placement::Netns);
    }
}
