-- Topologies are known by namespace and name. Two teams may each run a
-- topology called "wan" in their own Kubernetes namespace; before this only
-- one row per name could exist, and the second team got NameTaken.
--
-- `name` stays the topology's own name (what scripts filter on); `namespace`
-- is empty for a local topology that names none. `key` is how the operator,
-- the hub, the agents and their certificates refer to a topology:
-- "namespace/name", or the bare name without a namespace. Kubernetes names
-- hold no "/", so a key splits back without ambiguity.
ALTER TABLE topologies ADD COLUMN namespace TEXT NOT NULL DEFAULT ''
    CHECK (namespace !~ '/');
ALTER TABLE topologies ADD CONSTRAINT topologies_name_has_no_slash CHECK (name !~ '/') NOT VALID;

-- Rows of an operator of before: their runtime names their namespace.
UPDATE topologies SET namespace = substr(runtime, length('kubernetes/') + 1)
    WHERE runtime LIKE 'kubernetes/%';

ALTER TABLE topologies ADD COLUMN key TEXT NOT NULL
    GENERATED ALWAYS AS (CASE WHEN namespace = '' THEN name ELSE namespace || '/' || name END) STORED;
ALTER TABLE topologies DROP CONSTRAINT topologies_name_key;
ALTER TABLE topologies ADD CONSTRAINT topologies_key_key UNIQUE (key);
CREATE INDEX topologies_name ON topologies (name);

-- Every notification names the topology by its key, so a listener (the hub,
-- a control script) acts on the right one of two same-named topologies.
CREATE OR REPLACE FUNCTION nextmini_notify_topology() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('nextmini_topology', NEW.key);
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION nextmini_notify_topology_deleted() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('nextmini_topology', OLD.key);
    RETURN OLD;
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION nextmini_metrics_inserted() RETURNS trigger AS $$
DECLARE
    t TEXT;
BEGIN
    FOR t IN SELECT DISTINCT tp.key FROM changed c JOIN topologies tp ON tp.id = c.topology_id LOOP
        PERFORM pg_notify('nextmini_metrics', t);
    END LOOP;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

-- "key/node state": the node is what follows the last "/".
CREATE OR REPLACE FUNCTION nextmini_node_state_changed() RETURNS trigger AS $$
BEGIN
    NEW.state_changed_at := now();
    PERFORM pg_notify('nextmini_nodes',
        (SELECT key FROM topologies WHERE id = NEW.topology_id) || '/' || NEW.name || ' ' || NEW.agent_state);
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

-- The timeline keeps its columns (scripts read them) and adds the namespace
-- and the key, by which the operator finds one topology's events.
CREATE OR REPLACE VIEW scenario_timeline AS
SELECT t.name AS topology,
       e.idx,
       e.at_us,
       CASE WHEN e.kind = 'route' THEN
                e.node || ' -> ' || (e.route->>'dst')
                || COALESCE(' proto ' || (e.route->>'protocol'), '')
                || COALESCE(' sport ' || (e.route->>'srcPort'), '')
                || COALESCE(' dport ' || (e.route->>'dstPort'), '')
                || CASE WHEN e.route ? 'path'
                        THEN ' via ' || array_to_string(ARRAY(
                                 SELECT jsonb_array_elements_text(e.route->'path')), ',')
                        ELSE ': back to the stored routes' END
            ELSE COALESCE(e.link, e.node) END AS target,
       e.kind,
       r.starts_at + e.at_us * interval '1 microsecond' AS planned_at,
       min(a.applied_at) AS first_applied_at,
       max(a.applied_at) AS last_applied_at,
       max(abs(a.skew_us)) AS worst_skew_us,
       count(a.node) AS agents,
       COALESCE(string_agg(NULLIF(a.node || ': ' || a.error, a.node || ': '), '; '), '') AS errors,
       t.namespace,
       t.key AS topology_key
FROM scenario_events e
JOIN topologies t ON t.id = e.topology_id
LEFT JOIN scenario_runs r ON r.topology_id = e.topology_id
LEFT JOIN scenario_applied a ON a.topology_id = e.topology_id AND a.idx = e.idx
GROUP BY t.name, t.namespace, t.key, e.idx, e.at_us, e.link, e.node, e.kind, e.route, r.starts_at;
