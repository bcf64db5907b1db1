-- Request deadlines (beyond Clamp): a request whose workflow or create sets a deadline
-- keeps it here (NULL: none). Only unfinished requests with one are in the index, so the
-- look for passed deadlines reads those and nothing else; the column is written once,
-- at insert, and a request without a deadline only tests the predicate. The status in
-- the predicate is already in the claim index's, so updates stay as HOT as before.
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS deadline timestamptz;
CREATE INDEX IF NOT EXISTS service_requests_deadlines
    ON service_requests (deadline)
    WHERE deadline IS NOT NULL AND status IN ('NEW', 'IN_PROGRESS', 'PAUSED', 'RESUMED');
-- A new row's deadline, in milliseconds from its start (NULL: none), as the batch
-- insert's row type carries it.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = (SELECT typrelid FROM pg_type WHERE oid = 'new_request'::regtype)
                     AND attname = 'deadline_ms' AND NOT attisdropped) THEN
        ALTER TYPE new_request ADD ATTRIBUTE deadline_ms float8;
    END IF;
END $$;
