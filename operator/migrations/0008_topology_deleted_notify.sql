-- A deleted topology is a change too: the hub must drop its cached view and end
-- the sessions of that creation at once. Without this, a name deleted and
-- applied again (a new row, generation 1 again) reached the hub only through
-- the new row's first generation bump, and in between a new agent could be
-- served the deleted creation's view. The payload is the name, as for updates.
CREATE FUNCTION nextmini_notify_topology_deleted() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('nextmini_topology', OLD.name);
    RETURN OLD;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER topologies_deleted
    AFTER DELETE ON topologies
    FOR EACH ROW
    EXECUTE FUNCTION nextmini_notify_topology_deleted();
