-- spec.dataplane.ttl: whether transit nodes decrement the IP TTL and answer
-- expiry with ICMP Time Exceeded. Existing topologies keep the transparent
-- behaviour they were created with.
ALTER TABLE topologies
    ADD COLUMN ttl_decrement BOOLEAN NOT NULL DEFAULT false;
