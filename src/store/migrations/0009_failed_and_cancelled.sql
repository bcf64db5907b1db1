-- The requests an operator looks for and retries: FAILED and CANCELLED, newest first, all
-- or by workflow. Partial indexes: a request gets an entry only when it fails or is
-- cancelled (an update that changes status, so never HOT anyway), none at its create and
-- none when it completes. Without them a search for FAILED walked the whole table's
-- primary key, skipping every request that had not failed.
CREATE INDEX IF NOT EXISTS service_requests_failed_or_cancelled
    ON service_requests (id) WHERE status IN ('FAILED', 'CANCELLED');
CREATE INDEX IF NOT EXISTS service_requests_failed_or_cancelled_by_workflow
    ON service_requests (workflow_name, id) WHERE status IN ('FAILED', 'CANCELLED');
