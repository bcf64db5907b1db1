-- EVENT steps: a request paused at an EVENT step names the event and key it waits for,
-- found by delivery through this index (only such paused rows are in it), and the step
-- it goes on to (so a delivery resumes it in one statement, without its workflow).
-- Nullable with no default: existing rows are not rewritten.
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS wait_event text;
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS wait_key text;
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS wait_next integer;
CREATE INDEX IF NOT EXISTS service_requests_event_waits
    ON service_requests (wait_event, wait_key) WHERE status = 'PAUSED' AND wait_event IS NOT NULL;
-- Delivered events, by their id (a redelivery counts once), kept until keep_until for
-- requests that reach their EVENT step later; deleted a day after that.
CREATE TABLE IF NOT EXISTS events (
    event text NOT NULL,
    id text NOT NULL,
    key text NOT NULL,
    payload text NOT NULL,
    traceparent text,
    received_at timestamptz NOT NULL DEFAULT now(),
    keep_until timestamptz NOT NULL,
    PRIMARY KEY (event, id)
);
CREATE INDEX IF NOT EXISTS events_by_key ON events (event, key, received_at);
CREATE INDEX IF NOT EXISTS events_keep_until ON events (keep_until);
