-- Workflows are never deleted, so the server caches them in memory.
CREATE TABLE IF NOT EXISTS workflows (
    id          uuid PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    description text NOT NULL DEFAULT '',
    enabled     boolean NOT NULL DEFAULT true,
    definition  jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS workflows_created_at ON workflows (created_at);

-- One row per service request. Ids are UUIDv7, so the primary key grows at its end.
-- The row keeps the current status and step so reads and resumes never replay history.
CREATE TABLE IF NOT EXISTS service_requests (
    id              uuid PRIMARY KEY,
    workflow_name   text NOT NULL,
    status          text NOT NULL DEFAULT 'NEW',
    payload         jsonb NOT NULL,
    headers         jsonb,
    current_step_id integer NOT NULL DEFAULT 0,
    -- The request the current (or next) step receives; set when a step finishes or a response arrives.
    step_request    jsonb,
    lease_owner     uuid,
    lease_until     timestamptz,
    reason          text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);
-- The sweeper's claim query reads only unfinished, runnable rows.
CREATE INDEX IF NOT EXISTS service_requests_claimable
    ON service_requests (lease_until NULLS FIRST)
    WHERE status IN ('NEW', 'IN_PROGRESS', 'RESUMED');
CREATE INDEX IF NOT EXISTS service_requests_by_workflow
    ON service_requests (workflow_name, id);

-- One row per step attempt: it holds both the STARTED time and the final status, so the
-- API lists two entries per step from half the writes.
CREATE TABLE IF NOT EXISTS steps_status (
    id                 bigserial PRIMARY KEY,
    service_request_id uuid NOT NULL,
    workflow_name      text NOT NULL,
    step_id            integer NOT NULL,
    step_name          text NOT NULL,
    status             text NOT NULL,
    request            jsonb,
    response           jsonb,
    started_at         timestamptz NOT NULL,
    finished_at        timestamptz,
    time_taken_ms      bigint,
    reason             text
);
CREATE INDEX IF NOT EXISTS steps_status_by_request ON steps_status (service_request_id, id);
