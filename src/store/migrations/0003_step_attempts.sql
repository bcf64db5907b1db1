-- Step retries. A step whose call failed transiently is tried again later: the request row
-- keeps how many attempts its current step has had and why the last one failed, and the
-- wait is the lease itself (`lease_until` = when the next attempt is due, no owner), so
-- the sweeper of any instance starts the attempt when it is due and a restart neither
-- loses nor repeats it. Adding columns with constant defaults rewrites nothing.
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS step_attempts integer NOT NULL DEFAULT 0;
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS last_error text;
-- Attempts the step took, its final one included.
ALTER TABLE steps_status ADD COLUMN IF NOT EXISTS attempts integer NOT NULL DEFAULT 1;

-- Step responses consumed from Kafka that can never apply (malformed, no such request,
-- not the step it waits on, a workflow that no longer validates): kept here, with why,
-- so the consumer can move on without losing them. (AMQP parks them on `<queue>.dead`.)
CREATE TABLE IF NOT EXISTS dead_letters (
    id          bigserial PRIMARY KEY,
    source      text NOT NULL,
    topic       text NOT NULL,
    partition   int,
    record_offset bigint,
    body        bytea NOT NULL,
    reason      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
