-- Console sessions (beyond Clamp): a random id per sign-in, kept here so every instance
-- knows it. Only the id's SHA-256 is stored (reading this table signs no one in), with
-- the digest of the token it was signed in with (a session ends when its token leaves the
-- tokens file) and the times its idle and absolute expiry count from.
CREATE TABLE IF NOT EXISTS console_sessions (
    id_hash bytea PRIMARY KEY,
    token_digest bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    seen_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS console_sessions_seen ON console_sessions (seen_at);
-- The events each request took at its EVENT steps (beyond Clamp): an event resumes a
-- request at most once, so a later EVENT step of that request on the same event and key
-- does not take it again from the kept window. Written by the statement that resumes the
-- request (a delivery) or with the kept event it takes; keyed by the request, like its
-- step records.
CREATE TABLE IF NOT EXISTS event_takes (
    service_request_id uuid NOT NULL,
    event text NOT NULL,
    event_id text NOT NULL,
    step_id integer NOT NULL,
    PRIMARY KEY (service_request_id, event, event_id)
);
