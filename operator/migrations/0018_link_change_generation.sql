-- A link changed in place (a script's UPDATE of its parameters or transport)
-- no longer moves `plan_generation` (issue 16.4): its row carries the
-- generation that changed it, and the hub reads only the links changed since
-- the view it holds, instead of every node and link again (120 ms at 10,000
-- nodes). A link's name and endpoints cannot change live (links_checked), so
-- such a change never changes the graph.
ALTER TABLE links ADD COLUMN changed_generation BIGINT NOT NULL DEFAULT 0;
-- The hub's question, without reading every link of the topology (6-11 ms
-- at 10,000 links).
CREATE INDEX links_changed_generation ON links (topology_id, changed_generation);

-- The generation the statement's own bump (nextmini_links_changed, once per
-- statement, after the rows) will give the topology. The topology row is
-- locked first: a concurrent writer of the same topology's links then waits
-- for this one's commit and stamps its rows with a later generation, so a
-- hub that read generation G finds every later change with
-- changed_generation > G.
CREATE FUNCTION nextmini_link_changed_generation() RETURNS trigger AS $$
BEGIN
    IF to_jsonb(NEW) - 'changed_generation' IS DISTINCT FROM to_jsonb(OLD) - 'changed_generation' THEN
        SELECT generation + 1 INTO NEW.changed_generation
        FROM topologies WHERE id = NEW.topology_id FOR UPDATE;
    ELSE
        -- A statement that leaves the row as it was changes nothing,
        -- including the stamp a writer might have set by hand.
        NEW.changed_generation := OLD.changed_generation;
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER links_stamped
    BEFORE UPDATE ON links
    FOR EACH ROW EXECUTE FUNCTION nextmini_link_changed_generation();

-- Every new generation is a plan change unless the statement that makes it
-- says it changed only routes or only links in place.
CREATE OR REPLACE FUNCTION nextmini_plan_generation() RETURNS trigger AS $$
BEGIN
    IF coalesce(current_setting('nextmini.routing_only', true), '') <> 'on'
       AND coalesce(current_setting('nextmini.links_in_place', true), '') <> 'on' THEN
        NEW.plan_generation := NEW.generation;
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION nextmini_links_changed() RETURNS trigger AS $$
BEGIN
    PERFORM set_config('nextmini.links_in_place', 'on', true);
    UPDATE topologies SET generation = generation + 1, updated_at = now()
    WHERE id IN (
        SELECT n.topology_id
        FROM changed_new n
        LEFT JOIN changed_old o ON o.topology_id = n.topology_id AND o.name = n.name
        WHERE o.name IS NULL OR o IS DISTINCT FROM n
        UNION
        SELECT o.topology_id
        FROM changed_old o
        LEFT JOIN changed_new n ON n.topology_id = o.topology_id AND n.name = o.name
        WHERE n.name IS NULL
    );
    PERFORM set_config('nextmini.links_in_place', '', true);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
