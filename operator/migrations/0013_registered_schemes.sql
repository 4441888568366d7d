-- Registered link schemes (issue 21.7, node-agent/src/sched/schemes): a link's
-- scheduler or AQM may name a scheme from the agent's registry, e.g.
-- {"scheduler": {"scheme": {"name": "pfabric", "settings": {...}}}}. The rule
-- document (written by the operator at start) lists the registered names; the
-- settings are the scheme's to check, so the class check here assumes the most
-- queues any scheduler may have (store/rules/check.rs says the same).
CREATE OR REPLACE FUNCTION nextmini_json_queue_count(sch jsonb) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN jsonb_typeof(sch) IS DISTINCT FROM 'object' THEN 1
        WHEN sch ? 'wrr' THEN CASE WHEN jsonb_typeof(sch -> 'wrr' -> 'weights') = 'array'
                                   THEN jsonb_array_length(sch -> 'wrr' -> 'weights') ELSE 0 END
        WHEN sch ? 'drr' THEN CASE WHEN jsonb_typeof(sch -> 'drr' -> 'quantum_bytes') = 'array'
                                   THEN jsonb_array_length(sch -> 'drr' -> 'quantum_bytes') ELSE 0 END
        WHEN sch ? 'priority' THEN CASE WHEN nextmini_json_is_integer(sch -> 'priority' -> 'bands')
                                        THEN (sch -> 'priority' ->> 'bands')::numeric ELSE 0 END
        WHEN sch ? 'scheme' THEN 64
        ELSE 1
    END
$$;
