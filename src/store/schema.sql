-- The schema of Clamp's database after every migration (src/store/migrations/), as
-- Postgres's catalog describes it: tables with their columns in order, constraints,
-- indexes, row types, sequences, views, functions and triggers, each sorted by name.
-- Generated, do not edit: the integration test schema::schema_sql_is_current (tests/it/schema.rs)
-- migrates a fresh database and fails when this file is stale; regenerate it with
--     CLAMP_BLESS=1 cargo test --test it schema::

CREATE TABLE audit_log (
    id bigint NOT NULL DEFAULT nextval('audit_log_id_seq'::regclass),
    at timestamp with time zone NOT NULL DEFAULT now(),
    actor text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,
    outcome text NOT NULL
);
ALTER TABLE audit_log ADD CONSTRAINT audit_log_pkey PRIMARY KEY (id);
CREATE UNIQUE INDEX audit_log_pkey ON public.audit_log USING btree (id);

CREATE TABLE concurrency_slots (
    id uuid NOT NULL,
    workflow_name text NOT NULL,
    concurrency_key text NOT NULL,
    queued boolean NOT NULL,
    rank smallint NOT NULL
);
ALTER TABLE concurrency_slots ADD CONSTRAINT concurrency_slots_pkey PRIMARY KEY (id);
CREATE INDEX concurrency_slots_held ON public.concurrency_slots USING btree (workflow_name, concurrency_key) WHERE (NOT queued);
CREATE UNIQUE INDEX concurrency_slots_pkey ON public.concurrency_slots USING btree (id);
CREATE INDEX concurrency_slots_queue ON public.concurrency_slots USING btree (workflow_name, concurrency_key, rank, id) WHERE queued;

CREATE TABLE concurrency_starts (
    workflow_name text NOT NULL,
    concurrency_key text NOT NULL,
    admitted_at timestamp with time zone NOT NULL
);
CREATE INDEX concurrency_starts_by_key ON public.concurrency_starts USING btree (workflow_name, concurrency_key, admitted_at);

CREATE TABLE console_sessions (
    id_hash bytea NOT NULL,
    token_digest bytea NOT NULL,
    created_at timestamp with time zone NOT NULL DEFAULT now(),
    seen_at timestamp with time zone NOT NULL DEFAULT now()
);
ALTER TABLE console_sessions ADD CONSTRAINT console_sessions_pkey PRIMARY KEY (id_hash);
CREATE UNIQUE INDEX console_sessions_pkey ON public.console_sessions USING btree (id_hash);
CREATE INDEX console_sessions_seen ON public.console_sessions USING btree (seen_at);

CREATE TABLE dead_letters (
    id bigint NOT NULL DEFAULT nextval('dead_letters_id_seq'::regclass),
    source text NOT NULL,
    topic text NOT NULL,
    partition integer,
    record_offset bigint,
    body bytea NOT NULL,
    reason text NOT NULL,
    created_at timestamp with time zone NOT NULL DEFAULT now()
);
ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_pkey PRIMARY KEY (id);
CREATE UNIQUE INDEX dead_letters_pkey ON public.dead_letters USING btree (id);

CREATE TABLE event_takes (
    service_request_id uuid NOT NULL,
    event text NOT NULL,
    event_id text NOT NULL,
    step_id integer NOT NULL
) PARTITION BY RANGE (service_request_id);
ALTER TABLE event_takes ADD CONSTRAINT event_takes_pkey PRIMARY KEY (service_request_id, event, event_id);
CREATE UNIQUE INDEX event_takes_pkey ON ONLY public.event_takes USING btree (service_request_id, event, event_id);

CREATE TABLE events (
    event text NOT NULL,
    id text NOT NULL,
    key text NOT NULL,
    payload text NOT NULL,
    traceparent text,
    received_at timestamp with time zone NOT NULL DEFAULT now(),
    keep_until timestamp with time zone NOT NULL
);
ALTER TABLE events ADD CONSTRAINT events_pkey PRIMARY KEY (event, id);
CREATE INDEX events_by_key ON public.events USING btree (event, key, received_at);
CREATE INDEX events_keep_until ON public.events USING btree (keep_until);
CREATE UNIQUE INDEX events_pkey ON public.events USING btree (event, id);

