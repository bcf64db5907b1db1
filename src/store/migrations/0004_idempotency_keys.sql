-- Idempotent creates: `Idempotency-Key` of POST /serviceRequest/{workflow}, per workflow.
-- A key names the service request it created and a digest of its stored payload (a
-- repeat with another payload is refused). Its own table, so the unique index decides
-- between concurrent duplicates on any instance, and the schema stays Citus-ready
-- (distributed by key). Kept for the idempotency window, independent of row retention.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    workflow_name      text NOT NULL,
    key                text NOT NULL,
    service_request_id uuid NOT NULL,
    payload_md5        text NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_name, key)
);
-- For deleting keys past the window.
CREATE INDEX IF NOT EXISTS idempotency_keys_created ON idempotency_keys (created_at);
