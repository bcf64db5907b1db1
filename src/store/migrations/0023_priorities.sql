-- Priorities (beyond Clamp): a request created with `?priority=` keeps it here (1 to 9;
-- NULL is the default, 5). It is written once, at insert, and copied to the request's
-- children and reruns.
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS priority smallint;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = (SELECT typrelid FROM pg_type WHERE oid = 'new_request'::regtype)
                     AND attname = 'priority' AND NOT attisdropped) THEN
        ALTER TYPE new_request ADD ATTRIBUTE priority smallint;
    END IF;
END $$;
-- The claim order, replacing the claim index on `lease_until` alone. A row runnable
-- without a clock (`lease_until = '-infinity'`: a fresh create, a resumed or released
-- request) ranks by its creation time moved back by 10^10 s per priority step, so every
-- such row of a higher priority ranks before every one of a lower, and creation order
-- holds within one priority; a row whose lease or timer runs out at a time ranks at that
-- time, after all of them (as before); a held row ranks last. A rank below now is
-- runnable, so the claim is one range of this index in order. The expression is
-- `sql::claim_rank!` spelled out: the claim must read it identically to use the index.
-- Seconds as float8 keep microseconds for times and 8 to 15 µs steps within a band (the
-- bands stay apart while creation times are below 10^10 s, until the year 2286).
-- `lease_until` is the second column so that the timers' count stays an index-only scan.
-- `created_at` and `priority` never change, so updates stay as HOT as before.
DROP INDEX IF EXISTS service_requests_claimable;
CREATE INDEX IF NOT EXISTS service_requests_claim_order
    ON service_requests ((CASE
        WHEN lease_until = '-infinity'::timestamptz
            THEN date_part('epoch', created_at - '1970-01-01 00:00:00+00'::timestamptz)
                 - coalesce(priority, 5)::float8 * 10000000000::float8
        WHEN lease_until = 'infinity'::timestamptz THEN 'Infinity'::float8
        ELSE date_part('epoch', lease_until - '1970-01-01 00:00:00+00'::timestamptz)
    END), lease_until)
    WHERE status IN ('NEW', 'IN_PROGRESS', 'RESUMED');
-- A key's queue (migration 22) is in the same order: higher priorities first, then
-- creation order (`slots::queue_order!`).
DROP INDEX IF EXISTS service_requests_queued;
CREATE INDEX IF NOT EXISTS service_requests_queued
    ON service_requests (workflow_name, concurrency_key, (-coalesce(priority, 5)), id)
    WHERE concurrency_key IS NOT NULL AND lease_until = 'infinity' AND status = 'NEW';
