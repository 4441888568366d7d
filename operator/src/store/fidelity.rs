//! Fidelity episodes (migration 0012): consecutive report windows in which an
//! agent found that the emulator, not the emulated link, limited a link's
//! traffic in its direction.

use super::Result;
use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};

/// How long an episode keeps the topology unfaithful after its last window:
/// long enough for a status check or a flow that just finished to see it.
pub const FIDELITY_HOLD_SECS: i64 = 60;
/// An episode whose agent has not reported for this long is over (the agent
/// or the hub went away during it).
const SILENT_SECS: i64 = 30;

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FidelityEpisode {
    pub link: String,
    /// The sending node: the episode is about its direction of the link.
    pub node: String,
    pub peer: String,
    pub started_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    pub windows: i32,
    pub reason: String,
}

impl FidelityEpisode {
    /// `s-y (n0 → n1): reason`, for conditions and events.
    pub fn describe(&self) -> String {
        format!(
            "{} ({} → {}): {}",
            self.link, self.node, self.peer, self.reason
        )
    }

    pub fn ongoing(&self) -> bool {
        self.ended_at.is_none()
    }
}

/// Starts an episode whose first window began at `started_at`; returns its id.
pub(super) async fn open(
    pool: &PgPool,
    topology_id: i64,
    link: &str,
    node: &str,
    started_at: DateTime<Utc>,
    at: DateTime<Utc>,
    reason: &str,
) -> Result<i64> {
    let row = sqlx::query(
        "INSERT INTO fidelity_episodes (topology_id, link, node, peer, started_at, last_seen_at, reason) \
         SELECT $1, $2, $3, \
                COALESCE((SELECT CASE WHEN l.dialer = $3 THEN l.acceptor ELSE l.dialer END \
                          FROM links l WHERE l.topology_id = $1 AND l.name = $2), ''), \
                $4, $5, $6 \
         RETURNING id",
    )
    .bind(topology_id)
    .bind(link)
    .bind(node)
    .bind(started_at)
    .bind(at)
    .bind(reason)
    .fetch_one(pool)
    .await?;
    Ok(row.get("id"))
}

/// One more unfaithful window of an ongoing episode.
pub(super) async fn extend(pool: &PgPool, id: i64, at: DateTime<Utc>, reason: &str) -> Result<()> {
    sqlx::query(
        "UPDATE fidelity_episodes SET last_seen_at = $2, windows = windows + 1, reason = $3 \
         WHERE id = $1",
    )
    .bind(id)
    .bind(at)
    .bind(reason)
    .execute(pool)
    .await?;
    Ok(())
}

/// Ends episodes: at `at`, or where they were last seen when `at` is `None`.
pub(super) async fn close(pool: &PgPool, ids: &[i64], at: Option<DateTime<Utc>>) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE fidelity_episodes SET ended_at = COALESCE($2, last_seen_at) \
         WHERE id = ANY($1) AND ended_at IS NULL",
    )
    .bind(ids)
    .bind(at)
    .execute(pool)
    .await?;
    Ok(())
}

/// Episodes that still make the topology unfaithful: ongoing, or ended less
/// than [`FIDELITY_HOLD_SECS`] ago. Newest first.
pub(super) async fn recent(pool: &PgPool, topology_id: i64) -> Result<Vec<FidelityEpisode>> {
    let rows = sqlx::query(
        "SELECT link, node, peer, started_at, last_seen_at, windows, reason, \
           CASE WHEN ended_at IS NULL AND last_seen_at < now() - make_interval(secs => $3) \
                THEN last_seen_at ELSE ended_at END AS ended_at \
         FROM fidelity_episodes \
         WHERE topology_id = $1 \
           AND COALESCE(ended_at, last_seen_at) > now() - make_interval(secs => $2) \
         ORDER BY last_seen_at DESC, link, node",
    )
    .bind(topology_id)
    .bind(FIDELITY_HOLD_SECS as f64)
    .bind(SILENT_SECS as f64)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| FidelityEpisode {
            link: r.get("link"),
            node: r.get("node"),
            peer: r.get("peer"),
            started_at: r.get("started_at"),
            last_seen_at: r.get("last_seen_at"),
            ended_at: r.get("ended_at"),
            windows: r.get("windows"),
            reason: r.get("reason"),
        })
        .collect())
}
