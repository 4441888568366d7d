-- Live routing by SQL, the metrics history and flow results.

-- An explicit route: a node path through the topology. Packets of the traffic a
-- route rule sends onto it are label-switched along the path (the route id
-- travels in every link frame), so transit nodes need no per-flow state.
CREATE TABLE routes (
    topology_id BIGINT NOT NULL REFERENCES topologies(id) ON DELETE CASCADE,
    id          INTEGER NOT NULL CHECK (id > 0),
    name        TEXT NOT NULL,
    path        TEXT[] NOT NULL,
    PRIMARY KEY (topology_id, id),
    UNIQUE (topology_id, name)
);

-- Which traffic takes which route. Several rules with the same match and
-- different routes split that traffic per flow by weight (weighted multipath);
-- traffic no rule matches takes the shortest path.
CREATE TABLE route_rules (
    id          BIGSERIAL PRIMARY KEY,
    topology_id BIGINT NOT NULL REFERENCES topologies(id) ON DELETE CASCADE,
    src         TEXT NOT NULL,
    dst         TEXT NOT NULL,
    protocol    INTEGER CHECK (protocol BETWEEN 0 AND 255),
    src_port    INTEGER CHECK (src_port BETWEEN 1 AND 65535),
    dst_port    INTEGER CHECK (dst_port BETWEEN 1 AND 65535),
    route_id    INTEGER NOT NULL,
    weight      INTEGER NOT NULL DEFAULT 1 CHECK (weight > 0),
    FOREIGN KEY (topology_id, route_id) REFERENCES routes(topology_id, id) ON DELETE CASCADE
);
CREATE INDEX route_rules_by_topology ON route_rules (topology_id);

-- A route must follow links, visit no node twice, and a rule's route must run
-- from the rule's src to its dst: checked in the database, so a script's UPDATE
-- that would break forwarding fails with a message naming what is wrong.
CREATE FUNCTION nextmini_check_route() RETURNS trigger AS $$
DECLARE
    i INTEGER;
BEGIN
    IF cardinality(NEW.path) < 2 THEN
        RAISE EXCEPTION 'route %: path must name at least two nodes', NEW.name;
    END IF;
    IF (SELECT count(DISTINCT p) FROM unnest(NEW.path) p) <> cardinality(NEW.path) THEN
        RAISE EXCEPTION 'route %: path % visits a node twice', NEW.name, NEW.path;
    END IF;
    FOR i IN 1 .. cardinality(NEW.path) LOOP
        IF NOT EXISTS (SELECT 1 FROM nodes WHERE topology_id = NEW.topology_id AND name = NEW.path[i]) THEN
            RAISE EXCEPTION 'route %: path[%] names unknown node %', NEW.name, i - 1, NEW.path[i];
        END IF;
    END LOOP;
    FOR i IN 1 .. cardinality(NEW.path) - 1 LOOP
        IF NOT EXISTS (
            SELECT 1 FROM links WHERE topology_id = NEW.topology_id
              AND ((dialer = NEW.path[i] AND acceptor = NEW.path[i + 1])
                OR (dialer = NEW.path[i + 1] AND acceptor = NEW.path[i]))
        ) THEN
            RAISE EXCEPTION 'route %: no link between % and % (path[%] to path[%])',
                NEW.name, NEW.path[i], NEW.path[i + 1], i - 1, i;
        END IF;
    END LOOP;
    IF EXISTS (
        SELECT 1 FROM route_rules WHERE topology_id = NEW.topology_id AND route_id = NEW.id
          AND (src <> NEW.path[1] OR dst <> NEW.path[cardinality(NEW.path)])
    ) THEN
        RAISE EXCEPTION 'route %: a rule using it runs between other nodes than % and %',
            NEW.name, NEW.path[1], NEW.path[cardinality(NEW.path)];
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER routes_checked
    BEFORE INSERT OR UPDATE ON routes
    FOR EACH ROW EXECUTE FUNCTION nextmini_check_route();

CREATE FUNCTION nextmini_check_route_rule() RETURNS trigger AS $$
DECLARE
    p TEXT[];
BEGIN
    SELECT path INTO p FROM routes WHERE topology_id = NEW.topology_id AND id = NEW.route_id;
    IF p[1] <> NEW.src OR p[cardinality(p)] <> NEW.dst THEN
        RAISE EXCEPTION 'route rule %->%: route % runs from % to %', NEW.src, NEW.dst,
            NEW.route_id, p[1], p[cardinality(p)];
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER route_rules_checked
    BEFORE INSERT OR UPDATE ON route_rules
    FOR EACH ROW EXECUTE FUNCTION nextmini_check_route_rule();

