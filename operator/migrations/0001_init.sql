-- Desired state of every topology, the agents' view of it, and what they report.
-- Rows of a topology hang off topologies(id) with ON DELETE CASCADE: deleting
-- the topology row removes everything it owns.

CREATE TABLE topologies (
    id          BIGSERIAL PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    -- Bumped on every change of desired state; agents acknowledge generations.
    generation  BIGINT NOT NULL DEFAULT 1,
    placement   TEXT NOT NULL,
    runtime     TEXT NOT NULL,
    overlay     TEXT NOT NULL,
    underlay    TEXT NOT NULL,
    processors  INTEGER NOT NULL,
    mapping     TEXT NOT NULL,
    mtu         INTEGER NOT NULL,
    source      TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE nodes (
    topology_id       BIGINT NOT NULL REFERENCES topologies(id) ON DELETE CASCADE,
    name              TEXT NOT NULL,
    idx               INTEGER NOT NULL,
    overlay_addr      TEXT NOT NULL,
    underlay_addr     TEXT NOT NULL,
    cpu_millis        INTEGER,
    memory_bytes      BIGINT,
    -- SHA-256 of the agent's credential; the credential itself is never stored.
    credential_sha256 TEXT NOT NULL,
    pid               INTEGER,
    -- pending | connected | disconnected
    agent_state       TEXT NOT NULL DEFAULT 'pending',
    acked_generation  BIGINT NOT NULL DEFAULT 0,
    last_seen         TIMESTAMPTZ,
    PRIMARY KEY (topology_id, name)
);

CREATE TABLE links (
    topology_id    BIGINT NOT NULL REFERENCES topologies(id) ON DELETE CASCADE,
    name           TEXT NOT NULL,
    dialer         TEXT NOT NULL,
    acceptor       TEXT NOT NULL,
    transport      TEXT NOT NULL,
    rate_bps       BIGINT,
    delay_us       BIGINT,
    jitter_us      BIGINT,
    loss_ppm       INTEGER,
    queue_packets  INTEGER,
    PRIMARY KEY (topology_id, name),
    FOREIGN KEY (topology_id, dialer) REFERENCES nodes(topology_id, name) ON DELETE CASCADE,
    FOREIGN KEY (topology_id, acceptor) REFERENCES nodes(topology_id, name) ON DELETE CASCADE
);

CREATE TABLE flows (
    topology_id  BIGINT NOT NULL REFERENCES topologies(id) ON DELETE CASCADE,
    name         TEXT NOT NULL,
    src          TEXT NOT NULL,
    dst          TEXT NOT NULL,
    size_bytes   BIGINT,
    count        INTEGER NOT NULL,
    path         TEXT[],
    PRIMARY KEY (topology_id, name)
);

-- Latest counters of each link as seen by each of its two endpoints.
CREATE TABLE link_counters (
    topology_id  BIGINT NOT NULL REFERENCES topologies(id) ON DELETE CASCADE,
    link         TEXT NOT NULL,
    node         TEXT NOT NULL,
    connected    BOOLEAN NOT NULL,
    tx_bytes     BIGINT NOT NULL,
    tx_packets   BIGINT NOT NULL,
    rx_bytes     BIGINT NOT NULL,
    rx_packets   BIGINT NOT NULL,
    drops        BIGINT NOT NULL,
    connects     BIGINT NOT NULL,
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (topology_id, link, node)
);

-- The hub turns a committed change of desired state into snapshots on the
-- agents' streams. The payload is the topology name, never the row.
CREATE FUNCTION nextmini_notify_topology() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('nextmini_topology', NEW.name);
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER topologies_generation_changed
    AFTER UPDATE OF generation ON topologies
    FOR EACH ROW WHEN (OLD.generation IS DISTINCT FROM NEW.generation)
    EXECUTE FUNCTION nextmini_notify_topology();
