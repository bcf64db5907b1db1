-- One row per service request, from its create to its deletion. Version 5 kept plain
-- creates in `intake_batches` (one row per flush, the requests as parallel arrays) until
-- each request's first transition; every request such a batch still holds becomes a row
-- here, as the batch holds it (id, workflow, payload, headers, creation time; NEW, at no
-- step yet) with no lease, so the first sweeper of any instance claims and runs it once.
-- A request that has its own row already (it ran a step, or was cancelled) keeps it.
-- Then the table and its two views go. Instances of version 5 must be stopped before
-- this runs: their statements name the table.
DO $$
BEGIN
    IF to_regclass('intake_batches') IS NOT NULL THEN
        INSERT INTO service_requests (id, workflow_name, status, payload, headers,
                                      lease_owner, lease_until, created_at, updated_at)
        SELECT u.id, u.workflow_name, 'NEW', u.payload, u.headers,
               NULL, '-infinity', u.created_at, u.created_at
        FROM intake_batches b
        CROSS JOIN LATERAL unnest(b.ids, b.workflows, b.payloads, b.headers, b.created)
            AS u(id, workflow_name, payload, headers, created_at)
        ON CONFLICT (id) DO NOTHING;
    END IF;
END $$;
DROP VIEW IF EXISTS all_service_requests;
DROP VIEW IF EXISTS intake_requests;
DROP TABLE IF EXISTS intake_batches;
