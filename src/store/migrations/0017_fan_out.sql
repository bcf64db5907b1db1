-- Fan-out (PARALLEL and MAP steps): each branch or item is a child service request of
-- the step (parent_id, parent_step_id, as a WORKFLOW step's child), numbered by its
-- branch or item index, which orders the joined answer and names it. Nullable with no
-- default: existing rows are not rewritten, and a request outside a fan-out keeps NULL.
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS fan_index integer;
-- A MAP's held items (beyond its concurrency, never claimed) in index order, so the next
-- one is the first entry: only held rows are in it, and a row leaves it when released.
CREATE INDEX IF NOT EXISTS service_requests_fan_held
    ON service_requests (parent_id, parent_step_id, fan_index) WHERE lease_until = 'infinity';
-- One row per fan-out step in flight: how many of its children there are, have finished
-- and have failed, and whether the joined answer
-- reached the parent (`done`). A child's finish is counted once, in the transaction
-- that marks it told, so the counts are exact whatever instance or retry counts it.
CREATE TABLE IF NOT EXISTS fan_joins (
    parent_id uuid NOT NULL REFERENCES service_requests (id) ON DELETE CASCADE,
    step_id integer NOT NULL,
    total integer NOT NULL,
    finished integer NOT NULL DEFAULT 0,
    failed integer NOT NULL DEFAULT 0,
    tolerated integer NOT NULL,
    -- A PARALLEL step's branch names by index, which key its answer (NULL: a MAP).
    branches text[],
    done boolean NOT NULL DEFAULT false,
    PRIMARY KEY (parent_id, step_id)
);
-- The joins whose answer is due (every child finished, or too many failed) but has not
-- reached the parent: what a reporter that took over from a dead instance looks for.
CREATE INDEX IF NOT EXISTS fan_joins_due ON fan_joins (parent_id) WHERE NOT done;
