-- spec.seed: the experiment's seed, from which every link's and every unseeded
-- synthetic flow's random draws derive (issue 18.4). A u64 stored by its bit
-- pattern; NULL when the topology sets none.
ALTER TABLE topologies
    ADD COLUMN seed BIGINT;
