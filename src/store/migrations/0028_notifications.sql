-- Notifications (beyond Clamp): a workflow's `notify` says which final statuses of its
-- requests are told where. A request keeps the statuses its workflow tells of in
-- `notify` (bits: 1 COMPLETED, 2 FAILED, 4 CANCELLED; NULL for none), written once at
-- its create and never updated (so the updates after each step stay HOT). When an update
-- gives a request such a status, the trigger below writes a row to `notifications` in the
-- same transaction: a transition that rolls back writes none, and one that commits
-- cannot lose it. Every path that finishes a request (a step's transition, a cancel, a
-- deadline, a child's end) is covered by the one trigger; for a request without
-- `notify` its WHEN is false at its first test, and no function runs.
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
CREATE OR REPLACE FUNCTION clamp_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO notifications (service_request_id, workflow_name, workflow_version, status, reason)
    VALUES (NEW.id, NEW.workflow_name, coalesce(NEW.workflow_version, 1), NEW.status, NEW.reason);
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS service_requests_notify ON service_requests;
CREATE TRIGGER service_requests_notify AFTER UPDATE OF status ON service_requests
    FOR EACH ROW
    WHEN (NEW.notify IS NOT NULL AND NEW.status IS DISTINCT FROM OLD.status
          AND ((NEW.status = 'COMPLETED' AND NEW.notify & 1 <> 0)
               OR (NEW.status = 'FAILED' AND NEW.notify & 2 <> 0)
               OR (NEW.status = 'CANCELLED' AND NEW.notify & 4 <> 0)))
    EXECUTE FUNCTION clamp_notify();
