-- A history that costs nothing to keep and nothing to drop (beyond Clamp): the tables
-- that hold a request's data are range-partitioned by the request's id, a UUIDv7 whose
-- first 48 bits are its creation millisecond, so a range of ids is a range of time. Every
-- partition set (one partition of each table, the same bounds) is created ahead by the
-- server (store::partitions), and retention drops whole sets. The tables:
-- service_requests by id, and beside it, by the request they belong to, steps_status,
-- fan_joins and event_takes. A request's statements touch the partition of its own time
-- only, whatever the history kept.
--
-- This migration adds the functions that create a set and turn today's tables into the
-- first partition of each, and turns them at once when they are empty (a new database).
-- A database with requests is turned online by the server (validate a bound, then swap:
-- see docs/upgrading.md), so creates go on during the upgrade.

-- fan_joins referenced service_requests: the two are dropped together by retention now,
-- and a foreign key into a partitioned table would tie every partition set to it.
ALTER TABLE fan_joins DROP CONSTRAINT IF EXISTS fan_joins_parent_id_fkey;

-- The tables partitioned by a request's id, and the column that holds it.
CREATE OR REPLACE FUNCTION clamp_partitioned_tables() RETURNS TABLE (tab text, key text)
LANGUAGE sql IMMUTABLE AS $$
    VALUES ('service_requests', 'id'), ('steps_status', 'service_request_id'),
           ('fan_joins', 'parent_id'), ('event_takes', 'service_request_id')
$$;

-- The smallest UUIDv7 of an instant: every id made at or after it sorts at or above it.
CREATE OR REPLACE FUNCTION clamp_v7_floor(at timestamptz) RETURNS uuid
LANGUAGE sql IMMUTABLE AS $$
    SELECT (lpad(to_hex(floor(extract(epoch FROM at) * 1000)::bigint), 12, '0')
            || '70008000000000000000')::uuid
$$;

-- The storage settings of a new partition of `tab`: room on every page for the update
-- after each step (service_requests), and autovacuum that keeps up with a partition
-- while it is the one taking the traffic (it runs on a small table, soon, and without the
-- cost limit's pauses), then leaves it alone.
CREATE OR REPLACE FUNCTION clamp_partition_options(tab text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE tab
        WHEN 'service_requests' THEN 'fillfactor = 50, autovacuum_vacuum_scale_factor = 0.02, '
            'autovacuum_vacuum_threshold = 20000, autovacuum_vacuum_cost_delay = 0, '
            'autovacuum_vacuum_insert_scale_factor = 0.2, autovacuum_analyze_scale_factor = 0.05'
        ELSE 'autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_threshold = 20000, '
            'autovacuum_vacuum_cost_delay = 0, autovacuum_vacuum_insert_scale_factor = 0.2'
    END
$$;

-- Creates the partition set [lo, hi) named by `suffix` (`service_requests_p<suffix>`, …)
-- and attaches it. Each partition is made as a table of its own and then attached, which
-- takes only a SHARE UPDATE EXCLUSIVE lock on the parent (creates and steps go on;
-- `CREATE TABLE … PARTITION OF` would take an ACCESS EXCLUSIVE one); the parent's indexes
-- are built on the empty table as it is attached. A set that exists is left as it is.
CREATE OR REPLACE FUNCTION clamp_add_partitions(lo uuid, hi uuid, suffix text) RETURNS void
LANGUAGE plpgsql AS $$
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
$$;

-- Turns each of today's tables into the first partition of a partitioned table of the
-- same name, holding every id below `bound`: the table is renamed `<name>_p0` (its
-- indexes and constraints `<name>_p0…` too), the partitioned table takes the name, the
-- columns, the defaults and the indexes, and the old table is attached FROM (MINVALUE)
-- TO (bound) (no scan when a validated CHECK says so already; else a scan, which on a new
-- database finds nothing). The indexes of the old table become the partitions of the new
-- ones (no index is built again). One transaction: readers and writers wait for it,
-- briefly, and then see the new layout.
CREATE OR REPLACE FUNCTION clamp_partition_existing(bound uuid) RETURNS void
LANGUAGE plpgsql AS $$
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
$$;

-- A new database (no request yet): partitioned now. The server creates the partition sets
-- from here on; a database with requests is turned by the server, online.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM service_requests) AND NOT EXISTS (SELECT 1 FROM steps_status) THEN
        PERFORM clamp_partition_existing(clamp_v7_floor(now()));
    END IF;
END
$$;
