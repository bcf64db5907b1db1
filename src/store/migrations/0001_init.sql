-- JSON documents (payloads, headers, step requests and responses) are stored as text:
-- the server has validated every one of them before it is written, and having Postgres
-- parse them again into jsonb was the largest Postgres cost per service request
-- (see ARCHITECTURE.md). Cast to jsonb for ad-hoc queries.

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

-- One row per service request. Ids are UUIDv7, so the primary key grows at its end.
-- The row keeps the current status and the next step (and its request) so reads and
-- resumes never replay history.
CREATE TABLE IF NOT EXISTS service_requests (
    id              uuid PRIMARY KEY,
    workflow_name   text NOT NULL,
    status          text NOT NULL DEFAULT 'NEW',
    payload         text NOT NULL,
    headers         text NOT NULL DEFAULT '[]',
    -- The step to run next (0: none left, or not started while NEW).
    current_step_id integer NOT NULL DEFAULT 0,
    -- The request that step receives (NULL: the payload).
    step_request    text,
    -- Set while the onFailure steps of this failed step run.
    failed_step_id  integer,
    -- The executor holding the request, and until when. Unleased rows hold -infinity so
    -- the claim query is one index range scan (lease_until < now()).
    lease_owner     uuid,
    lease_until     timestamptz NOT NULL DEFAULT '-infinity',
    reason          text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
) WITH (fillfactor = 80);
-- fillfactor leaves room on each page so that the updates between steps (which touch
-- no indexed column) can be HOT updates, writing no index entries.
-- The sweeper's claim query reads only runnable rows whose lease is free or expired.
CREATE INDEX IF NOT EXISTS service_requests_claimable
    ON service_requests (lease_until)
    WHERE status IN ('NEW', 'IN_PROGRESS', 'RESUMED');
CREATE INDEX IF NOT EXISTS service_requests_by_workflow
    ON service_requests (workflow_name, id);

-- One row per step attempt: it holds both the start and the final status, so the API
-- lists a STARTED and a final entry per step from half the writes. An ASYNC step's row
-- says STARTED until its response arrives.
CREATE TABLE IF NOT EXISTS steps_status (
    id                 bigserial,
    service_request_id uuid NOT NULL,
    step_id            integer NOT NULL,
    step_name          text NOT NULL,
    status             text NOT NULL,
    request            text,
    response           text,
    started_at         timestamptz NOT NULL,
    finished_at        timestamptz,
    time_taken_ms      bigint,
    reason             text,
    -- One index serves every read (a request's attempts, oldest first) and keeps rows
    -- unique: a separate primary key on id alone would be a second index to maintain.
    PRIMARY KEY (service_request_id, id)
);
