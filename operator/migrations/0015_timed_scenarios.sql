-- Timed scenarios (issue 18.2, DESIGN.md "Timed scenarios"): the events of a
-- topology's spec.scenario as planned, when its run started, and when each
-- event took effect on each agent it touches.

-- One row per event, in the manifest's order. A `set` event carries both
-- directions' full parameters from its instant on (what the link's layers and
-- the earlier events leave), in the stored form of `links.params_*`.
CREATE TABLE scenario_events (
    topology_id     BIGINT NOT NULL REFERENCES topologies(id) ON DELETE CASCADE,
    idx             INTEGER NOT NULL CHECK (idx >= 0),
    at_us           BIGINT NOT NULL CHECK (at_us >= 0),
    -- The link a `set`, `down` or `up` changes, or the node a `kill` or
    -- `restart` acts on.
    link            TEXT,
    node            TEXT,
    kind            TEXT NOT NULL CHECK (kind IN ('set', 'down', 'up', 'kill', 'restart')),
    params_forward  JSONB,
    params_backward JSONB,
    CHECK ((kind = 'set') = (params_forward IS NOT NULL AND params_backward IS NOT NULL)),
    CHECK ((kind IN ('kill', 'restart')) = (node IS NOT NULL AND link IS NULL)),
    CHECK ((kind IN ('kill', 'restart')) <> (link IS NOT NULL)),
    PRIMARY KEY (topology_id, idx)
);

-- The run's start: chosen by the hub once, when the topology first runs
-- (every agent acknowledged its config and every link forwards).
CREATE TABLE scenario_runs (
    topology_id BIGINT PRIMARY KEY REFERENCES topologies(id) ON DELETE CASCADE,
    starts_at   TIMESTAMPTZ NOT NULL
);

-- What each agent reported: when the event took effect on it (for a node's
-- event, the hub's runtime reports for the node). `skew_us` is applied minus
-- planned. The first report counts (a reconnect repeats none).
CREATE TABLE scenario_applied (
    topology_id BIGINT NOT NULL REFERENCES topologies(id) ON DELETE CASCADE,
    idx         INTEGER NOT NULL,
    node        TEXT NOT NULL,
    planned_at  TIMESTAMPTZ NOT NULL,
    applied_at  TIMESTAMPTZ NOT NULL,
    skew_us     BIGINT NOT NULL,
    error       TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (topology_id, idx, node)
);

-- The timeline per event: planned instant, when the first and the last agent
-- applied it, the worst skew. Grafana's annotations and `nextmini status`
-- read this.
CREATE VIEW scenario_timeline AS
SELECT t.name AS topology,
       e.idx,
       e.at_us,
       COALESCE(e.link, e.node) AS target,
       e.kind,
       r.starts_at + e.at_us * interval '1 microsecond' AS planned_at,
       min(a.applied_at) AS first_applied_at,
       max(a.applied_at) AS last_applied_at,
       max(abs(a.skew_us)) AS worst_skew_us,
       count(a.node) AS agents,
       COALESCE(string_agg(NULLIF(a.node || ': ' || a.error, a.node || ': '), '; '), '') AS errors
FROM scenario_events e
JOIN topologies t ON t.id = e.topology_id
LEFT JOIN scenario_runs r ON r.topology_id = e.topology_id
LEFT JOIN scenario_applied a ON a.topology_id = e.topology_id AND a.idx = e.idx
GROUP BY t.name, e.idx, e.at_us, e.link, e.node, e.kind, r.starts_at;

-- These rows come from the manifest and from the agents, never from a script:
-- a write by anyone but the operator and its hub is refused, naming the table.
CREATE FUNCTION nextmini_scenario_written_by_operator() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT nextmini_is_operator() THEN
        RAISE EXCEPTION '%: written by Nextmini from the Topology''s spec.scenario and the agents'' reports; apply the YAML to change the scenario', TG_TABLE_NAME
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER scenario_events_operator_only BEFORE INSERT OR UPDATE ON scenario_events
    FOR EACH ROW EXECUTE FUNCTION nextmini_scenario_written_by_operator();
CREATE TRIGGER scenario_runs_operator_only BEFORE INSERT OR UPDATE ON scenario_runs
    FOR EACH ROW EXECUTE FUNCTION nextmini_scenario_written_by_operator();
CREATE TRIGGER scenario_applied_operator_only BEFORE INSERT OR UPDATE ON scenario_applied
    FOR EACH ROW EXECUTE FUNCTION nextmini_scenario_written_by_operator();
