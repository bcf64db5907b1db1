-- Plain creates arrive as intake batches: one row per flush, holding the batch's requests
-- as parallel arrays, instead of one service_requests row (and its three index entries)
-- per request. A request id is its batch's id with the slot number in its low 12 bits, so
-- a read finds its batch by primary key. A request gets its own service_requests row at
-- its first transition (the executor holding the batch's lease inserts it with that
-- step's outcome), when it is cancelled, or when a sweeper takes over a batch whose lease
-- ran out; the batch row is deleted once every request in it has its own row.
CREATE TABLE IF NOT EXISTS intake_batches (
    id          uuid PRIMARY KEY,
    -- The executor that runs the batch's requests, as for service_requests.
    lease_owner uuid,
    lease_until timestamptz NOT NULL DEFAULT '-infinity',
    ids         uuid[] NOT NULL,
    workflows   text[] NOT NULL,
    payloads    text[] NOT NULL,
    headers     text[] NOT NULL,
    created     timestamptz[] NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS intake_batches_claimable ON intake_batches (lease_until);

-- Each request of each intake batch, shaped like a service_requests row that nothing has
-- happened to yet (a request that has its own row already appears in both: readers take
-- the service_requests row).
CREATE OR REPLACE VIEW intake_requests AS
SELECT u.id, u.workflow_name, 'NEW'::text AS status, u.payload, u.headers,
       0 AS current_step_id, NULL::text AS step_request, NULL::integer AS failed_step_id,
       b.lease_owner, b.lease_until, NULL::text AS reason, u.created_at,
       u.created_at AS updated_at, NULL::timestamptz AS finished_at, 0 AS step_attempts,
       NULL::text AS last_error, b.id AS batch_id
FROM intake_batches b
CROSS JOIN LATERAL unnest(b.ids, b.workflows, b.payloads, b.headers, b.created)
    AS u(id, workflow_name, payload, headers, created_at);

-- Every service request wherever it is stored, for ad-hoc queries: the rows, and the
-- requests of intake batches that have no row yet.
CREATE OR REPLACE VIEW all_service_requests AS
SELECT id, workflow_name, status, payload, headers, current_step_id, step_request,
       failed_step_id, lease_owner, lease_until, reason, created_at, updated_at, finished_at,
       step_attempts, last_error
FROM service_requests
UNION ALL
SELECT id, workflow_name, status, payload, headers, current_step_id, step_request,
       failed_step_id, lease_owner, lease_until, reason, created_at, updated_at, finished_at,
       step_attempts, last_error
FROM intake_requests i
WHERE NOT EXISTS (SELECT 1 FROM service_requests s WHERE s.id = i.id);
