-- The topology's link identity: every agent of the topology serves QUIC links
-- with this certificate and trusts only it. Kept across re-applies, so agents
-- that keep running keep matching their peers.
ALTER TABLE topologies
    ADD COLUMN link_cert_der BYTEA,
    ADD COLUMN link_key_der  BYTEA;

-- What the links' emulation pipelines report besides bytes and packets.
ALTER TABLE link_counters
    ADD COLUMN drops_queue   BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN drops_aqm     BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN drops_loss    BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN ecn_marks     BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN queue_packets BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN queue_bytes   BIGINT NOT NULL DEFAULT 0;
