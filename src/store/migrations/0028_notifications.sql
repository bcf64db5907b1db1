-- Notifications (beyond Clamp): a workflow's `notify` says which final statuses of its
-- requests are told where. A request keeps the statuses its workflow tells of in
-- `notify` (bits: 1 COMPLETED, 2 FAILED, 4 CANCELLED; NULL for none), written once at
-- its create and never updated (so the updates after each step stay HOT). The statements
-- that finish requests (the step writer's, for a batch that holds a request that
-- notifies; a cancel) write the row of `notifications` in the same statement: a
-- transition that rolls back writes none, and one that commits cannot lose it. (A row
-- trigger would cover every path by itself, but costs every update: docs/decisions.md.)
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS notify smallint;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = (SELECT typrelid FROM pg_type WHERE oid = 'new_request'::regtype)
                     AND attname = 'notify' AND NOT attisdropped) THEN
        ALTER TYPE new_request ADD ATTRIBUTE notify smallint;
    END IF;
END $$;
CREATE TABLE IF NOT EXISTS notifications (
    id                 bigserial PRIMARY KEY,
    service_request_id uuid NOT NULL,
    workflow_name      text NOT NULL,
    workflow_version   integer NOT NULL,
    status             text NOT NULL,
    reason             text,
    finished_at        timestamptz NOT NULL DEFAULT now(),
    -- pending, delivered or failed (its attempts used up).
    state              text NOT NULL DEFAULT 'pending',
    attempts           integer NOT NULL DEFAULT 0,
    next_at            timestamptz NOT NULL DEFAULT now(),
    last_error         text,
    delivered_at       timestamptz
);
CREATE INDEX IF NOT EXISTS notifications_due ON notifications (next_at, id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS notifications_of_request ON notifications (service_request_id, id);
