-- Schedules (beyond Clamp): a definition that starts a workflow by cron or interval, and
-- the first fire time not yet made (`next_fire_at`; NULL while paused, or when the
-- pattern fires no more). The runner of every instance takes due rows with
-- FOR UPDATE SKIP LOCKED; the partial index holds only schedules that can fire.
CREATE TABLE IF NOT EXISTS schedules (
    name         text PRIMARY KEY,
    definition   jsonb NOT NULL,
    paused       boolean NOT NULL DEFAULT false,
    next_fire_at timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS schedules_due ON schedules (next_fire_at) WHERE NOT paused;
-- One row per fire: the key (schedule, fire time) is what makes a fire happen once,
-- whichever instance makes it and however often it is tried. The service request a fire
-- started is inserted in the same statement as its row (no foreign key: retention may
-- delete the request, and the fire stays); `skipped` says why a fire started nothing.
CREATE TABLE IF NOT EXISTS schedule_fires (
    schedule           text NOT NULL REFERENCES schedules (name) ON DELETE CASCADE,
    fire_at            timestamptz NOT NULL,
    service_request_id uuid,
    skipped            text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, fire_at)
);
-- The schedule's latest run (the overlap check), past the skipped fires after it.
CREATE INDEX IF NOT EXISTS schedule_fires_runs
    ON schedule_fires (schedule, fire_at) WHERE service_request_id IS NOT NULL;
