-- Labels (beyond Clamp): `key:value` texts a create may carry (`?label=`, `Clamp-Labels`),
-- kept sorted and unique, copied to the request's children and reruns, and found by
-- search (`?label=`, several ANDed). A request without labels keeps NULL: no index entry
-- (the index is partial), no row elsewhere. Written once at insert and never updated, so
-- the updates after each step stay HOT.
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS labels text[];
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = (SELECT typrelid FROM pg_type WHERE oid = 'new_request'::regtype)
                     AND attname = 'labels' AND NOT attisdropped) THEN
        ALTER TYPE new_request ADD ATTRIBUTE labels text[];
    END IF;
END $$;
CREATE INDEX IF NOT EXISTS service_requests_labels
    ON service_requests USING gin (labels) WHERE labels IS NOT NULL;
