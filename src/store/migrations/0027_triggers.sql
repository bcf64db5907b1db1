-- Triggers (beyond Clamp): what starts requests of a workflow from outside the API (a
-- webhook now). The definition is kept as given (`workflow::trigger` reads it); a secret
-- is kept as its `{{secret:NAME}}` reference only.
CREATE TABLE IF NOT EXISTS triggers (
    name        text PRIMARY KEY,
    definition  jsonb NOT NULL,
    paused      boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
