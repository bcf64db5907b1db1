-- The executor's step transitions reach Postgres as one array of this row type instead of
-- nineteen arrays, one per column: UNNEST of nineteen arrays expands each into a
-- tuplestore of its own and zips them, about 1.7 µs of Postgres per transition more than
-- one array of rows (measured with pgbench on 28-row statements; docs/decisions.md).
-- The fields are `store::transitions::Row`'s, by name.
DO $$
BEGIN
    IF to_regtype('step_transition') IS NULL THEN
        CREATE TYPE step_transition AS (
            id            uuid,
            status        text,
            next_step     integer,
            next_request  text,
            failed_step   integer,
            reason        text,
            release       boolean,
            step_id       integer,
            step_name     text,
            step_status   text,
            step_request  text,
            step_response text,
            started_ms    float8,
            finished_ms   float8,
            step_reason   text,
            step_attempts integer,
            attempts      integer,
            retry_in_ms   float8,
            last_error    text
        );
    END IF;
END $$;