CREATE TABLE fan_joins (
    parent_id uuid NOT NULL,
    step_id integer NOT NULL,
    total integer NOT NULL,
    finished integer NOT NULL DEFAULT 0,
    failed integer NOT NULL DEFAULT 0,
    tolerated integer NOT NULL,
    branches text[],
    done boolean NOT NULL DEFAULT false,
    switch boolean NOT NULL DEFAULT false,
    max_iterations integer,
    last_child uuid
) PARTITION BY RANGE (parent_id);
ALTER TABLE fan_joins ADD CONSTRAINT fan_joins_pkey PRIMARY KEY (parent_id, step_id);
CREATE INDEX fan_joins_due ON ONLY public.fan_joins USING btree (parent_id) WHERE (NOT done);
CREATE UNIQUE INDEX fan_joins_pkey ON ONLY public.fan_joins USING btree (parent_id, step_id);

CREATE TABLE idempotency_keys (
    key_hash uuid NOT NULL,
    service_request_id uuid NOT NULL,
    created_at timestamp with time zone NOT NULL DEFAULT now()
);
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (key_hash);
CREATE INDEX idempotency_keys_created ON public.idempotency_keys USING brin (created_at);
CREATE UNIQUE INDEX idempotency_keys_pkey ON public.idempotency_keys USING btree (key_hash);

CREATE TABLE kafka_offsets (
    topic text NOT NULL,
    partition integer NOT NULL,
    next_offset bigint NOT NULL,
    updated_at timestamp with time zone NOT NULL DEFAULT now()
);
ALTER TABLE kafka_offsets ADD CONSTRAINT kafka_offsets_pkey PRIMARY KEY (topic, partition);
CREATE UNIQUE INDEX kafka_offsets_pkey ON public.kafka_offsets USING btree (topic, partition);

CREATE TABLE notifications (
    id bigint NOT NULL DEFAULT nextval('notifications_id_seq'::regclass),
    service_request_id uuid NOT NULL,
    workflow_name text NOT NULL,
    workflow_version integer NOT NULL,
    status text NOT NULL,
    reason text,
    finished_at timestamp with time zone NOT NULL DEFAULT now(),
    state text NOT NULL DEFAULT 'pending'::text,
    attempts integer NOT NULL DEFAULT 0,
    next_at timestamp with time zone NOT NULL DEFAULT now(),
    last_error text,
    delivered_at timestamp with time zone
);
ALTER TABLE notifications ADD CONSTRAINT notifications_pkey PRIMARY KEY (id);
CREATE INDEX notifications_due ON public.notifications USING btree (next_at, id) WHERE (state = 'pending'::text);
CREATE INDEX notifications_of_request ON public.notifications USING btree (service_request_id, id);
CREATE UNIQUE INDEX notifications_pkey ON public.notifications USING btree (id);

CREATE TABLE schedule_fires (
    schedule text NOT NULL,
    fire_at timestamp with time zone NOT NULL,
    service_request_id uuid,
    skipped text,
    created_at timestamp with time zone NOT NULL DEFAULT now()
);
ALTER TABLE schedule_fires ADD CONSTRAINT schedule_fires_pkey PRIMARY KEY (schedule, fire_at);
ALTER TABLE schedule_fires ADD CONSTRAINT schedule_fires_schedule_fkey FOREIGN KEY (schedule) REFERENCES schedules(name) ON DELETE CASCADE;
CREATE UNIQUE INDEX schedule_fires_pkey ON public.schedule_fires USING btree (schedule, fire_at);
CREATE INDEX schedule_fires_runs ON public.schedule_fires USING btree (schedule, fire_at) WHERE (service_request_id IS NOT NULL);

