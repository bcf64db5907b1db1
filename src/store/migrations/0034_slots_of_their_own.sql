-- A key's slots in a table of their own (docs/decisions.md, "A key's slots are a table
-- kept by the rows"). Counting a key's slot holders and probing its queue read
-- `service_requests_keyed` on every partition set that can hold its rows (every set
-- older than a minute ahead: a request may hold its slot for days), so a limited create
-- paid nine index scans and a look after each finish grew with the sets kept; and every
-- statement that wrote a set paid for opening that index, limited or not.
--
-- `concurrency_slots` holds one row per request with a concurrency key that waits for
-- or holds a slot: `queued` when it waits (NEW and held at `lease_until` Infinity, as
-- before), else it holds one (`concurrency_slot_state` below); `rank` is its queue
-- order's first part (`slots::queue_order!`). The rows are kept by triggers on
-- `service_requests`, in the transaction that changes the request, by whatever
-- statement changes it (a finish, a cancel, a retry, a deadline, an admission), so the
-- table says exactly what the requests' rows say, through crashes: nothing but the
-- request's own change writes its slot row, so a finish frees its slot once and a crash
-- leaks none (the limited creates' own insert writes its rows itself, below). A request
-- without a key pays only the triggers' `WHEN` tests (its key is NULL), where it paid
-- for an index before.
CREATE TABLE IF NOT EXISTS concurrency_slots (
    id uuid PRIMARY KEY,
    workflow_name text NOT NULL,
    concurrency_key text NOT NULL,
    queued boolean NOT NULL,
    rank int2 NOT NULL
);
-- A key's queue in its order: higher priorities first, then creation (ids are UUIDv7).
CREATE INDEX IF NOT EXISTS concurrency_slots_queue
    ON concurrency_slots (workflow_name, concurrency_key, rank, id) WHERE queued;
-- A key's slot holders, counted index-only.
CREATE INDEX IF NOT EXISTS concurrency_slots_held
    ON concurrency_slots (workflow_name, concurrency_key) WHERE NOT queued;

-- What a request's slot row says (as migration 22's predicates did): 1 waiting for a
-- slot (NEW and held), 2 holding one (unfinished and not held: a pause or a sleep holds
-- it too), 0 neither (finished; or held at Infinity past NEW, as a fan-out holds a
-- child beyond its concurrency).
CREATE OR REPLACE FUNCTION concurrency_slot_state(status text, lease_until timestamptz)
RETURNS int LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN status = 'NEW' AND lease_until = 'infinity' THEN 1
                WHEN status IN ('NEW', 'IN_PROGRESS', 'PAUSED', 'RESUMED')
                     AND lease_until < 'infinity' THEN 2
                ELSE 0 END
$$;

-- A request's slot row after its change: there while it waits for or holds a slot,
-- gone otherwise.
CREATE OR REPLACE FUNCTION concurrency_slots_follow() RETURNS trigger
LANGUAGE plpgsql AS $$
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
$$;

-- The limited creates' own insert (`slots::INSERT`) writes its slot rows itself, in one
-- statement, and says so for its transaction (`SET LOCAL clamp.slot_rows = 'written'`):
-- a trigger's call per row was a quarter of that insert's time. Every other insert of a
-- request with a key (a schedule's fire, a rerun) leaves it to the trigger.
DROP TRIGGER IF EXISTS concurrency_slots_insert ON service_requests;
CREATE TRIGGER concurrency_slots_insert AFTER INSERT ON service_requests
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL
                       AND current_setting('clamp.slot_rows', true) IS DISTINCT FROM 'written')
    EXECUTE FUNCTION concurrency_slots_follow();
-- Only a change of what the slot row says (a claim, a lease's renewal or a step leave
-- it alone). The key is written once, at the insert. `concurrency_slot_state` is
-- written out here, not called: every statement that updates a partition prepares
-- this condition once, and a call would be inlined by parsing the function's text each
-- time.
DROP TRIGGER IF EXISTS concurrency_slots_update ON service_requests;
CREATE TRIGGER concurrency_slots_update AFTER UPDATE ON service_requests
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL AND (
        (OLD.status = 'NEW' AND OLD.lease_until = 'infinity')
            <> (NEW.status = 'NEW' AND NEW.lease_until = 'infinity')
        OR (OLD.status IN ('NEW', 'IN_PROGRESS', 'PAUSED', 'RESUMED')
            AND OLD.lease_until < 'infinity')
            <> (NEW.status IN ('NEW', 'IN_PROGRESS', 'PAUSED', 'RESUMED')
                AND NEW.lease_until < 'infinity')
        OR OLD.priority IS DISTINCT FROM NEW.priority))
    EXECUTE FUNCTION concurrency_slots_follow();
DROP TRIGGER IF EXISTS concurrency_slots_delete ON service_requests;
CREATE TRIGGER concurrency_slots_delete AFTER DELETE ON service_requests
    FOR EACH ROW WHEN (OLD.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION concurrency_slots_follow();

-- The requests already there (the triggers' lock on service_requests, held until this
-- migration commits, keeps any change from slipping between the two).
INSERT INTO concurrency_slots (id, workflow_name, concurrency_key, queued, rank)
SELECT id, workflow_name, concurrency_key, concurrency_slot_state(status, lease_until) = 1,
       -coalesce(priority, 5)
FROM service_requests
WHERE concurrency_key IS NOT NULL AND concurrency_slot_state(status, lease_until) > 0
ON CONFLICT (id) DO NOTHING;

DROP INDEX IF EXISTS service_requests_keyed;

-- A rate's starts (migration 22 counted them from `admitted_at` in a partial index of
-- every partition): one row per admission under a rate, written by the admission's own
-- statement, counted by key within the window, and deleted once older than any window
-- (a minute) by the admitters' passes. The requests' index goes, and with it one more
-- index every statement that writes a set opened.
CREATE TABLE IF NOT EXISTS concurrency_starts (
    workflow_name text NOT NULL,
    concurrency_key text NOT NULL,
    admitted_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS concurrency_starts_by_key
    ON concurrency_starts (workflow_name, concurrency_key, admitted_at);
INSERT INTO concurrency_starts (workflow_name, concurrency_key, admitted_at)
SELECT workflow_name, concurrency_key, admitted_at FROM service_requests
WHERE concurrency_key IS NOT NULL AND admitted_at > now() - interval '2 minutes';
DROP INDEX IF EXISTS service_requests_admitted;
