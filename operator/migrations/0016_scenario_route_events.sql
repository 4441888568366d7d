-- Route events in timed scenarios (issue 18.2, DESIGN.md "Timed scenarios"):
-- from the event's instant, traffic from `node` (the source, whose agent
-- applies the event) to route->>'dst', narrowed by protocol and ports, takes
-- the route `route_id` (a `routes` row named scenario/<idx>, carrying the
-- event's path); an event without a path ends the scenario's earlier rule for
-- the same traffic, and `route_id` is NULL.
ALTER TABLE scenario_events
    ADD COLUMN route JSONB,
    ADD COLUMN route_id INTEGER;

-- The kinds and the columns each kind sets, again with `route`. (The checks
-- of 0015 carry the names PostgreSQL gave them.)
ALTER TABLE scenario_events
    DROP CONSTRAINT scenario_events_kind_check,
    DROP CONSTRAINT scenario_events_check1,
    DROP CONSTRAINT scenario_events_check2;
ALTER TABLE scenario_events
    ADD CONSTRAINT scenario_events_kind_check
        CHECK (kind IN ('set', 'down', 'up', 'kill', 'restart', 'route')),
    ADD CONSTRAINT scenario_events_node_kinds
        CHECK ((kind IN ('kill', 'restart', 'route')) = (node IS NOT NULL AND link IS NULL)),
    ADD CONSTRAINT scenario_events_link_kinds
        CHECK ((kind IN ('set', 'down', 'up')) = (link IS NOT NULL)),
    ADD CONSTRAINT scenario_events_route_kind
        CHECK ((kind = 'route') = (route IS NOT NULL)
               AND (route_id IS NULL OR kind = 'route'));

-- A route event's target reads `src -> dst [proto P] [sport S] [dport D]
-- via n1,n2,…`, or `…: back to the stored routes` for one that ends a rule.
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
       COALESCE(string_agg(NULLIF(a.node || ': ' || a.error, a.node || ': '), '; '), '') AS errors
FROM scenario_events e
JOIN topologies t ON t.id = e.topology_id
LEFT JOIN scenario_runs r ON r.topology_id = e.topology_id
LEFT JOIN scenario_applied a ON a.topology_id = e.topology_id AND a.idx = e.idx
GROUP BY t.name, e.idx, e.at_us, e.link, e.node, e.kind, e.route, r.starts_at;
