//! Where each node's link listener is dialed (`nodes.endpoint`, issue 17.3):
//! written by the controller from what it finds in every cluster, read by
//! the hub when it builds a view.

use super::Result;
use sqlx::{PgPool, Row};
use std::collections::{BTreeMap, HashMap};

/// Makes the topology's recorded endpoints exactly `endpoints` (a node absent
/// from it, or mapped to `None`, has none). When any changed, the topology
/// moves to a new generation in the same transaction, so the hub sends the
/// nodes' dialers their new peer addresses. Returns whether any changed.
pub(super) async fn record(
    pool: &PgPool,
    topology: &str,
    endpoints: &BTreeMap<String, Option<String>>,
) -> Result<bool> {
    let mut tx = pool.begin().await?;
    let Some(id): Option<i64> =
        sqlx::query_scalar("SELECT id FROM topologies WHERE key = $1 FOR UPDATE")
            .bind(topology)
            .fetch_optional(&mut *tx)
            .await?
    else {
        return Ok(false);
    };
    let (names, values): (Vec<&str>, Vec<Option<&str>>) = endpoints
        .iter()
        .map(|(n, e)| (n.as_str(), e.as_deref()))
        .unzip();
    // Every node of the topology, so one that left `endpoints` loses its own.
    let changed = sqlx::query(
        "UPDATE nodes n SET endpoint = w.endpoint \
         FROM (SELECT n2.name, e.endpoint FROM nodes n2 \
               LEFT JOIN unnest($2::text[], $3::text[]) AS e(name, endpoint) ON e.name = n2.name \
               WHERE n2.topology_id = $1) AS w \
         WHERE n.topology_id = $1 AND n.name = w.name AND n.endpoint IS DISTINCT FROM w.endpoint",
    )
    .bind(id)
    .bind(names)
    .bind(values)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if changed > 0 {
        sqlx::query(
            "UPDATE topologies SET generation = generation + 1, updated_at = now() WHERE id = $1",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(changed > 0)
}

/// The recorded endpoints of a topology's nodes, by node name.
pub(super) async fn load(pool: &PgPool, topology: &str) -> Result<HashMap<String, String>> {
    let rows = sqlx::query(
        "SELECT n.name, n.endpoint FROM nodes n JOIN topologies t ON t.id = n.topology_id \
         WHERE t.key = $1 AND n.endpoint IS NOT NULL",
    )
    .bind(topology)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.get("name"), r.get("endpoint")))
        .collect())
}
