-- How many times a FAILED or CANCELLED request was retried (POST /serviceRequest/{id}/retry):
-- it continues as the same request from the step that failed, and its step records keep
-- every earlier attempt. A constant default rewrites nothing.
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS retries integer NOT NULL DEFAULT 0;
