//! Explicit routes and the rules that send traffic onto them.

use super::Result;
use sqlx::{PgPool, Row};

/// A node path; packets on it carry `id` as their label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRow {
    pub id: u32,
    pub name: String,
    pub path: Vec<String>,
}

/// Traffic from `src` to `dst` (optionally one protocol and ports) onto a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRuleRow {
    pub id: i64,
    pub src: String,
    pub dst: String,
    pub protocol: Option<u8>,
    pub src_port: Option<u16>,
    pub dst_port: Option<u16>,
    pub route_id: u32,
    pub weight: u32,
}

pub(super) async fn load(
    pool: &PgPool,
    topology: &str,
) -> Result<(Vec<RouteRow>, Vec<RouteRuleRow>)> {
    // Both at once: on a change each is a round trip on the changed nodes' path.
    let (routes, rules) = tokio::try_join!(
        sqlx::query(
            "SELECT r.id, r.name, r.path FROM routes r JOIN topologies t ON t.id = r.topology_id \
             WHERE t.key = $1 ORDER BY r.id",
        )
        .bind(topology)
        .fetch_all(pool),
        sqlx::query(
            "SELECT r.id, r.src, r.dst, r.protocol, r.src_port, r.dst_port, r.route_id, r.weight \
             FROM route_rules r JOIN topologies t ON t.id = r.topology_id \
             WHERE t.key = $1 ORDER BY r.id",
        )
        .bind(topology)
        .fetch_all(pool),
    )?;
    let routes = routes
        .into_iter()
        .map(|r| RouteRow {
            id: r.get::<i32, _>("id") as u32,
            name: r.get("name"),
            path: r.get("path"),
        })
        .collect();
    let rules = rules
        .into_iter()
        .map(|r| RouteRuleRow {
            id: r.get("id"),
            src: r.get("src"),
            dst: r.get("dst"),
            protocol: r.get::<Option<i32>, _>("protocol").map(|v| v as u8),
            src_port: r.get::<Option<i32>, _>("src_port").map(|v| v as u16),
            dst_port: r.get::<Option<i32>, _>("dst_port").map(|v| v as u16),
            route_id: r.get::<i32, _>("route_id") as u32,
            weight: r.get::<i32, _>("weight") as u32,
        })
        .collect();
    Ok((routes, rules))
}
