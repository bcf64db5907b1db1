-- The audit trail (beyond Clamp): every change an operator makes (a workflow defined or
-- replaced, a schedule changed, a retry, a bulk retry, a rerun, a cancel, a console
-- sign-in), with the token's name (never the token), when, what it was done to, and how
-- it went. Read newest first, by id.
CREATE TABLE IF NOT EXISTS audit_log (
    id bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    actor text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,
    outcome text NOT NULL
);
