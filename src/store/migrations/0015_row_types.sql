-- The two statements written per batch (the creates, the executor's step transitions)
-- take their rows as one array of a row type each instead of one array per column: UNNEST
-- of nineteen arrays expands each into a tuplestore of its own and zips them, about 1.7 µs
-- of Postgres per transition more than one array of rows (measured with pgbench on 28-row
-- statements; docs/decisions.md). The fields are `store::transitions::Row`'s and
-- `store::buffer::NewRequest`'s, by name.
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
    IF to_regtype('new_request') IS NULL THEN
        CREATE TYPE new_request AS (
            id      uuid,
            wf      text,
            payload text,
            headers text,
            leased  boolean,
            created timestamptz,
            ver     integer
        );
    END IF;
END $$;
