-- A request's slot row written by the statement that changes the request (docs/decisions.md,
-- "Statements keep their slot rows"). Any AFTER UPDATE row trigger on `service_requests`
-- made Postgres fetch the old version of every updated row before it tested the
-- trigger's condition, whatever the condition said: the claim, each step write and every
-- finish of a request without a key paid for it (1.2 µs a finishing row of a plain
-- request's 16-row update, against 157 µs without). The insert trigger tested every
-- inserted row's key. Both go: the statements that change what a keyed request's slot row
-- says write it themselves, in the same statement (the limited creates' insert, an
-- admission, a finish by a step write, a cancel, a compensating cancel, a retry, a
-- fan-out's restart, a rerun's insert: `slots::follow!` and `transitions`' `freed!`);
-- every other statement leaves a keyed request's slot state as it was (a claim, a renewal,
-- a release, a pause, a sleep, an answer, a deadline's resumption keep it holding its
-- slot). The delete trigger stays: a deleted row's slot row goes with it, and no insert
-- or update pays for it.
DROP TRIGGER IF EXISTS concurrency_slots_insert ON service_requests;
DROP TRIGGER IF EXISTS concurrency_slots_update ON service_requests;

-- What the rows say now, written again (an instance of an earlier version that ran
-- until this migration relied on the triggers; instances of an earlier version must be
-- stopped before this one starts, docs/upgrading.md).
DELETE FROM concurrency_slots;
INSERT INTO concurrency_slots (id, workflow_name, concurrency_key, queued, rank)
SELECT id, workflow_name, concurrency_key, concurrency_slot_state(status, lease_until) = 1,
       -coalesce(priority, 5)
FROM service_requests
WHERE concurrency_key IS NOT NULL AND concurrency_slot_state(status, lease_until) > 0;
