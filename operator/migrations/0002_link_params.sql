-- Link emulation parameters per direction, as JSON documents (the plan's
-- `LinkParams`: keys as in the agent protocol, e.g. rate_bps, delay_us, queue,
-- scheduler, classes). A direction's parameter set is read and written whole,
-- and control scripts can change one key with jsonb_set.
--
-- `forward` is what the dialer sends, `backward` what the acceptor sends.

ALTER TABLE links
    ADD COLUMN params_forward  JSONB,
    ADD COLUMN params_backward JSONB;

-- Rows written before had one parameter set for both directions.
UPDATE links SET params_forward = jsonb_build_object(
        'rate_bps', rate_bps,
        'burst_bytes', NULL,
        'delay_us', delay_us,
        'jitter_us', jitter_us,
        'jitter_distribution', 'uniform',
        'loss_ppm', loss_ppm,
        'loss_correlation_ppm', NULL,
        'reorder_ppm', NULL,
        'duplicate_ppm', NULL,
        'corrupt_ppm', NULL,
        'queue', jsonb_build_object(
            'limit_packets', queue_packets,
            'limit_bytes', NULL,
            'aqm', 'taildrop'),
        'scheduler', 'fcfs',
        'classes', '[]'::jsonb);
UPDATE links SET params_backward = params_forward;

ALTER TABLE links
    ALTER COLUMN params_forward SET NOT NULL,
    ALTER COLUMN params_backward SET NOT NULL,
    ADD CONSTRAINT links_params_forward_object CHECK (jsonb_typeof(params_forward) = 'object'),
    ADD CONSTRAINT links_params_backward_object CHECK (jsonb_typeof(params_backward) = 'object'),
    DROP COLUMN rate_bps,
    DROP COLUMN delay_us,
    DROP COLUMN jitter_us,
    DROP COLUMN loss_ppm,
    DROP COLUMN queue_packets;

-- A link row changed in place (a control script's UPDATE) is a change of desired
-- state: bump the generation of its topology, once per statement, and the
-- topologies trigger NOTIFYs the hub. Rows an UPDATE left as they were do not
-- count. apply_plan deletes and re-inserts links and bumps the generation itself,
-- so it never fires this.
CREATE FUNCTION nextmini_links_changed() RETURNS trigger AS $$
BEGIN
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
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER links_changed
    AFTER UPDATE ON links
    REFERENCING OLD TABLE AS changed_old NEW TABLE AS changed_new
    FOR EACH STATEMENT
    EXECUTE FUNCTION nextmini_links_changed();
