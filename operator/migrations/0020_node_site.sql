-- Where a node runs (issue 17.1): the MemberCluster that hosts it and its
-- region. NULL: where the topology is (the operator's own cluster, or this
-- machine), with no MemberCluster declared for it. A node moves only by
-- re-applying the YAML, which recreates it, so both are frozen like the rest
-- of what an agent is started with.
ALTER TABLE nodes ADD COLUMN cluster TEXT, ADD COLUMN region TEXT;

CREATE OR REPLACE FUNCTION nextmini_check_node() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    col text;
BEGIN
    IF nextmini_is_operator() THEN
        RETURN COALESCE(NEW, OLD);
    END IF;
    IF TG_OP = 'INSERT' THEN
        PERFORM nextmini_refuse(format('nodes %s: a node is added in the topology''s YAML, not by INSERT', NEW.name),
            'add it to the Topology and apply it again (nextmini up -f, kubectl apply)');
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM nextmini_refuse(format('nodes %s: a node is removed in the topology''s YAML, not by DELETE (its agent would keep running)', OLD.name),
            'remove it from the Topology and apply it again');
    END IF;
    col := nextmini_changed_column(to_jsonb(OLD), to_jsonb(NEW),
        ARRAY['topology_id', 'name', 'idx', 'overlay_addr', 'underlay_addr', 'cpu_millis',
              'memory_bytes', 'credential_sha256', 'socks', 'cluster', 'region']);
    IF col IS NOT NULL THEN
        PERFORM nextmini_refuse(format('nodes %s: column %s may not change live (the node''s agent runs with it; a change restarts the node)', OLD.name, col),
            'change the node in the YAML and apply it again');
    END IF;
    RETURN NEW;
END;
$$;