CREATE TABLE schedules (
    name text NOT NULL,
    definition jsonb NOT NULL,
    paused boolean NOT NULL DEFAULT false,
    next_fire_at timestamp with time zone,
    created_at timestamp with time zone NOT NULL DEFAULT now(),
    updated_at timestamp with time zone NOT NULL DEFAULT now()
);
ALTER TABLE schedules ADD CONSTRAINT schedules_pkey PRIMARY KEY (name);
CREATE INDEX schedules_due ON public.schedules USING btree (next_fire_at) WHERE (NOT paused);
CREATE UNIQUE INDEX schedules_pkey ON public.schedules USING btree (name);

CREATE TABLE schema_migrations (
    version integer NOT NULL,
    applied_at timestamp with time zone NOT NULL DEFAULT now()
);
ALTER TABLE schema_migrations ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);
CREATE UNIQUE INDEX schema_migrations_pkey ON public.schema_migrations USING btree (version);

CREATE TABLE service_requests (
    id uuid NOT NULL,
    workflow_name text NOT NULL,
    status text NOT NULL DEFAULT 'NEW'::text,
    payload text NOT NULL,
    headers text NOT NULL DEFAULT '[]'::text,
    current_step_id integer NOT NULL DEFAULT 0,
    step_request text,
    failed_step_id integer,
    lease_owner uuid,
    lease_until timestamp with time zone NOT NULL DEFAULT '-infinity'::timestamp with time zone,
    reason text,
    created_at timestamp with time zone NOT NULL DEFAULT now(),
    updated_at timestamp with time zone NOT NULL DEFAULT now(),
    finished_at timestamp with time zone,
    step_attempts integer NOT NULL DEFAULT 0,
    last_error text,
    retries integer NOT NULL DEFAULT 0,
    rerun_of uuid,
    workflow_version integer,
    parent_id uuid,
    parent_step_id integer,
    parent_told boolean,
    start_at timestamp with time zone,
    fan_index integer,
    wait_event text,
    wait_key text,
    wait_next integer,
    deadline timestamp with time zone,
    concurrency_key text,
    admitted_at timestamp with time zone,
    priority smallint,
    labels text[],
    notify smallint
) PARTITION BY RANGE (id);
ALTER TABLE service_requests ADD CONSTRAINT service_requests_pkey PRIMARY KEY (id);
CREATE INDEX service_requests_by_workflow ON ONLY public.service_requests USING btree (workflow_name, id) WITH (fillfactor='50');
CREATE INDEX service_requests_children ON ONLY public.service_requests USING btree (parent_id, id) WHERE (parent_id IS NOT NULL);
CREATE INDEX service_requests_claim_order ON ONLY public.service_requests USING btree ((
CASE
    WHEN (lease_owner = '00000000-0000-0000-0000-000000000000'::uuid) THEN (('2000000000000'::bigint)::double precision + date_part('epoch'::text, (created_at - '1970-01-01 00:00:00+00'::timestamp with time zone)))
    WHEN (status = 'PAUSED'::text) THEN
    CASE
        WHEN ((lease_until = 'infinity'::timestamp with time zone) OR (lease_until = '-infinity'::timestamp with time zone)) THEN 'Infinity'::double precision
        ELSE (('1000000000000'::bigint)::double precision + date_part('epoch'::text, (lease_until - '1970-01-01 00:00:00+00'::timestamp with time zone)))
    END
    WHEN (lease_until = '-infinity'::timestamp with time zone) THEN (date_part('epoch'::text, (created_at - '1970-01-01 00:00:00+00'::timestamp with time zone)) - ((COALESCE((priority)::integer, 5))::double precision * ('10000000000'::bigint)::double precision))
    WHEN (lease_until = 'infinity'::timestamp with time zone) THEN 'Infinity'::double precision
    ELSE (date_part('epoch'::text, (lease_until - '1970-01-01 00:00:00+00'::timestamp with time zone)) + (((9 - COALESCE((priority)::integer, 5)))::double precision * ('10000000000'::bigint)::double precision))
END)) INCLUDE (lease_until) WHERE ((status = ANY (ARRAY['NEW'::text, 'IN_PROGRESS'::text, 'RESUMED'::text])) OR ((status = 'PAUSED'::text) AND (lease_until > '-infinity'::timestamp with time zone)) OR (lease_owner = '00000000-0000-0000-0000-000000000000'::uuid));
CREATE INDEX service_requests_deadlines ON ONLY public.service_requests USING btree (deadline) WHERE ((deadline IS NOT NULL) AND (status = ANY (ARRAY['NEW'::text, 'IN_PROGRESS'::text, 'PAUSED'::text, 'RESUMED'::text])));
CREATE INDEX service_requests_event_waits ON ONLY public.service_requests USING btree (wait_event, wait_key) WHERE ((status = 'PAUSED'::text) AND (wait_event IS NOT NULL));
CREATE INDEX service_requests_failed_or_cancelled ON ONLY public.service_requests USING btree (id) WHERE (status = ANY (ARRAY['FAILED'::text, 'CANCELLED'::text]));
CREATE INDEX service_requests_failed_or_cancelled_by_workflow ON ONLY public.service_requests USING btree (workflow_name, id) WHERE (status = ANY (ARRAY['FAILED'::text, 'CANCELLED'::text]));
CREATE INDEX service_requests_fan_held ON ONLY public.service_requests USING btree (parent_id, parent_step_id, fan_index) WHERE ((lease_until = 'infinity'::timestamp with time zone) AND (parent_id IS NOT NULL));
CREATE INDEX service_requests_labels ON ONLY public.service_requests USING gin (labels) WHERE (labels IS NOT NULL);
CREATE UNIQUE INDEX service_requests_pkey ON ONLY public.service_requests USING btree (id) WITH (fillfactor='50');
CREATE INDEX service_requests_reruns ON ONLY public.service_requests USING btree (rerun_of, id) WHERE (rerun_of IS NOT NULL);
CREATE INDEX service_requests_untold_children ON ONLY public.service_requests USING btree (id) WHERE ((parent_id IS NOT NULL) AND (NOT parent_told) AND (status = ANY (ARRAY['COMPLETED'::text, 'FAILED'::text, 'CANCELLED'::text])));