-- A committed change of routes or rules moves the topology to a new generation
-- (once per statement); the topologies trigger then NOTIFYs the hub, which sends
-- the affected agents a delta.
CREATE FUNCTION nextmini_routing_changed() RETURNS trigger AS $$
BEGIN
    UPDATE topologies SET generation = generation + 1, updated_at = now()
    WHERE id IN (SELECT topology_id FROM changed);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER routes_inserted AFTER INSERT ON routes
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION nextmini_routing_changed();
CREATE TRIGGER routes_updated AFTER UPDATE ON routes
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION nextmini_routing_changed();
CREATE TRIGGER routes_deleted AFTER DELETE ON routes
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION nextmini_routing_changed();
CREATE TRIGGER route_rules_inserted AFTER INSERT ON route_rules
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION nextmini_routing_changed();
CREATE TRIGGER route_rules_updated AFTER UPDATE ON route_rules
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION nextmini_routing_changed();
CREATE TRIGGER route_rules_deleted AFTER DELETE ON route_rules
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION nextmini_routing_changed();

-- Per-link metrics over time, one row per (link, reporting node, report).
CREATE TABLE link_metrics (
    topology_id   BIGINT NOT NULL REFERENCES topologies(id) ON DELETE CASCADE,
    link          TEXT NOT NULL,
    node          TEXT NOT NULL,
    at            TIMESTAMPTZ NOT NULL,
    connected     BOOLEAN NOT NULL,
    tx_bytes      BIGINT NOT NULL,
    tx_packets    BIGINT NOT NULL,
    rx_bytes      BIGINT NOT NULL,
    rx_packets    BIGINT NOT NULL,
    drops         BIGINT NOT NULL,
    ecn_marks     BIGINT NOT NULL,
    queue_packets BIGINT NOT NULL,
    queue_bytes   BIGINT NOT NULL,
    rtt_us        BIGINT
);
CREATE INDEX link_metrics_by_link_time ON link_metrics (topology_id, link, node, at DESC);
CREATE INDEX link_metrics_by_time ON link_metrics (at);

-- Rates from consecutive samples: what control scripts usually want.
CREATE VIEW link_rates AS
SELECT topology_id, link, node, at,
       8.0 * (tx_bytes - lag(tx_bytes) OVER w)
           / NULLIF(EXTRACT(EPOCH FROM at - lag(at) OVER w), 0) AS tx_bps,
       8.0 * (rx_bytes - lag(rx_bytes) OVER w)
           / NULLIF(EXTRACT(EPOCH FROM at - lag(at) OVER w), 0) AS rx_bps,
       drops - lag(drops) OVER w AS new_drops,
       queue_packets, rtt_us, connected
FROM link_metrics
WINDOW w AS (PARTITION BY topology_id, link, node ORDER BY at);

-- A batch of metrics tells listeners which topologies have news (names only).
CREATE FUNCTION nextmini_metrics_inserted() RETURNS trigger AS $$
DECLARE
    t TEXT;
BEGIN
    FOR t IN SELECT DISTINCT tp.name FROM changed c JOIN topologies tp ON tp.id = c.topology_id LOOP
        PERFORM pg_notify('nextmini_metrics', t);
    END LOOP;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER link_metrics_inserted AFTER INSERT ON link_metrics
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION nextmini_metrics_inserted();

-- How often agents report, per topology (the Topology's spec.telemetry.interval).
ALTER TABLE topologies ADD COLUMN report_interval_ms INTEGER NOT NULL DEFAULT 1000
    CHECK (report_interval_ms BETWEEN 100 AND 60000);

-- Settings the hub reads (e.g. how long metrics are kept).
CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT INTO settings (key, value) VALUES ('metrics_retention', '1 hour');

-- Results of synthetic flows, one row per flow instance.
CREATE TABLE flow_results (
    topology_id     BIGINT NOT NULL REFERENCES topologies(id) ON DELETE CASCADE,
    flow            TEXT NOT NULL,
    instance        INTEGER NOT NULL,
    src             TEXT NOT NULL,
    dst             TEXT NOT NULL,
    bytes           BIGINT NOT NULL,
    started_at      TIMESTAMPTZ NOT NULL,
    finished_at     TIMESTAMPTZ,
    fct_us          BIGINT,
    throughput_bps  DOUBLE PRECISION,
    retransmissions BIGINT,
    PRIMARY KEY (topology_id, flow, instance)
);

-- Nodes whose agent went silent are marked by the hub; a listener can react.
ALTER TABLE nodes ADD COLUMN state_changed_at TIMESTAMPTZ NOT NULL DEFAULT now();

CREATE FUNCTION nextmini_node_state_changed() RETURNS trigger AS $$
BEGIN
    NEW.state_changed_at := now();
    PERFORM pg_notify('nextmini_nodes',
        (SELECT name FROM topologies WHERE id = NEW.topology_id) || '/' || NEW.name || ' ' || NEW.agent_state);
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER nodes_state_changed
    BEFORE UPDATE OF agent_state ON nodes
    FOR EACH ROW WHEN (OLD.agent_state IS DISTINCT FROM NEW.agent_state)
    EXECUTE FUNCTION nextmini_node_state_changed();
