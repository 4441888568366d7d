//! Whether a topology's links forward: each end reports its connection up, and
//! a keepalive probe has crossed the link and come back (its round-trip time
//! is in the metrics history). Agents acknowledging their configuration says
//! nothing about this; a link whose underlay cannot connect leaves every agent
//! acknowledged and the path dead.

use super::Result;
use sqlx::{PgPool, Row};

/// A link that does not forward yet, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkNotForwarding {
    pub link: String,
    pub reason: String,
}

pub(super) async fn links_not_forwarding(
    pool: &PgPool,
    topology: &str,
) -> Result<Vec<LinkNotForwarding>> {
    let rows = sqlx::query(
        "SELECT l.name, l.dialer, l.acceptor, \
           COALESCE(bool_or(c.node = l.dialer AND c.connected), false) AS dialer_up, \
           COALESCE(bool_or(c.node = l.acceptor AND c.connected), false) AS acceptor_up, \
           EXISTS (SELECT 1 FROM link_metrics m WHERE m.topology_id = l.topology_id \
                   AND m.link = l.name AND m.rtt_us IS NOT NULL) AS probed \
         FROM links l JOIN topologies t ON t.id = l.topology_id \
         LEFT JOIN link_counters c ON c.topology_id = l.topology_id AND c.link = l.name \
         WHERE t.key = $1 \
         GROUP BY l.topology_id, l.name, l.dialer, l.acceptor \
         ORDER BY l.name",
    )
    .bind(topology)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            let (dialer, acceptor): (String, String) = (r.get("dialer"), r.get("acceptor"));
            let reason = match (
                r.get::<bool, _>("dialer_up"),
                r.get::<bool, _>("acceptor_up"),
                r.get::<bool, _>("probed"),
            ) {
                (false, false, _) => {
                    format!("neither {dialer} nor {acceptor} reports it connected")
                }
                (false, true, _) => format!("{dialer} (the dialer) does not report it connected"),
                (true, false, _) => {
                    format!("{acceptor} (the acceptor) does not report it connected")
                }
                (true, true, false) => "connected, but no probe has crossed it yet".to_string(),
                (true, true, true) => return None,
            };
            Some(LinkNotForwarding {
                link: r.get("name"),
                reason,
            })
        })
        .collect())
}