CREATE TABLE steps_status (
    id bigint NOT NULL DEFAULT nextval('steps_status_id_seq'::regclass),
    service_request_id uuid NOT NULL,
    step_id integer NOT NULL,
    step_name text NOT NULL,
    status text NOT NULL,
    request text,
    response text,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone,
    time_taken_ms bigint,
    reason text,
    attempts integer NOT NULL DEFAULT 1,
    child_id uuid
) PARTITION BY RANGE (service_request_id);
ALTER TABLE steps_status ADD CONSTRAINT steps_status_pkey PRIMARY KEY (service_request_id, id);
CREATE UNIQUE INDEX steps_status_pkey ON ONLY public.steps_status USING btree (service_request_id, id);

CREATE TABLE triggers (
    name text NOT NULL,
    definition jsonb NOT NULL,
    paused boolean NOT NULL DEFAULT false,
    created_at timestamp with time zone NOT NULL DEFAULT now(),
    updated_at timestamp with time zone NOT NULL DEFAULT now()
);
ALTER TABLE triggers ADD CONSTRAINT triggers_pkey PRIMARY KEY (name);
CREATE UNIQUE INDEX triggers_pkey ON public.triggers USING btree (name);

CREATE TABLE workflow_pauses (
    workflow_name text NOT NULL,
    paused_at timestamp with time zone NOT NULL DEFAULT now(),
    paused_by text NOT NULL
);
ALTER TABLE workflow_pauses ADD CONSTRAINT workflow_pauses_pkey PRIMARY KEY (workflow_name);
CREATE UNIQUE INDEX workflow_pauses_pkey ON public.workflow_pauses USING btree (workflow_name);

CREATE TABLE workflow_versions (
    name text NOT NULL,
    version integer NOT NULL,
    description text NOT NULL DEFAULT ''::text,
    definition jsonb NOT NULL,
    created_at timestamp with time zone NOT NULL DEFAULT now()
);
ALTER TABLE workflow_versions ADD CONSTRAINT workflow_versions_pkey PRIMARY KEY (name, version);
CREATE UNIQUE INDEX workflow_versions_pkey ON public.workflow_versions USING btree (name, version);

