-- The database as an API (issue 22): a write that the YAML would refuse is
-- refused here, with a message naming the column, the key and the rule.
--
-- The rules for link parameters are not written in this file. They are JSON
-- Schema documents derived from the plan's Rust types (`plan::LinkParams` and
-- the YAML's limits), which every nextmini binary writes into
-- `nextmini_schemas` when it connects (`store::rules::install`). The functions
-- below read such a document; `store/rules/check.rs` is the same walk in Rust,
-- run by the hub on every row it loads. Keep the two in step: a test feeds both
-- random documents and compares their verdicts.
--
-- The operator's own connections carry `nextmini.writer=operator` (set when
-- they connect). Its writes were validated as YAML already, so the row checks
-- skip them, and so do the guards on structure: the operator changes a
-- topology's structure by re-applying it, which recreates what must change.

CREATE TABLE nextmini_schemas (
    name       TEXT PRIMARY KEY,
    schema     JSONB NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE FUNCTION nextmini_is_operator() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT COALESCE(current_setting('nextmini.writer', true), '') = 'operator'
$$;

-- ---------------------------------------------------------------------------
-- A JSON Schema walk (the subset schemars emits, plus four keywords of ours;
-- see store/rules/check.rs for their meaning).

CREATE FUNCTION nextmini_json_shown(v jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN length(v::text) > 60 THEN left(v::text, 60) || '…' ELSE v::text END
$$;

CREATE FUNCTION nextmini_json_listed(vals jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT COALESCE(string_agg(CASE jsonb_typeof(x) WHEN 'string' THEN x #>> '{}' ELSE x::text END,
                               ', ' ORDER BY o), '')
    FROM jsonb_array_elements(vals) WITH ORDINALITY AS e(x, o)
$$;

CREATE FUNCTION nextmini_json_is_integer(v jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_typeof(v) = 'number' AND (v #>> '{}') ~ '^-?[0-9]+$'
$$;

CREATE FUNCTION nextmini_json_types(types jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE jsonb_typeof(types) WHEN 'array' THEN types ELSE jsonb_build_array(types) END
$$;

CREATE FUNCTION nextmini_json_type_matches(types jsonb, v jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM jsonb_array_elements_text(nextmini_json_types(types)) AS t
        WHERE t = jsonb_typeof(v) OR (t = 'integer' AND nextmini_json_is_integer(v)))
$$;

CREATE FUNCTION nextmini_json_type_names(types jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT string_agg(CASE t WHEN 'integer' THEN 'an integer' WHEN 'object' THEN 'an object'
                             WHEN 'array' THEN 'an array' WHEN 'string' THEN 'a string'
                             WHEN 'number' THEN 'a number' WHEN 'boolean' THEN 'true or false'
                             ELSE t END, ' or ' ORDER BY o)
    FROM jsonb_array_elements_text(nextmini_json_types(types)) WITH ORDINALITY AS e(t, o)
$$;

CREATE FUNCTION nextmini_json_format_min(f text) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN f IN ('uint8', 'uint16', 'uint32', 'uint64', 'uint') THEN 0
        WHEN f = 'int8' THEN -128
        WHEN f = 'int16' THEN -32768
        WHEN f = 'int32' THEN -2147483648
        WHEN f IN ('int64', 'int') THEN -9223372036854775808
    END
$$;

CREATE FUNCTION nextmini_json_format_max(f text) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN f = 'uint8' THEN 255
        WHEN f = 'uint16' THEN 65535
        WHEN f = 'uint32' THEN 4294967295
        WHEN f IN ('uint64', 'uint') THEN 18446744073709551615
        WHEN f = 'int8' THEN 127
        WHEN f = 'int16' THEN 32767
        WHEN f = 'int32' THEN 2147483647
        WHEN f IN ('int64', 'int') THEN 9223372036854775807
    END
$$;

-- The number at a dotted path inside v, or NULL.
CREATE FUNCTION nextmini_json_dotted(v jsonb, path text) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(v #> string_to_array(path, '.')) = 'number'
                THEN (v #>> string_to_array(path, '.'))::numeric END
$$;

-- How many queues a stored scheduler serves (SchedulerKind::queues).
CREATE FUNCTION nextmini_json_queue_count(sch jsonb) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN jsonb_typeof(sch) IS DISTINCT FROM 'object' THEN 1
        WHEN sch ? 'wrr' THEN CASE WHEN jsonb_typeof(sch -> 'wrr' -> 'weights') = 'array'
                                   THEN jsonb_array_length(sch -> 'wrr' -> 'weights') ELSE 0 END
        WHEN sch ? 'drr' THEN CASE WHEN jsonb_typeof(sch -> 'drr' -> 'quantum_bytes') = 'array'
                                   THEN jsonb_array_length(sch -> 'drr' -> 'quantum_bytes') ELSE 0 END
        WHEN sch ? 'priority' THEN CASE WHEN nextmini_json_is_integer(sch -> 'priority' -> 'bands')
                                        THEN (sch -> 'priority' ->> 'bands')::numeric ELSE 0 END
        ELSE 1
    END
$$;

-- What a branch of a choice is called in a message: its values, or its one key.
CREATE FUNCTION nextmini_json_branch_names(b jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN jsonb_typeof(b -> 'enum') = 'array' THEN b -> 'enum'
        WHEN b ? 'const' THEN jsonb_build_array(b -> 'const')
        WHEN jsonb_typeof(b -> 'required') = 'array' AND jsonb_array_length(b -> 'required') = 1
             AND jsonb_typeof(b -> 'required' -> 0) = 'string' THEN b -> 'required'
        WHEN b ->> 'type' = 'null' THEN '[null]'::jsonb
        ELSE '[]'::jsonb
    END
$$;

-- The first problem of v under the schema s (root: the whole document, for
-- $ref), as 'path: what is wrong', or NULL when v is valid. ctx carries what
-- the value alone does not show ({"mtu": 1400}).
CREATE FUNCTION nextmini_json_problem(root jsonb, s jsonb, v jsonb, path text, ctx jsonb)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    p text;
    choice text;
    target jsonb;
    key text;
    sub jsonb;
    n numeric;
    lo numeric;
    hi numeric;
    len integer;
    i integer;
    set_keys text[];
    a text;
    b text;
    av numeric;
    bv numeric;
    lim numeric;
    t numeric;
    field text;
    queues numeric;
BEGIN
    IF s = 'true'::jsonb THEN
        RETURN NULL;
    END IF;
    IF s = 'false'::jsonb THEN
        RETURN path || ': is not allowed';
    END IF;
    IF jsonb_typeof(s) IS DISTINCT FROM 'object' THEN
        RETURN path || ': the rule document is malformed';
    END IF;
    IF s ? '$ref' THEN
        target := root #> string_to_array(substr(s ->> '$ref', 3), '/');
        IF target IS NULL THEN
            RETURN format('%s: the rule document lacks %s', path, s ->> '$ref');
        END IF;
        p := nextmini_json_problem(root, target, v, path, ctx);
        IF p IS NOT NULL THEN
            RETURN p;
        END IF;
    END IF;
    FOREACH choice IN ARRAY ARRAY['anyOf', 'oneOf'] LOOP
        IF jsonb_typeof(s -> choice) = 'array' THEN
            p := nextmini_json_choice(root, s -> choice, v, path, ctx);
            IF p IS NOT NULL THEN
                RETURN p;
            END IF;
        END IF;
    END LOOP;
    IF s ? 'type' AND jsonb_typeof(s -> 'type') IN ('string', 'array')
       AND NOT nextmini_json_type_matches(s -> 'type', v) THEN
        RETURN format('%s: must be %s, got %s', path, nextmini_json_type_names(s -> 'type'),
                      nextmini_json_shown(v));
    END IF;
    IF jsonb_typeof(s -> 'enum') = 'array'
       AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(s -> 'enum') x WHERE x = v) THEN
        RETURN format('%s: must be one of %s, got %s', path, nextmini_json_listed(s -> 'enum'),
                      nextmini_json_shown(v));
    END IF;
    IF s ? 'const' AND s -> 'const' <> v THEN
        RETURN format('%s: must be %s, got %s', path, nextmini_json_shown(s -> 'const'),
                      nextmini_json_shown(v));
    END IF;

    IF jsonb_typeof(v) = 'number' THEN
        n := (v #>> '{}')::numeric;
        lo := GREATEST((s ->> 'minimum')::numeric, nextmini_json_format_min(s ->> 'format'));
        hi := LEAST((s ->> 'maximum')::numeric, nextmini_json_format_max(s ->> 'format'));
        IF lo IS NOT NULL AND n < lo THEN
            RETURN format('%s: must be at least %s, got %s', path, lo, n);
        END IF;
        IF hi IS NOT NULL AND n > hi THEN
            RETURN format('%s: must be at most %s, got %s', path, hi, n);
        END IF;
        IF s -> 'x-minimum-mtu' = 'true'::jsonb AND nextmini_json_is_integer(ctx -> 'mtu')
           AND n < (ctx ->> 'mtu')::numeric THEN
            RETURN format('%s: must be at least the MTU (%s bytes), got %s: it could never pass a full-size packet',
                          path, ctx ->> 'mtu', n);
        END IF;
        RETURN NULL;
    END IF;

    IF jsonb_typeof(v) = 'object' THEN
        IF jsonb_typeof(s -> 'required') = 'array' THEN
            FOR key IN SELECT x FROM jsonb_array_elements_text(s -> 'required') WITH ORDINALITY e(x, o)
                       ORDER BY o LOOP
                IF NOT v ? key THEN
                    RETURN format('%s: missing key %s', path, key);
                END IF;
            END LOOP;
        END IF;
        IF s -> 'additionalProperties' = 'false'::jsonb THEN
            SELECT k INTO key FROM jsonb_object_keys(v) k
            WHERE NOT COALESCE(s -> 'properties', '{}'::jsonb) ? k
            ORDER BY k COLLATE "C" LIMIT 1;
            IF key IS NOT NULL THEN
                RETURN format('%s: unknown key %s (known keys: %s)', path, key,
                    (SELECT COALESCE(string_agg(k, ', ' ORDER BY k COLLATE "C"), '')
                     FROM jsonb_object_keys(COALESCE(s -> 'properties', '{}'::jsonb)) k));
            END IF;
        END IF;
        FOR key, sub IN SELECT e.key, e.value FROM jsonb_each(COALESCE(s -> 'properties', '{}'::jsonb)) e
                        ORDER BY e.key COLLATE "C" LOOP
            IF v ? key THEN
                p := nextmini_json_problem(root, sub, v -> key, path || '.' || key, ctx);
                IF p IS NOT NULL THEN
                    RETURN p;
                END IF;
            END IF;
        END LOOP;
        IF jsonb_typeof(s -> 'x-at-most-one') = 'array' THEN
            SELECT array_agg(k ORDER BY o) INTO set_keys
            FROM jsonb_array_elements_text(s -> 'x-at-most-one') WITH ORDINALITY e(k, o)
            WHERE v ? k AND jsonb_typeof(v -> k) <> 'null';
            IF cardinality(set_keys) > 1 THEN
                RETURN format('%s: set at most one of %s, got %s', path,
                              nextmini_json_listed(s -> 'x-at-most-one'), array_to_string(set_keys, ' and '));
            END IF;
        END IF;
        IF jsonb_typeof(s -> 'x-less-than') = 'array' AND jsonb_array_length(s -> 'x-less-than') = 2 THEN
            a := s -> 'x-less-than' ->> 0;
            b := s -> 'x-less-than' ->> 1;
            av := nextmini_json_dotted(v, a);
            bv := nextmini_json_dotted(v, b);
            IF av IS NOT NULL AND bv IS NOT NULL AND av >= bv THEN
                RETURN format('%s.%s: must be less than %s (%s), got %s', path, a, b, bv, av);
            END IF;
        END IF;
        IF s -> 'x-thresholds-fit-limit' = 'true'::jsonb THEN
            lim := nextmini_json_dotted(v, 'limit_packets');
            IF lim IS NOT NULL THEN
                FOREACH field IN ARRAY ARRAY['aqm.red.max_packets', 'aqm.ecn.threshold_packets'] LOOP
                    t := nextmini_json_dotted(v, field);
                    IF t IS NOT NULL AND t > lim THEN
                        RETURN format('%s.%s: must not exceed limit_packets (%s), got %s: the queue could never get that long',
                                      path, field, lim, t);
                    END IF;
                END LOOP;
            END IF;
        END IF;
        IF s -> 'x-classes-fit-scheduler' = 'true'::jsonb AND jsonb_typeof(v -> 'classes') = 'array' THEN
            queues := nextmini_json_queue_count(v -> 'scheduler');
            FOR i IN 0 .. jsonb_array_length(v -> 'classes') - 1 LOOP
                t := nextmini_json_dotted(v -> 'classes' -> i, 'queue');
                IF t IS NOT NULL AND t >= queues THEN
                    RETURN format('%s.classes[%s].queue: queue %s does not exist: the scheduler has %s queue(s), 0 to %s',
                                  path, i, t, queues, queues - 1);
                END IF;
            END LOOP;
        END IF;
        RETURN NULL;
    END IF;

    IF jsonb_typeof(v) = 'array' THEN
        len := jsonb_array_length(v);
        IF nextmini_json_is_integer(s -> 'minItems') AND len < (s ->> 'minItems')::numeric THEN
            RETURN format('%s: must list at least %s item(s), got %s', path, s ->> 'minItems', len);
        END IF;
        IF nextmini_json_is_integer(s -> 'maxItems') AND len > (s ->> 'maxItems')::numeric THEN
            RETURN format('%s: must list at most %s item(s), got %s', path, s ->> 'maxItems', len);
        END IF;
        FOR i IN 0 .. len - 1 LOOP
            IF jsonb_typeof(s -> 'prefixItems') = 'array' AND i < jsonb_array_length(s -> 'prefixItems') THEN
                sub := s -> 'prefixItems' -> i;
            ELSIF s ? 'items' THEN
                sub := s -> 'items';
            ELSE
                CONTINUE;
            END IF;
            p := nextmini_json_problem(root, sub, v -> i, format('%s[%s]', path, i), ctx);
            IF p IS NOT NULL THEN
                RETURN p;
            END IF;
        END LOOP;
    END IF;
    RETURN NULL;
END;
$$;

-- anyOf/oneOf (serde's enums: their branches never overlap): valid when a
-- branch takes the value; otherwise the problem of the branch the value meant.
CREATE FUNCTION nextmini_json_choice(root jsonb, branches jsonb, v jsonb, path text, ctx jsonb)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    b jsonb;
    live jsonb;
    key text;
BEGIN
    FOR b IN SELECT x FROM jsonb_array_elements(branches) WITH ORDINALITY e(x, o) ORDER BY o LOOP
        IF nextmini_json_problem(root, b, v, path, ctx) IS NULL THEN
            RETURN NULL;
        END IF;
    END LOOP;
    SELECT COALESCE(jsonb_agg(x ORDER BY o), '[]'::jsonb) INTO live
    FROM jsonb_array_elements(branches) WITH ORDINALITY e(x, o)
    WHERE jsonb_typeof(v) = 'null' OR (x ->> 'type') IS DISTINCT FROM 'null';
    IF jsonb_array_length(live) = 1 THEN
        RETURN nextmini_json_problem(root, live -> 0, v, path, ctx);
    END IF;
    IF jsonb_typeof(v) = 'object' AND (SELECT count(*) FROM jsonb_object_keys(v)) = 1 THEN
        key := (SELECT k FROM jsonb_object_keys(v) k);
        FOR b IN SELECT x FROM jsonb_array_elements(live) WITH ORDINALITY e(x, o) ORDER BY o LOOP
            IF b -> 'required' = jsonb_build_array(key) THEN
                RETURN nextmini_json_problem(root, b, v, path, ctx);
            END IF;
        END LOOP;
    END IF;
    RETURN format('%s: must be one of %s, got %s', path,
        nextmini_json_listed((SELECT COALESCE(jsonb_agg(n ORDER BY o, o2), '[]'::jsonb)
                              FROM jsonb_array_elements(live) WITH ORDINALITY e(x, o)
                              CROSS JOIN LATERAL jsonb_array_elements(nextmini_json_branch_names(x))
                                  WITH ORDINALITY f(n, o2))),
        nextmini_json_shown(v));
END;
$$;

-- The problem of one direction's link parameters in a topology, or NULL: what
-- the links trigger applies, callable on its own (the Python package asks it
-- before writing).
CREATE FUNCTION nextmini_link_params_problem(topology BIGINT, params jsonb, path text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    rules jsonb;
BEGIN
    SELECT schema INTO rules FROM nextmini_schemas WHERE name = 'link_params';
    IF rules IS NULL THEN
        RAISE EXCEPTION 'the rules for link parameters are not installed'
            USING HINT = 'run any nextmini command (or start the operator) once against this database';
    END IF;
    RETURN nextmini_json_problem(rules, rules, params, path,
        jsonb_build_object('mtu', (SELECT mtu FROM topologies WHERE id = topology)));
END;
$$;

-- ---------------------------------------------------------------------------
-- Row checks. Every refusal is a check_violation (SQLSTATE 23514) whose
-- message starts with the table and row, then the column.

CREATE FUNCTION nextmini_refuse(message text, hint text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF hint IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = message;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = message, HINT = hint;
END;
$$;

-- The first of `columns` whose value differs between two versions of a row
-- (as to_jsonb gives them), or NULL: what a structural guard refuses.
CREATE FUNCTION nextmini_changed_column(old jsonb, new jsonb, columns text[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT c FROM unnest(columns) WITH ORDINALITY AS u(c, o)
    WHERE old -> c IS DISTINCT FROM new -> c
    ORDER BY o LIMIT 1
$$;

-- Refuses a change of a link direction's parameters that breaks the rules.
CREATE FUNCTION nextmini_check_link_params(link text, topology BIGINT, params jsonb, path text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    p text := nextmini_link_params_problem(topology, params, path);
BEGIN
    IF p IS NOT NULL THEN
        PERFORM nextmini_refuse(format('links %s: %s', link, p), NULL);
    END IF;
END;
$$;

CREATE FUNCTION nextmini_check_link() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    col text;
BEGIN
    IF nextmini_is_operator() THEN
        RETURN COALESCE(NEW, OLD);
    END IF;
    IF TG_OP = 'INSERT' THEN
        PERFORM nextmini_refuse(format('links %s: a link is added in the topology''s YAML, not by INSERT', NEW.name),
            'add it to the Topology and apply it again (nextmini up -f, kubectl apply)');
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM nextmini_refuse(format('links %s: a link is removed in the topology''s YAML, not by DELETE', OLD.name),
            'to take a link down live, set its loss_ppm to 1000000; to remove it, edit the Topology and apply it again');
    END IF;
    col := nextmini_changed_column(to_jsonb(OLD), to_jsonb(NEW),
        ARRAY['topology_id', 'name', 'dialer', 'acceptor']);
    IF col IS NOT NULL THEN
        PERFORM nextmini_refuse(format('links %s: column %s may not change live (a link''s name and endpoints are the topology''s structure: agents and routes know the link by them)', OLD.name, col),
            'change the link in the YAML and apply it again');
    END IF;
    IF NEW.transport NOT IN ('tcp', 'quic') THEN
        PERFORM nextmini_refuse(format('links %s: column transport must be tcp or quic, got %L', OLD.name, NEW.transport), NULL);
    END IF;
    -- Only a direction that changes is checked, so a script can repair one
    -- direction of a row whose other one went bad behind the checks.
    IF NEW.params_forward IS DISTINCT FROM OLD.params_forward THEN
        PERFORM nextmini_check_link_params(OLD.name, NEW.topology_id, NEW.params_forward, 'params_forward');
    END IF;
    IF NEW.params_backward IS DISTINCT FROM OLD.params_backward THEN
        PERFORM nextmini_check_link_params(OLD.name, NEW.topology_id, NEW.params_backward, 'params_backward');
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER links_checked
    BEFORE INSERT OR UPDATE OR DELETE ON links
    FOR EACH ROW EXECUTE FUNCTION nextmini_check_link();

-- A node is its agent: what the agent was started with (name, addresses,
-- limits, credential, SOCKS servers) changes only by re-applying the YAML,
-- which restarts it. The hub's own columns (pid, stream state, ...) are free.
CREATE FUNCTION nextmini_check_node() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    col text;
BEGIN
    IF nextmini_is_operator() THEN
        RETURN COALESCE(NEW, OLD);
    END IF;
    IF TG_OP = 'INSERT' THEN
        PERFORM nextmini_refuse(format('nodes %s: a node is added in the topology''s YAML, not by INSERT', NEW.name),
            'add it to the Topology and apply it again (nextmini up -f, kubectl apply)');
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM nextmini_refuse(format('nodes %s: a node is removed in the topology''s YAML, not by DELETE (its agent would keep running)', OLD.name),
            'remove it from the Topology and apply it again');
    END IF;
    col := nextmini_changed_column(to_jsonb(OLD), to_jsonb(NEW),
        ARRAY['topology_id', 'name', 'idx', 'overlay_addr', 'underlay_addr', 'cpu_millis',
              'memory_bytes', 'credential_sha256', 'socks']);
    IF col IS NOT NULL THEN
        PERFORM nextmini_refuse(format('nodes %s: column %s may not change live (the node''s agent runs with it; a change restarts the node)', OLD.name, col),
            'change the node in the YAML and apply it again');
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER nodes_checked
    BEFORE INSERT OR UPDATE OR DELETE ON nodes
    FOR EACH ROW EXECUTE FUNCTION nextmini_check_node();

-- Flows are the Flow documents' rows: agents start them from a generation, so
-- a row edited in place would never run. Refused, with where to change them.
CREATE FUNCTION nextmini_check_flow() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF nextmini_is_operator() THEN
        RETURN COALESCE(NEW, OLD);
    END IF;
    PERFORM nextmini_refuse(format('flows %s: flows are defined by Flow documents; %s of a flow row would never run',
            COALESCE(NEW.name, OLD.name), lower(TG_OP)),
        'change the Flow in the YAML and apply it again (nextmini up -f, kubectl apply)');
    RETURN NULL;
END;
$$;

CREATE TRIGGER flows_checked
    BEFORE INSERT OR UPDATE OR DELETE ON flows
    FOR EACH ROW EXECUTE FUNCTION nextmini_check_flow();

-- A topology's addressing, placement and dataplane are fixed while it runs;
-- a control script may change its report interval (checked by the column's
-- CHECK) and move its generation forward.
CREATE FUNCTION nextmini_check_topology() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    col text;
BEGIN
    IF nextmini_is_operator() THEN
        RETURN COALESCE(NEW, OLD);
    END IF;
    IF TG_OP = 'INSERT' THEN
        PERFORM nextmini_refuse(format('topologies %s: a topology is created by applying its YAML (nextmini up -f, kubectl apply), not by INSERT', NEW.name), NULL);
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM nextmini_refuse(format('topologies %s: a topology is removed with nextmini down or kubectl delete, not by DELETE (its agents would keep running)', OLD.name), NULL);
    END IF;
    col := nextmini_changed_column(to_jsonb(OLD), to_jsonb(NEW),
        ARRAY['id', 'name', 'placement', 'runtime', 'overlay', 'underlay', 'processors', 'mapping',
              'mtu', 'ttl_decrement', 'source', 'created_at', 'link_cert_der', 'link_key_der']);
    IF col IS NOT NULL THEN
        PERFORM nextmini_refuse(format('topologies %s: column %s may not change live (every node runs with it)', OLD.name, col),
            'change it in the YAML and apply it again; the nodes are recreated');
    END IF;
    IF NEW.generation < OLD.generation THEN
        PERFORM nextmini_refuse(format('topologies %s: column generation may only grow (from %s, got %s): agents would keep what they run',
            OLD.name, OLD.generation, NEW.generation), NULL);
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER topologies_checked
    BEFORE INSERT OR UPDATE OR DELETE ON topologies
    FOR EACH ROW EXECUTE FUNCTION nextmini_check_topology();

-- Settings the hub reads: known keys with values of their type.
CREATE FUNCTION nextmini_check_setting() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    span interval;
BEGIN
    IF NEW.key <> 'metrics_retention' THEN
        PERFORM nextmini_refuse(format('settings %s: unknown key (known keys: metrics_retention)', NEW.key), NULL);
    END IF;
    BEGIN
        span := NEW.value::interval;
    EXCEPTION WHEN others THEN
        PERFORM nextmini_refuse(format('settings metrics_retention: column value must be an interval such as ''1 hour'', got %L', NEW.value), NULL);
    END;
    IF span < interval '1 minute' OR span > interval '10 years' THEN
        PERFORM nextmini_refuse(format('settings metrics_retention: column value must be between 1 minute and 10 years, got %L', NEW.value), NULL);
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER settings_checked
    BEFORE INSERT OR UPDATE ON settings
    FOR EACH ROW EXECUTE FUNCTION nextmini_check_setting();

-- ---------------------------------------------------------------------------
-- What the hub found wrong in rows it loaded (defence in depth: rows written
-- with the triggers disabled, or by an older schema). The hub replaces a
-- topology's list on every load and keeps running the last good state of each
-- bad row; `nextmini status` and the Topology's conditions show the list.
CREATE TABLE topology_problems (
    topology_id BIGINT NOT NULL REFERENCES topologies(id) ON DELETE CASCADE,
    -- e.g. 'links s-y params_forward'
    subject     TEXT NOT NULL,
    problem     TEXT NOT NULL,
    -- what the hub runs instead
    consequence TEXT NOT NULL,
    seen_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (topology_id, subject)
);
