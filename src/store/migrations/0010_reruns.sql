-- Reruns (POST /serviceRequest/{id}/rerun): a new request of the same workflow that names
-- the request it reruns. A nullable column without a default rewrites nothing; the index
-- is partial, so a plain create (rerun_of NULL) adds no entry to it, and listing the
-- reruns of a request (search's `rerunOf`) reads only its own.
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS rerun_of uuid;
CREATE INDEX IF NOT EXISTS service_requests_reruns
    ON service_requests (rerun_of, id) WHERE rerun_of IS NOT NULL;