CREATE TABLE workflows (
    id uuid NOT NULL,
    name text NOT NULL,
    description text NOT NULL DEFAULT ''::text,
    enabled boolean NOT NULL DEFAULT true,
    definition jsonb NOT NULL,
    created_at timestamp with time zone NOT NULL DEFAULT now(),
    updated_at timestamp with time zone NOT NULL DEFAULT now(),
    version integer NOT NULL DEFAULT 1
);
ALTER TABLE workflows ADD CONSTRAINT workflows_name_key UNIQUE (name);
ALTER TABLE workflows ADD CONSTRAINT workflows_pkey PRIMARY KEY (id);
CREATE UNIQUE INDEX workflows_name_key ON public.workflows USING btree (name);
CREATE UNIQUE INDEX workflows_pkey ON public.workflows USING btree (id);

CREATE TYPE new_request AS (
    id uuid,
    wf text,
    payload text,
    headers text,
    leased boolean,
    created timestamp with time zone,
    ver integer,
    deadline_ms double precision,
    priority smallint,
    labels text[],
    notify smallint
);

CREATE TYPE step_transition AS (
    id uuid,
    status text,
    next_step integer,
    next_request text,
    failed_step integer,
    reason text,
    release boolean,
    step_id integer,
    step_name text,
    step_status text,
    step_request text,
    step_response text,
    started_ms double precision,
    finished_ms double precision,
    step_reason text,
    step_attempts integer,
    attempts integer,
    retry_in_ms double precision,
    last_error text
);

-- sequences
CREATE SEQUENCE audit_log_id_seq AS bigint;
CREATE SEQUENCE dead_letters_id_seq AS bigint;
CREATE SEQUENCE notifications_id_seq AS bigint;
CREATE SEQUENCE steps_status_id_seq AS bigint;

-- functions
CREATE OR REPLACE FUNCTION public.clamp_add_partitions(lo uuid, hi uuid, suffix text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    t record;
    part text;
BEGIN
    FOR t IN SELECT * FROM clamp_partitioned_tables() LOOP
        part := t.tab || '_p' || suffix;
        CONTINUE WHEN to_regclass(part) IS NOT NULL;
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING STORAGE) WITH (%s)',
                       part, t.tab, clamp_partition_options(t.tab));
        EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                       t.tab, part, lo, hi);
    END LOOP;
END
$function$;
CREATE OR REPLACE FUNCTION public.clamp_partition_existing(bound uuid)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    t record;
    i record;
    old text;
    def text;
BEGIN
    FOR t IN SELECT * FROM clamp_partitioned_tables() LOOP
        CONTINUE WHEN (SELECT relkind FROM pg_class WHERE oid = t.tab::regclass) = 'p';
        old := t.tab || '_p0';
        EXECUTE format('ALTER TABLE %I RENAME TO %I', t.tab, old);
        -- Index names follow the table (an index that backs a constraint renames it too).
        FOR i IN SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
                 WHERE x.indrelid = old::regclass LOOP
            EXECUTE format('ALTER INDEX %I RENAME TO %I', i.relname, i.relname || '_p0');
        END LOOP;
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING STORAGE) PARTITION BY RANGE (%I)',
                       t.tab, old, t.key);
        EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (MINVALUE) TO (%L)',
                       t.tab, old, bound);
        -- The parent's indexes, as the old table had them: each finds its twin on the old
        -- table and takes it as its partition.
        FOR i IN SELECT c.relname, x.indexrelid, con.conname, con.contype
                 FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
                 LEFT JOIN pg_constraint con ON con.conindid = x.indexrelid
                 WHERE x.indrelid = old::regclass LOOP
            IF i.contype = 'p' THEN
                EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I PRIMARY KEY (%s)%s', t.tab,
                               left(i.conname, -3),
                               (SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY k.ord)
                                FROM pg_index x2
                                JOIN LATERAL unnest(x2.indkey) WITH ORDINALITY k(attnum, ord) ON true
                                JOIN pg_attribute a ON a.attrelid = x2.indrelid AND a.attnum = k.attnum
                                WHERE x2.indexrelid = i.indexrelid),
                               coalesce(' WITH (' || (SELECT array_to_string(reloptions, ', ')
                                                      FROM pg_class WHERE oid = i.indexrelid) || ')', ''));
            ELSE
                def := pg_get_indexdef(i.indexrelid);
                def := regexp_replace(def, '^(CREATE (UNIQUE )?INDEX )' || i.relname || ' ON (public\.)?' || old || ' ',
                                      '\1' || left(i.relname, -3) || ' ON ' || t.tab || ' ');
                EXECUTE def;
            END IF;
        END LOOP;
        -- What the bound's CHECK said, the partition's bound says now.
        FOR i IN SELECT conname FROM pg_constraint
                 WHERE conrelid = old::regclass AND conname = 'clamp_p0_bound' LOOP
            EXECUTE format('ALTER TABLE %I DROP CONSTRAINT clamp_p0_bound', old);
        END LOOP;
    END LOOP;
    -- The step records' ids come from a sequence that belonged to the old table.
    ALTER SEQUENCE IF EXISTS steps_status_id_seq OWNED BY steps_status.id;
