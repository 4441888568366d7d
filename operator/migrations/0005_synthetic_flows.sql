-- Synthetic flows (issue 6).
--
-- A flow's workload as the planner resolved it (the plan's FlowParams as JSON:
-- protocol, amount, rate_bps, count, parallelism, mean_interarrival_us, seed,
-- ...), the generation in which it got that definition (agents start it once
-- every agent runs that generation), and the route carrying its explicit path.
ALTER TABLE flows
    ADD COLUMN params JSONB NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN defined_generation BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN route_id INTEGER,
    ADD CONSTRAINT flows_params_object CHECK (jsonb_typeof(params) = 'object');

-- One row per flow instance, written by the hub from the agents' reports. A
-- repeated report (after a reconnect) rewrites the same values.
--   bytes:          acknowledged (tcp) or sent (udp) by the source
--   received_bytes: what the sink counted (udp)
--   error:          why the instance ended early; NULL when it completed
ALTER TABLE flow_results
    ADD COLUMN defined_generation BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN protocol TEXT NOT NULL DEFAULT 'tcp',
    ADD COLUMN size_bytes BIGINT,
    ADD COLUMN received_bytes BIGINT,
    ADD COLUMN error TEXT;
