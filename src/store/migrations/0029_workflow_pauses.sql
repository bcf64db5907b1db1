-- Pausing a workflow (beyond Clamp): while a workflow has a row here, its requests are
-- created and stored but none runs a step. An executor about to start a step of one
-- parks it instead: its lease goes to the nil owner until a far time, so no sweeper
-- claims it and, under a concurrency limit, it keeps the slot it holds (a slot is any
-- lease but 'infinity'). A resume deletes the row and makes the workflow's parked
-- requests claimable at once, in creation order. Only parked rows have an entry in the
-- partial index, which a resume and the parked gauge read; the updates between steps
-- change no column of it, so they stay HOT.
CREATE TABLE IF NOT EXISTS workflow_pauses (
    workflow_name text PRIMARY KEY,
    paused_at     timestamptz NOT NULL DEFAULT now(),
    paused_by     text NOT NULL
);
CREATE INDEX IF NOT EXISTS service_requests_parked
    ON service_requests (workflow_name, id)
    WHERE lease_owner = '00000000-0000-0000-0000-000000000000'::uuid;
