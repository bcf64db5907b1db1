-- Delayed service requests (`?startAt=` / `?delayMs=` on a create): the time a request was
-- asked to start at. Such a row is stored unleased with `lease_until` at that time, so the
-- claim (`lease_until < now()`) takes it then and not before: the column only answers
-- reads. Nullable without a default: rewrites nothing, costs other rows nothing.
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS start_at timestamptz;
