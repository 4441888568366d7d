//! The operator's view of a running topology, for `nextmini status`.

use super::Result;
use sqlx::{PgPool, Row};

#[derive(Debug, Clone, serde::Serialize)]
pub struct TopologyStatusRow {
    pub name: String,
    pub generation: i64,
    pub runtime: String,
    pub nodes: Vec<NodeStatusRow>,
    pub links: Vec<LinkStatusRow>,
    /// Rows the hub could not run as written, and what runs instead.
    pub problems: Vec<super::TopologyProblem>,
    /// Links whose traffic the emulator limited, now or within
    /// [`super::FIDELITY_HOLD_SECS`]: the fidelity guard's episodes.
    pub unfaithful: Vec<super::FidelityEpisode>,
    /// The timed scenario's events: planned, applied, worst skew.
    pub scenario: Vec<super::TimelineRow>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct NodeStatusRow {
    pub name: String,
    pub overlay_addr: String,
    pub underlay_addr: String,
    pub agent_state: String,
    pub pid: Option<i32>,
    pub acked_generation: i64,
}

/// A link with the counters its dialer and acceptor last reported.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LinkStatusRow {
    pub name: String,
    pub dialer: String,
    pub acceptor: String,
    pub transport: String,
    pub connected: bool,
    /// Bytes sent from dialer to acceptor (as counted by the dialer).
    pub bytes_forward: i64,
    /// Bytes sent from acceptor to dialer (as counted by the acceptor).
    pub bytes_backward: i64,
    /// Packets dropped in both directions (hand-off, queue, AQM, emulated loss).
    pub drops: i64,
    pub ecn_marks: i64,
    /// Packets queued in both directions at the last report.
    pub queue_packets: i64,
}

pub(super) async fn load(pool: &PgPool, name: &str) -> Result<Option<TopologyStatusRow>> {
    let Some(t) = sqlx::query("SELECT id, generation, runtime FROM topologies WHERE key = $1")
        .bind(name)
        .fetch_optional(pool)
        .await?
    else {
        return Ok(None);
    };
    let id: i64 = t.get("id");
    let nodes = sqlx::query(
        "SELECT name, overlay_addr, underlay_addr, agent_state, pid, acked_generation FROM nodes \
         WHERE topology_id = $1 ORDER BY idx",
    )
    .bind(id)
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| NodeStatusRow {
        name: r.get("name"),
        overlay_addr: r.get("overlay_addr"),
        underlay_addr: r.get("underlay_addr"),
        agent_state: r.get("agent_state"),
        pid: r.get("pid"),
        acked_generation: r.get("acked_generation"),
    })
    .collect();
    let links = sqlx::query(
        "SELECT l.name, l.dialer, l.acceptor, l.transport, \
            COALESCE(d.connected AND a.connected, false) AS connected, \
            COALESCE(d.tx_bytes, 0) AS fwd, COALESCE(a.tx_bytes, 0) AS bwd, \
            COALESCE(d.drops + d.drops_queue + d.drops_aqm + d.drops_loss + d.drops_loop, 0) \
              + COALESCE(a.drops + a.drops_queue + a.drops_aqm + a.drops_loss + a.drops_loop, 0) AS drops, \
            COALESCE(d.ecn_marks, 0) + COALESCE(a.ecn_marks, 0) AS ecn_marks, \
            COALESCE(d.queue_packets, 0) + COALESCE(a.queue_packets, 0) AS queue_packets \
         FROM links l \
         LEFT JOIN link_counters d ON d.topology_id = l.topology_id AND d.link = l.name AND d.node = l.dialer \
         LEFT JOIN link_counters a ON a.topology_id = l.topology_id AND a.link = l.name AND a.node = l.acceptor \
         WHERE l.topology_id = $1 ORDER BY l.name",
    )
    .bind(id)
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| LinkStatusRow {
        name: r.get("name"),
        dialer: r.get("dialer"),
        acceptor: r.get("acceptor"),
        transport: r.get("transport"),
        connected: r.get("connected"),
        bytes_forward: r.get("fwd"),
        bytes_backward: r.get("bwd"),
        drops: r.get("drops"),
        ecn_marks: r.get("ecn_marks"),
        queue_packets: r.get("queue_packets"),
    })
    .collect();
    Ok(Some(TopologyStatusRow {
        name: name.to_string(),
        generation: t.get("generation"),
        runtime: t.get("runtime"),
        nodes,
        links,
        problems: problems(pool, name).await?,
        unfaithful: super::fidelity::recent(pool, id).await?,
        scenario: super::scenario::timeline(pool, name).await?,
    }))
}

/// What the hub last found wrong in the topology's rows, by subject.
async fn problems(pool: &PgPool, name: &str) -> Result<Vec<super::TopologyProblem>> {
    let rows = sqlx::query(
        "SELECT p.subject, p.problem, p.consequence FROM topology_problems p \
         JOIN topologies t ON t.id = p.topology_id WHERE t.key = $1 ORDER BY p.subject",
    )
    .bind(name)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| super::TopologyProblem {
            subject: r.get("subject"),
            problem: r.get("problem"),
            consequence: r.get("consequence"),
        })
        .collect())
}
