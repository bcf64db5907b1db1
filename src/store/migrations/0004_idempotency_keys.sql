-- Idempotent creates: `Idempotency-Key` of POST /serviceRequest/{workflow}, per workflow.
-- A key is kept as a 128-bit digest of workflow and key (the primary key: small, compared
-- as bytes) naming the service request it created; a repeat's payload is compared with
-- that request's stored payload. Its own table, so the unique index decides between
-- concurrent duplicates on any instance, and the schema stays Citus-ready (distributed
-- by the digest). Kept for the idempotency window, independent of row retention.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key_hash           uuid PRIMARY KEY,
    service_request_id uuid NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now()
);
-- For deleting keys past the window. Keys arrive in time order, so a BRIN index finds
-- the old ones for almost nothing per insert.
CREATE INDEX IF NOT EXISTS idempotency_keys_created ON idempotency_keys USING brin (created_at);
