-- One index orders every row that waits for something, so a request that waits for
-- nothing pays for fewer indexes: each index of a partition costs every statement that
-- writes it (opening, locking and checking it) whether or not its rows match, about
-- 1.5 % of the two-step request's rate per index on the README's Postgres
-- (docs/decisions.md, "Fewer indexes, not emptier ones"). The claim order (migration 23)
-- takes in the two partial indexes whose rows it can rank apart:
--   * paused with an answer's or an event's deadline (`service_requests_answer_due`,
--     migration 18): ranked 10^12 s on, at that deadline;
--   * parked, their workflow paused (`service_requests_parked`, migration 29): ranked
--     2 * 10^12 s on, by creation time;
-- and a row due at a time (a WAIT's end, a back-off, a delayed start, a lease that ran
-- out) is ranked by its priority first, in bands of 10^10 s (priority 9 lowest), then
-- by that time, so a due priority-9 request is claimed before every due priority-5 one
-- (the claim reads the nine bands in order). Fresh rows (below 0) and held rows
-- (Infinity) rank as before. Every band is told apart by its rank alone, so each look
-- is one range of this index (`sql::claim_rank!`, which spells the expression: the
-- planner matches it only when spelled identically). `lease_until` is included, not a
-- second key column: the timers' count reads it index-only as before, and no look for
-- `lease_until = 'infinity'` (a key's queue) can take this index for a range of it (as
-- a second key column it was one, and a planner without statistics chose it over the
-- keyed index below: a scan of the whole index per look).
DROP INDEX IF EXISTS service_requests_claim_order;
DROP INDEX IF EXISTS service_requests_answer_due;
DROP INDEX IF EXISTS service_requests_parked;
CREATE INDEX IF NOT EXISTS service_requests_claim_order
    ON service_requests ((CASE
        WHEN lease_owner = '00000000-0000-0000-0000-000000000000'::uuid
            THEN 2000000000000::float8
                 + date_part('epoch', created_at - '1970-01-01 00:00:00+00'::timestamptz)
        WHEN status = 'PAUSED'
            THEN CASE WHEN lease_until = 'infinity'::timestamptz
                        OR lease_until = '-infinity'::timestamptz THEN 'Infinity'::float8
                      ELSE 1000000000000::float8
                           + date_part('epoch', lease_until - '1970-01-01 00:00:00+00'::timestamptz)
                 END
        WHEN lease_until = '-infinity'::timestamptz
            THEN date_part('epoch', created_at - '1970-01-01 00:00:00+00'::timestamptz)
                 - coalesce(priority, 5)::float8 * 10000000000::float8
        WHEN lease_until = 'infinity'::timestamptz THEN 'Infinity'::float8
        ELSE date_part('epoch', lease_until - '1970-01-01 00:00:00+00'::timestamptz)
             + (9 - coalesce(priority, 5))::float8 * 10000000000::float8
    END)) INCLUDE (lease_until)
    WHERE status IN ('NEW', 'IN_PROGRESS', 'RESUMED')
       OR (status = 'PAUSED' AND lease_until > '-infinity'::timestamptz)
       OR lease_owner = '00000000-0000-0000-0000-000000000000'::uuid;
-- A key's requests (migration 22): one index where there were two, its third column
-- `lease_until`, which tells the held ones (waiting for a slot at Infinity: the queue,
-- in priority then creation order) from the ones holding a slot (below it: counted
-- index-only), so that `slots::holds_slot!` and `slots::queued!` are each one range of
-- it.
DROP INDEX IF EXISTS service_requests_queued;
DROP INDEX IF EXISTS service_requests_slots;
CREATE INDEX IF NOT EXISTS service_requests_keyed
    ON service_requests (workflow_name, concurrency_key, lease_until, (-coalesce(priority, 5)), id)
    WHERE concurrency_key IS NOT NULL AND status IN ('NEW', 'IN_PROGRESS', 'PAUSED', 'RESUMED');
