-- The fidelity guard (issue 14, DESIGN.md "Fidelity guard"): every agent
-- judges each report window of the links it sends on, and says when the
-- emulator rather than the emulated link limited the traffic.

-- Cumulative late departures and the verdict on the last window, per sender.
ALTER TABLE link_counters
    ADD COLUMN late_packets BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN unfaithful TEXT NOT NULL DEFAULT '';

-- One row per episode: consecutive unfaithful windows of one link direction.
-- `ended_at` is NULL while it lasts (or when the agent vanished during it;
-- `last_seen_at` then bounds it).
CREATE TABLE fidelity_episodes (
    id           BIGSERIAL PRIMARY KEY,
    topology_id  BIGINT NOT NULL REFERENCES topologies(id) ON DELETE CASCADE,
    link         TEXT NOT NULL,
    -- The sending node: the episode is about its direction of the link.
    node         TEXT NOT NULL,
    peer         TEXT NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL,
    last_seen_at TIMESTAMPTZ NOT NULL,
    ended_at     TIMESTAMPTZ,
    windows      INTEGER NOT NULL DEFAULT 1,
    -- The latest window's reason.
    reason       TEXT NOT NULL
);
CREATE INDEX fidelity_episodes_by_time ON fidelity_episodes (topology_id, started_at);

-- Flow results with a flag: `unfaithful` when an episode anywhere in the
-- topology overlapped the flow's run, so its figures measured the emulator.
CREATE VIEW flow_results_checked AS
SELECT r.*,
       EXISTS (
           SELECT 1 FROM fidelity_episodes e
           WHERE e.topology_id = r.topology_id
             AND e.started_at <= COALESCE(r.finished_at, now())
             AND COALESCE(e.ended_at, e.last_seen_at) >= r.started_at
       ) AS unfaithful
FROM flow_results r;
