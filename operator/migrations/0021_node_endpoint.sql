-- Where a node's link listener is dialed from (issue 17.3): written by the
-- operator for nodes in member clusters and for nodes that accept a link from
-- another cluster (a pod IP, a NodePort on a member's exposed address, a load
-- balancer's address, or the node's name in its own cluster's namespace).
-- NULL: the topology's own address for the node (its name in the headless
-- Service, or its underlay address in namespace mode). A change moves the
-- topology's generation (the operator's statement), so the hub tells the
-- node's dialers.
ALTER TABLE nodes ADD COLUMN endpoint TEXT
    CONSTRAINT nodes_endpoint_host_port CHECK (endpoint IS NULL OR endpoint ~ '^[^\s:/]+:[0-9]{1,5}$');

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
    IF OLD.endpoint IS DISTINCT FROM NEW.endpoint THEN
        PERFORM nextmini_refuse(format('nodes %s: column endpoint is where the operator found the node''s pod (its IP, NodePort or load balancer) and may not be written by hand', OLD.name),
            'set spec.exposure of the node''s MemberCluster instead');
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
