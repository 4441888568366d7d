-- SOCKS5 servers of a node's agent (issue 7): the plan's PlannedSocks list as
-- JSON ({listen, mode, users: [{name, password_sha256}]}), empty for most nodes.
ALTER TABLE nodes
    ADD COLUMN socks JSONB NOT NULL DEFAULT '[]'::jsonb,
    ADD CONSTRAINT nodes_socks_array CHECK (jsonb_typeof(socks) = 'array');
