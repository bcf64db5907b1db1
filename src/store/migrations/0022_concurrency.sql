-- Concurrency limits by key (beyond Clamp): a request of a workflow that declares one
-- keeps its key here (NULL for every other request, which then only tests the two
-- predicates below). The key is written once, at insert. A request waiting for a slot is
-- NEW and held (`lease_until = 'infinity'`, which no claim takes) until it is admitted;
-- every other unfinished request of the key holds a slot. Both indexes are partial on
-- columns the claim index already reads (status, lease_until), so updates stay as HOT as
-- before.
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS concurrency_key text;
-- The requests waiting per key, in creation order (ids are UUIDv7).
CREATE INDEX IF NOT EXISTS service_requests_queued
    ON service_requests (workflow_name, concurrency_key, id)
    WHERE concurrency_key IS NOT NULL AND lease_until = 'infinity' AND status = 'NEW';
-- The requests holding a slot per key: started and not finished.
CREATE INDEX IF NOT EXISTS service_requests_slots
    ON service_requests (workflow_name, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND lease_until <> 'infinity'
      AND status IN ('NEW', 'IN_PROGRESS', 'PAUSED', 'RESUMED');
-- Rate limits by key: when a request was admitted (a start, as a rate counts them); the
-- starts of a key within the last window are a range of this index.
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS admitted_at timestamptz;
CREATE INDEX IF NOT EXISTS service_requests_admitted
    ON service_requests (workflow_name, concurrency_key, admitted_at)
    WHERE concurrency_key IS NOT NULL AND admitted_at IS NOT NULL;