END
$function$;
CREATE OR REPLACE FUNCTION public.clamp_partition_options(tab text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE tab
        WHEN 'service_requests' THEN 'fillfactor = 50, autovacuum_vacuum_scale_factor = 0.02, '
            'autovacuum_vacuum_threshold = 20000, autovacuum_vacuum_cost_delay = 0, '
            'autovacuum_vacuum_insert_scale_factor = 0.2, autovacuum_analyze_scale_factor = 0.05'
        ELSE 'autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_threshold = 20000, '
            'autovacuum_vacuum_cost_delay = 0, autovacuum_vacuum_insert_scale_factor = 0.2'
    END
$function$;
CREATE OR REPLACE FUNCTION public.clamp_partitioned_tables()
 RETURNS TABLE(tab text, key text)
 LANGUAGE sql
 IMMUTABLE
AS $function$
    VALUES ('service_requests', 'id'), ('steps_status', 'service_request_id'),
           ('fan_joins', 'parent_id'), ('event_takes', 'service_request_id')
$function$;
CREATE OR REPLACE FUNCTION public.clamp_v7_floor(at timestamp with time zone)
 RETURNS uuid
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT (lpad(to_hex(floor(extract(epoch FROM at) * 1000)::bigint), 12, '0')
            || '70008000000000000000')::uuid
$function$;
CREATE OR REPLACE FUNCTION public.concurrency_slot_state(status text, lease_until timestamp with time zone)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT CASE WHEN status = 'NEW' AND lease_until = 'infinity' THEN 1
                WHEN status IN ('NEW', 'IN_PROGRESS', 'PAUSED', 'RESUMED')
                     AND lease_until < 'infinity' THEN 2
                ELSE 0 END
$function$;
CREATE OR REPLACE FUNCTION public.concurrency_slots_follow()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    state int := CASE WHEN TG_OP = 'DELETE' THEN 0
                      ELSE concurrency_slot_state(NEW.status, NEW.lease_until) END;
BEGIN
    IF state = 0 THEN
        IF TG_OP <> 'INSERT' THEN
            DELETE FROM concurrency_slots WHERE id = OLD.id;
        END IF;
        RETURN NULL;
    END IF;
    -- A new request has no slot row yet; a changed one may (a retry's has none).
    IF TG_OP = 'UPDATE' THEN
        UPDATE concurrency_slots SET queued = state = 1, rank = -coalesce(NEW.priority, 5)
        WHERE id = NEW.id;
        IF FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    INSERT INTO concurrency_slots (id, workflow_name, concurrency_key, queued, rank)
    VALUES (NEW.id, NEW.workflow_name, NEW.concurrency_key, state = 1,
            -coalesce(NEW.priority, 5));
    RETURN NULL;
END
$function$;

-- triggers
CREATE TRIGGER concurrency_slots_delete AFTER DELETE ON public.service_requests FOR EACH ROW WHEN ((old.concurrency_key IS NOT NULL)) EXECUTE FUNCTION concurrency_slots_follow();
