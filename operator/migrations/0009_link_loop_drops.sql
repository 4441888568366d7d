-- Packets a node dropped because they reached the topology's hop limit on their
-- way out over the link: a routing loop runs through it. Counted per link so a
-- loop made by a route change shows where it is.
ALTER TABLE link_counters
    ADD COLUMN drops_loop BIGINT NOT NULL DEFAULT 0;
