//! A running topology as a graph with its current load, read from the store:
//! nodes and links, and per link direction the rate over the last two reports
//! of the metrics history (`link_metrics`), the configured rate, queue, drops
//! and round trip. What `nextmini top`, `graph` and `status` show.

use crate::store::Store;
use serde::Serialize;
use sqlx::Row;
use std::collections::BTreeMap;

/// A report older than this says nothing about now: its agent is gone or hung.
const STALE_AFTER_SECS: f64 = 10.0;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopologyLoad {
    pub name: String,
    pub generation: i64,
    pub nodes: Vec<NodeInfo>,
    pub links: Vec<LinkLoad>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeInfo {
    pub name: String,
    pub overlay: String,
    pub agent_state: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkLoad {
    pub name: String,
    /// endpoints[0]; sends `forward`.
    pub dialer: String,
    /// endpoints[1]; sends `backward`.
    pub acceptor: String,
    pub transport: String,
    /// Both ends report the connection up, recently.
    pub up: bool,
    pub forward: DirectionLoad,
    pub backward: DirectionLoad,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DirectionLoad {
    /// Bits per second sent, from the last two reports (`None` until there are two).
    pub rate_bps: Option<f64>,
    /// Configured shaped rate (`None` = unlimited).
    pub configured_bps: Option<u64>,
    /// Packets dropped per second by the sender (all causes).
    pub drops_per_sec: Option<f64>,
    pub queue_packets: i64,
    pub rtt_us: Option<i64>,
    /// The sender's latest report says the connection is up.
    pub connected: bool,
}

impl DirectionLoad {
    /// Measured rate over configured rate (`None` when unlimited or unmeasured).
    pub fn utilisation(&self) -> Option<f64> {
        match (self.rate_bps, self.configured_bps) {
            (Some(r), Some(c)) if c > 0 => Some(r / c as f64),
            _ => None,
        }
    }
}

impl LinkLoad {
    /// The busier direction's utilisation.
    pub fn utilisation(&self) -> Option<f64> {
        match (self.forward.utilisation(), self.backward.utilisation()) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

/// One report of one direction, newest first per direction.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub age_secs: f64,
    pub at_secs: f64,
    pub tx_bytes: i64,
    pub drops: i64,
    pub queue_packets: i64,
    pub rtt_us: Option<i64>,
    pub connected: bool,
}

/// A direction's load from its newest reports (newest first).
pub fn direction_load(configured_bps: Option<u64>, samples: &[Sample]) -> DirectionLoad {
    let mut d = DirectionLoad {
        configured_bps,
        ..DirectionLoad::default()
    };
    let Some(latest) = samples.first() else {
        return d;
    };
    if latest.age_secs > STALE_AFTER_SECS {
        return d;
    }
    d.queue_packets = latest.queue_packets;
    d.rtt_us = latest.rtt_us;
    d.connected = latest.connected;
    if let Some(before) = samples.get(1) {
        let dt = latest.at_secs - before.at_secs;
        // A counter that went down is a restarted agent: no rate from that pair.
        if dt > 0.0 && latest.tx_bytes >= before.tx_bytes && latest.drops >= before.drops {
            d.rate_bps = Some(8.0 * (latest.tx_bytes - before.tx_bytes) as f64 / dt);
            d.drops_per_sec = Some((latest.drops - before.drops) as f64 / dt);
        }
    }
    d
}

/// Keys of all stored topologies (`namespace/name`, or the bare name).
pub async fn topology_names(store: &Store) -> Result<Vec<String>, sqlx::Error> {
    let rows = sqlx::query("SELECT key FROM topologies ORDER BY key")
        .fetch_all(store.pool())
        .await?;
    Ok(rows.iter().map(|r| r.get("key")).collect())
}

/// The link's endpoints (the sender of `forward`, the sender of `backward`),
/// or `None` when the topology has no such link.
pub async fn link_endpoints(
    store: &Store,
    topology: &str,
    link: &str,
) -> Result<Option<(String, String)>, sqlx::Error> {
    let row = sqlx::query(
        "SELECT l.dialer, l.acceptor FROM links l JOIN topologies t ON t.id = l.topology_id \
         WHERE t.key = $1 AND l.name = $2",
    )
    .bind(topology)
    .bind(link)
    .fetch_optional(store.pool())
    .await?;
    Ok(row.map(|r| (r.get("dialer"), r.get("acceptor"))))
}

/// The topology's graph and load, or `None` when there is no such topology.
pub async fn load(store: &Store, topology: &str) -> Result<Option<TopologyLoad>, sqlx::Error> {
    let pool = store.pool();
    let Some(t) = sqlx::query("SELECT id, generation FROM topologies WHERE key = $1")
        .bind(topology)
        .fetch_optional(pool)
        .await?
    else {
        return Ok(None);
    };
    let id: i64 = t.get("id");
    let nodes = sqlx::query(
        "SELECT name, overlay_addr, agent_state FROM nodes WHERE topology_id = $1 ORDER BY idx",
    )
    .bind(id)
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| NodeInfo {
        name: r.get("name"),
        overlay: r.get("overlay_addr"),
        agent_state: r.get("agent_state"),
    })
    .collect();
    // The newest two reports of each direction, through the (link, node, at)
    // index: cheap however long the history is.
    let rows = sqlx::query(
        "SELECT l.name, l.dialer, l.acceptor, l.transport, e.dir, \
                CASE WHEN (e.params ->> 'rate_bps') ~ '^[0-9]{1,18}$' \
                     THEN (e.params ->> 'rate_bps')::bigint END AS configured, \
                EXTRACT(EPOCH FROM now() - s.at)::float8 AS age, \
                EXTRACT(EPOCH FROM s.at)::float8 AS at_secs, \
                s.tx_bytes, s.drops, s.queue_packets, s.rtt_us, s.connected \
         FROM links l \
         CROSS JOIN LATERAL (VALUES ('forward', l.dialer, l.params_forward), \
                                    ('backward', l.acceptor, l.params_backward)) AS e(dir, node, params) \
         LEFT JOIN LATERAL ( \
             SELECT m.at, m.tx_bytes, m.drops, m.queue_packets, m.rtt_us, m.connected \
             FROM link_metrics m \
             WHERE m.topology_id = l.topology_id AND m.link = l.name AND m.node = e.node \
             ORDER BY m.at DESC LIMIT 2) s ON true \
         WHERE l.topology_id = $1 \
         ORDER BY l.name, e.dir, s.at DESC",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    // (name, dialer, acceptor, transport) -> per direction (configured rate, reports).
    type Key = (String, String, String, String);
    type Direction = (Option<u64>, Vec<Sample>);
    let mut links: BTreeMap<Key, [Direction; 2]> = BTreeMap::new();
    for r in rows {
        let key = (
            r.get::<String, _>("name"),
            r.get::<String, _>("dialer"),
            r.get::<String, _>("acceptor"),
            r.get::<String, _>("transport"),
        );
        let entry = links.entry(key).or_default();
        let slot = if r.get::<String, _>("dir") == "forward" {
            &mut entry[0]
        } else {
            &mut entry[1]
        };
        slot.0 = r
            .get::<Option<i64>, _>("configured")
            .and_then(|c| u64::try_from(c).ok())
            .filter(|c| *c > 0);
        if let (Some(age_secs), Some(at_secs)) = (
            r.get::<Option<f64>, _>("age"),
            r.get::<Option<f64>, _>("at_secs"),
        ) {
            slot.1.push(Sample {
                age_secs,
                at_secs,
                tx_bytes: r.get::<Option<i64>, _>("tx_bytes").unwrap_or(0),
                drops: r.get::<Option<i64>, _>("drops").unwrap_or(0),
                queue_packets: r.get::<Option<i64>, _>("queue_packets").unwrap_or(0),
                rtt_us: r.get("rtt_us"),
                connected: r.get::<Option<bool>, _>("connected").unwrap_or(false),
            });
        }
    }
    let links = links
        .into_iter()
        .map(|((name, dialer, acceptor, transport), [fwd, bwd])| {
            let forward = direction_load(fwd.0, &fwd.1);
            let backward = direction_load(bwd.0, &bwd.1);
            LinkLoad {
                name,
                dialer,
                acceptor,
                transport,
                up: forward.connected && backward.connected,
                forward,
                backward,
            }
        })
        .collect();
    Ok(Some(TopologyLoad {
        name: topology.to_string(),
        generation: t.get("generation"),
        nodes,
        links,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: f64, tx: i64, drops: i64) -> Sample {
        Sample {
            age_secs: 0.5,
            at_secs: at,
            tx_bytes: tx,
            drops,
            queue_packets: 3,
            rtt_us: Some(400),
            connected: true,
        }
    }

    #[test]
    fn rate_comes_from_the_last_two_reports() {
        let d = direction_load(
            Some(10_000_000),
            &[sample(101.0, 1_250_000, 10), sample(100.0, 0, 4)],
        );
        assert_eq!(d.rate_bps, Some(10_000_000.0));
        assert_eq!(d.drops_per_sec, Some(6.0));
        assert_eq!(d.utilisation(), Some(1.0));
        assert!(d.connected);
    }

    #[test]
    fn one_report_stale_reports_and_restarts_give_no_rate() {
        assert_eq!(direction_load(None, &[sample(1.0, 5, 0)]).rate_bps, None);
        let mut old = sample(2.0, 10, 0);
        old.age_secs = 60.0;
        let d = direction_load(None, &[old, sample(1.0, 0, 0)]);
        assert_eq!(d, DirectionLoad::default());
        let restarted = direction_load(None, &[sample(2.0, 10, 0), sample(1.0, 99, 0)]);
        assert_eq!(restarted.rate_bps, None);
        assert_eq!(direction_load(None, &[]).utilisation(), None);
    }
}
