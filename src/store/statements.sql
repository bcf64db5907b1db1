-- Every statement the server sends to Postgres, expanded: the consts and macros of
-- src/store/ as src/store/statements.rs lists them, in its order.
-- Generated, do not edit: the unit test store::statements::tests::statements_sql_is_current
-- fails when this file is stale; regenerate it with
--     CLAMP_BLESS=1 cargo test --lib store::statements

-- pool::sql::INSERT_REQUESTS
WITH v AS MATERIALIZED (SELECT w.name, w.version
    FROM workflows w
    WHERE w.name = ANY($2::text[])),
        ins AS (INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner,
            lease_until, created_at, workflow_version, deadline, priority, labels,
            notify) SELECT t.id,
            t.wf, t.payload, t.headers, CASE WHEN leased THEN $3::uuid END,
            CASE WHEN leased THEN now() + $4::float8 * interval '1 millisecond' ELSE '-infinity' END,
                t.created,
            NULLIF(CASE WHEN t.ver > 0 THEN t.ver ELSE coalesce(v.version, 1) END, 1),
            t.created + t.deadline_ms * interval '1 millisecond', t.priority, t.labels, t.notify
    FROM UNNEST($1::new_request[]) AS t
    LEFT JOIN v ON v.name = t.wf) SELECT name, version
    FROM v;

-- idempotency::INSERT_KEYED
WITH v AS MATERIALIZED (SELECT w.name, w.version
    FROM workflows w
    WHERE w.name = ANY($2::text[])), claimed AS (
    INSERT INTO idempotency_keys (key_hash, service_request_id)
    SELECT h, id FROM UNNEST($8::uuid[], $1::uuid[]) AS k(h, id) WHERE h IS NOT NULL
), ins AS (
INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner, lease_until,
    created_at,
                              workflow_version, deadline, priority, labels, notify)
SELECT t.id, t.wf, t.payload, t.headers, CASE WHEN leased THEN $6::uuid END,
    CASE WHEN leased THEN now() + $7::float8 * interval '1 millisecond' ELSE '-infinity' END,
    t.created, NULLIF(CASE WHEN t.ver > 0 THEN t.ver ELSE coalesce(v.version, 1) END, 1),
    t.created + t.deadline_ms * interval '1 millisecond', t.priority,
    string_to_array(t.labels, E'\n'), t.notify
FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bool[], $9::timestamptz[],
    $10::int[],
            $11::float8[], $12::int2[], $13::text[], $14::int2[])
    AS t(id, wf, payload, headers, leased, created, ver, deadline_ms, priority, labels, notify)
LEFT JOIN v ON v.name = t.wf
)
SELECT name, version FROM v;

-- idempotency::INSERT_KEYED_CONFLICTS
WITH input AS (
    SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bool[], $8::uuid[],
                         $9::timestamptz[], $11::int[], $12::float8[], $13::int2[], $14::text[],
                         $15::int2[])
        AS t(id, wf, payload, headers, leased, h, created, ver, deadline_ms, priority, labels,
             notify)
), v AS MATERIALIZED (SELECT w.name, w.version
    FROM workflows w
    WHERE w.name = ANY($2::text[])), claimed AS (
    INSERT INTO idempotency_keys AS k (key_hash, service_request_id)
    SELECT h, id FROM input WHERE h IS NOT NULL
    ON CONFLICT (key_hash) DO UPDATE
        SET service_request_id = EXCLUDED.service_request_id, created_at = now()
        WHERE k.created_at < now() - $10::float8 * interval '1 second'
    RETURNING service_request_id
), inserted AS (
    INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner, lease_until,
        created_at,
                                  workflow_version, deadline, priority, labels, notify)
    SELECT t.id, t.wf, t.payload, t.headers, CASE WHEN leased THEN $6::uuid END,
        CASE WHEN leased THEN now() + $7::float8 * interval '1 millisecond' ELSE '-infinity' END,
        t.created, NULLIF(CASE WHEN t.ver > 0 THEN t.ver ELSE coalesce(v.version, 1) END, 1),
        t.created + t.deadline_ms * interval '1 millisecond', t.priority,
        string_to_array(t.labels, E'\n'), t.notify
    FROM input t LEFT JOIN v ON v.name = t.wf
    WHERE t.h IS NULL OR t.id IN (SELECT service_request_id FROM claimed)
    RETURNING id, coalesce(workflow_version, 1) AS workflow_version
)
SELECT id, workflow_version FROM inserted;

-- idempotency::LOOKUP
SELECT t.idx, k.service_request_id, r.payload = t.payload,
    CASE WHEN r.status = 'NEW' AND (r.current_step_id > 0 OR (r.lease_until > now() AND r.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN r.status = 'PAUSED' AND EXISTS (SELECT 1
    FROM service_requests fc
    WHERE fc.parent_id = r.id AND fc.parent_step_id = r.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
        'IN_PROGRESS',
        'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE r.status END
FROM UNNEST($1::int[], $2::uuid[], $3::text[]) AS t(idx, h, payload)
JOIN idempotency_keys k ON k.key_hash = t.h
LEFT JOIN service_requests r ON r.id = k.service_request_id;

-- idempotency::DELETE_EXPIRED
DELETE
    FROM idempotency_keys
    WHERE ctid IN (SELECT ctid
        FROM idempotency_keys
        WHERE created_at < now() - $1::float8 * interval '1 second'
        LIMIT $2);

-- buffer::RESET_STATEMENT_TIMEOUT
RESET statement_timeout;

-- delayed::INSERT
INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner, lease_until,
    created_at, workflow_version, start_at, deadline, priority, labels, notify) SELECT $1,
    $2, $3, $4, NULL, $6, $5,
    NULLIF(CASE WHEN $7::int > 0 THEN $7::int ELSE coalesce((SELECT w.version
    FROM workflows w
    WHERE w.name = $2), 1) END, 1), $6, $6::timestamptz + $8::float8 * interval '1 millisecond',
        $9::int2, $10::text[], $11::int2;

-- slots::LOCK_MANY
SELECT pg_advisory_xact_lock(h)
    FROM (SELECT DISTINCT hashtextextended(w || '/' || k, 22) AS h
        FROM unnest($1::text[], $2::text[]) AS t(w, k)) l
    ORDER BY h;

-- partitions::REQUESTS_FIRST
LOCK TABLE ONLY service_requests IN ROW EXCLUSIVE MODE;

-- slots::INSERT
WITH input AS (
    SELECT *
        FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int[], $6::float8[],
            $7::text[], $8::bigint[], $9::bigint[], $10::float8[], $11::int2[], $12::text[],
            $13::int2[], $14::bool[], $15::timestamptz[]) AS t(id, workflow, payload, headers, ver,
            deadline_ms, key, lim, rate, window_ms, priority, labels, notify, leased, created)
), keys AS (
    SELECT workflow, key, min(lim) AS lim, min(rate) AS rate, min(window_ms) AS window_ms
        FROM input
        GROUP BY workflow, key
), v AS MATERIALIZED (SELECT w.name, w.version
    FROM workflows w
    WHERE w.name = ANY($2::text[])), room AS (
    -- A LATERAL probe per key, not an EXISTS: the planner may answer an EXISTS with one
    -- hashed scan of every waiting row.
    SELECT k.*, w.one IS NOT NULL AS queued
        FROM keys k
        LEFT JOIN LATERAL (SELECT 1 AS one
            FROM concurrency_slots q
            WHERE q.workflow_name = k.workflow AND q.concurrency_key = k.key AND q.queued
            LIMIT 1) w ON true
), counted AS MATERIALIZED (
    -- Materialized: the ranking reads a key's room twice, and an inlined CTE would
    -- count its slot holders once per reading.
    SELECT r.*,
        CASE WHEN r.queued AND (r.rate IS NULL OR r.lim >= 2147483647) THEN NULL ELSE r.lim - (SELECT count(*)
        FROM concurrency_slots h
        WHERE h.workflow_name = r.workflow AND h.concurrency_key = r.key AND NOT h.queued) END AS slot_room,
            CASE WHEN r.queued THEN NULL ELSE coalesce(r.rate,
                r.lim) - (CASE WHEN r.rate::bigint IS NULL THEN 0 ELSE (SELECT count(*)
            FROM concurrency_starts a
            WHERE a.workflow_name = r.workflow AND a.concurrency_key = r.key AND a.admitted_at > statement_timestamp() - r.window_ms::float8 * interval '1 millisecond') END) END AS rate_room
        FROM room r
), ranked AS (
    SELECT i.*, row_number() OVER (PARTITION BY i.workflow, i.key
        ORDER BY -coalesce(i.priority, 5), i.id) AS rank,
            CASE WHEN c.queued THEN 0 ELSE least(c.slot_room, c.rate_room) END AS free, c.queued,
            c.slot_room, c.rate_room,
            NULLIF(CASE WHEN i.ver > 0 THEN i.ver ELSE coalesce(v.version, 1) END,
                1) AS stored_version
        FROM input i
        JOIN counted c ON c.workflow = i.workflow AND c.key = i.key
        LEFT JOIN v ON v.name = i.workflow
), stored AS (
INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner, lease_until,
    workflow_version, deadline, concurrency_key, admitted_at, priority, labels, notify, created_at)
SELECT t.id, t.workflow, t.payload, t.headers,
    CASE WHEN t.rank <= t.free AND t.leased THEN $16::uuid END,
    CASE WHEN t.rank > t.free THEN 'infinity'::timestamptz WHEN t.leased THEN now() + $17::float8 * interval '1 millisecond' ELSE '-infinity'::timestamptz END,
        t.stored_version,
    t.created + t.deadline_ms * interval '1 millisecond', t.key,
    CASE WHEN t.rank <= t.free THEN statement_timestamp() END, t.priority,
    string_to_array(t.labels, E'\n'), t.notify, t.created
    FROM ranked t), slot_rows AS (
-- Each create's slot row (migration 34), written by the insert that creates it (no
-- trigger does, migration 36).
INSERT INTO concurrency_slots (id, workflow_name, concurrency_key, queued, rank)
SELECT t.id, t.workflow, t.key, t.rank > t.free, -coalesce(t.priority, 5)
    FROM ranked t), starts AS (
-- A start under a rate is counted by its own row (`started_within!`).
INSERT INTO concurrency_starts (workflow_name, concurrency_key, admitted_at)
SELECT t.workflow, t.key, statement_timestamp()
    FROM ranked t
    WHERE t.rank <= t.free AND t.rate IS NOT NULL)
-- What each create became, read from the ranking that stored it (no join back to the
-- inserted rows: a create is admitted exactly when its rank is within its key's room).
SELECT t.id, t.rank <= t.free,
    t.rank > t.free AND t.rate IS NOT NULL AND CASE WHEN t.queued THEN t.slot_room IS NULL OR t.rank <= t.slot_room ELSE t.rank > t.rate_room END,
        coalesce(t.stored_version, 1)
    FROM ranked t;

-- slots::ADMIT
WITH admitted AS (UPDATE service_requests SET lease_until = '-infinity',
    admitted_at = statement_timestamp()
    WHERE id IN (SELECT q.id
        FROM concurrency_slots q
        WHERE q.workflow_name = $1 AND q.concurrency_key = $2 AND q.queued
        ORDER BY q.rank, q.id
        LIMIT greatest(0, least($3 - (SELECT count(*)
            FROM concurrency_slots h
            WHERE h.workflow_name = $1 AND h.concurrency_key = $2 AND NOT h.queued),
                coalesce($4::bigint,
                    $3) - (CASE WHEN $4::bigint IS NULL THEN 0 ELSE (SELECT count(*)
                FROM concurrency_starts a
                WHERE a.workflow_name = $1 AND a.concurrency_key = $2 AND a.admitted_at > statement_timestamp() - $5::float8 * interval '1 millisecond') END)))) AND concurrency_key IS NOT NULL AND lease_until = 'infinity' AND status = 'NEW'
    RETURNING id), held AS ( UPDATE concurrency_slots slot SET queued = false
    WHERE slot.id = ANY (ARRAY(SELECT id
        FROM admitted))),
            starts AS ( INSERT INTO concurrency_starts (workflow_name, concurrency_key,
                admitted_at) SELECT $1,
                $2, statement_timestamp()
    FROM admitted
    WHERE $4::bigint IS NOT NULL) SELECT id
    FROM admitted;

-- slots::KEYS_OF
SELECT DISTINCT r.workflow_name, r.concurrency_key
    FROM unnest($1::uuid[]) AS u(id)
    JOIN service_requests r ON r.id = u.id CROSS
    JOIN LATERAL (SELECT 1
        FROM concurrency_slots q
        WHERE q.workflow_name = r.workflow_name AND q.concurrency_key = r.concurrency_key AND q.queued
        LIMIT 1) w
    WHERE r.concurrency_key IS NOT NULL AND EXISTS (SELECT 1
        FROM concurrency_slots q
        WHERE q.queued);

-- slots::WAITING_WORKFLOWS
WITH RECURSIVE w AS ( (SELECT q.workflow_name AS name
    FROM concurrency_slots q
    WHERE q.queued
    ORDER BY q.workflow_name
    LIMIT 1) UNION ALL SELECT (SELECT q.workflow_name
    FROM concurrency_slots q
    WHERE q.workflow_name > w.name AND q.queued
    ORDER BY q.workflow_name
    LIMIT 1)
    FROM w
    WHERE w.name IS NOT NULL) SELECT name
    FROM w
    WHERE name IS NOT NULL;

-- slots::DUE_KEYS
WITH RECURSIVE k AS ( (SELECT q.concurrency_key AS key
    FROM concurrency_slots q
    WHERE q.workflow_name = $1 AND ($4::text IS NULL OR q.concurrency_key > $4) AND q.queued
    ORDER BY q.concurrency_key
    LIMIT 1) UNION ALL SELECT (SELECT q.concurrency_key
    FROM concurrency_slots q
    WHERE q.workflow_name = $1 AND q.concurrency_key > k.key AND q.queued
    ORDER BY q.concurrency_key
    LIMIT 1)
    FROM k
    WHERE k.key IS NOT NULL) SELECT key
    FROM k
    WHERE key IS NOT NULL AND (SELECT count(*)
        FROM concurrency_slots h
        WHERE h.workflow_name = $1 AND h.concurrency_key = k.key AND NOT h.queued) < $2 AND (CASE WHEN $5::bigint IS NULL THEN 0 ELSE (SELECT count(*)
            FROM concurrency_starts a
            WHERE a.workflow_name = $1 AND a.concurrency_key = k.key AND a.admitted_at > statement_timestamp() - $6::float8 * interval '1 millisecond') END) < coalesce($5::bigint,
                1)
    LIMIT $3;

-- slots::WAITING_COUNTS
SELECT q.workflow_name, count(*) FROM concurrency_slots q WHERE q.queued GROUP BY q.workflow_name;

-- slots::WAITING_BY_KEY
SELECT q.concurrency_key, count(*), sum(count(*)) OVER ()::int8, count(*) OVER ()
    FROM concurrency_slots q
    WHERE q.workflow_name = $1 AND q.queued
    GROUP BY q.concurrency_key
    ORDER BY count(*) DESC, q.concurrency_key
    LIMIT $2;

-- slots::FORGET_STARTS
DELETE
    FROM concurrency_starts
    WHERE admitted_at < statement_timestamp() - $1::float8 * interval '1 millisecond';

-- leases::CLAIM
UPDATE service_requests s SET lease_owner = $1,
       lease_until = now() + $2::float8 * interval '1 millisecond', updated_at = now()
FROM (
    WITH due AS (
        SELECT d.id, d.lease_until, d.lease_owner, row_number() OVER () AS n FROM (
            -- The nine due bands in order (priority 9 first), each read in its order as
            -- far as the claim needs.
            SELECT x.id, x.lease_until, x.lease_owner
            FROM generate_series(0, 8) AS b(band) CROSS JOIN LATERAL (
                SELECT id, lease_until, lease_owner FROM service_requests
                WHERE status IN ('NEW', 'IN_PROGRESS',
                    'RESUMED') AND (CASE WHEN lease_owner = '00000000-0000-0000-0000-000000000000'::uuid THEN 2000000000000::float8 + date_part('epoch',
                        created_at - '1970-01-01 00:00:00+00'::timestamptz) WHEN status = 'PAUSED' THEN CASE WHEN lease_until = 'infinity'::timestamptz OR lease_until = '-infinity'::timestamptz THEN 'Infinity'::float8 ELSE 1000000000000::float8 + date_part('epoch',
                        lease_until - '1970-01-01 00:00:00+00'::timestamptz) END WHEN lease_until = '-infinity'::timestamptz THEN date_part('epoch',
                        created_at - '1970-01-01 00:00:00+00'::timestamptz) - coalesce(priority,
                        5)::float8 * 10000000000::float8 WHEN lease_until = 'infinity'::timestamptz THEN 'Infinity'::float8 ELSE date_part('epoch',
                            lease_until - '1970-01-01 00:00:00+00'::timestamptz) + (9 - coalesce(priority,
                                5))::float8 * 10000000000::float8 END) > b.band * 10000000000::float8 AND (CASE WHEN lease_owner = '00000000-0000-0000-0000-000000000000'::uuid THEN 2000000000000::float8 + date_part('epoch',
                        created_at - '1970-01-01 00:00:00+00'::timestamptz) WHEN status = 'PAUSED' THEN CASE WHEN lease_until = 'infinity'::timestamptz OR lease_until = '-infinity'::timestamptz THEN 'Infinity'::float8 ELSE 1000000000000::float8 + date_part('epoch',
                        lease_until - '1970-01-01 00:00:00+00'::timestamptz) END WHEN lease_until = '-infinity'::timestamptz THEN date_part('epoch',
                        created_at - '1970-01-01 00:00:00+00'::timestamptz) - coalesce(priority,
                        5)::float8 * 10000000000::float8 WHEN lease_until = 'infinity'::timestamptz THEN 'Infinity'::float8 ELSE date_part('epoch',
                            lease_until - '1970-01-01 00:00:00+00'::timestamptz) + (9 - coalesce(priority,
                                5))::float8 * 10000000000::float8 END) < b.band * 10000000000::float8 + date_part('epoch',
                        now() - '1970-01-01 00:00:00+00'::timestamptz)
                ORDER BY (CASE WHEN lease_owner = '00000000-0000-0000-0000-000000000000'::uuid THEN 2000000000000::float8 + date_part('epoch',
                    created_at - '1970-01-01 00:00:00+00'::timestamptz) WHEN status = 'PAUSED' THEN CASE WHEN lease_until = 'infinity'::timestamptz OR lease_until = '-infinity'::timestamptz THEN 'Infinity'::float8 ELSE 1000000000000::float8 + date_part('epoch',
                    lease_until - '1970-01-01 00:00:00+00'::timestamptz) END WHEN lease_until = '-infinity'::timestamptz THEN date_part('epoch',
                    created_at - '1970-01-01 00:00:00+00'::timestamptz) - coalesce(priority,
                    5)::float8 * 10000000000::float8 WHEN lease_until = 'infinity'::timestamptz THEN 'Infinity'::float8 ELSE date_part('epoch',
                        lease_until - '1970-01-01 00:00:00+00'::timestamptz) + (9 - coalesce(priority,
                            5))::float8 * 10000000000::float8 END)
                LIMIT $3
                FOR UPDATE SKIP LOCKED) x
            LIMIT $3) d
    ), fresh AS (
        SELECT id, lease_until, lease_owner FROM service_requests
        WHERE status IN ('NEW', 'IN_PROGRESS',
            'RESUMED') AND (CASE WHEN lease_owner = '00000000-0000-0000-0000-000000000000'::uuid THEN 2000000000000::float8 + date_part('epoch',
                created_at - '1970-01-01 00:00:00+00'::timestamptz) WHEN status = 'PAUSED' THEN CASE WHEN lease_until = 'infinity'::timestamptz OR lease_until = '-infinity'::timestamptz THEN 'Infinity'::float8 ELSE 1000000000000::float8 + date_part('epoch',
                lease_until - '1970-01-01 00:00:00+00'::timestamptz) END WHEN lease_until = '-infinity'::timestamptz THEN date_part('epoch',
                created_at - '1970-01-01 00:00:00+00'::timestamptz) - coalesce(priority,
                5)::float8 * 10000000000::float8 WHEN lease_until = 'infinity'::timestamptz THEN 'Infinity'::float8 ELSE date_part('epoch',
                    lease_until - '1970-01-01 00:00:00+00'::timestamptz) + (9 - coalesce(priority,
                        5))::float8 * 10000000000::float8 END) <= 0
        ORDER BY (CASE WHEN lease_owner = '00000000-0000-0000-0000-000000000000'::uuid THEN 2000000000000::float8 + date_part('epoch',
            created_at - '1970-01-01 00:00:00+00'::timestamptz) WHEN status = 'PAUSED' THEN CASE WHEN lease_until = 'infinity'::timestamptz OR lease_until = '-infinity'::timestamptz THEN 'Infinity'::float8 ELSE 1000000000000::float8 + date_part('epoch',
            lease_until - '1970-01-01 00:00:00+00'::timestamptz) END WHEN lease_until = '-infinity'::timestamptz THEN date_part('epoch',
            created_at - '1970-01-01 00:00:00+00'::timestamptz) - coalesce(priority,
            5)::float8 * 10000000000::float8 WHEN lease_until = 'infinity'::timestamptz THEN 'Infinity'::float8 ELSE date_part('epoch',
                lease_until - '1970-01-01 00:00:00+00'::timestamptz) + (9 - coalesce(priority,
                    5))::float8 * 10000000000::float8 END)
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    )
    -- In this order (an Append reads its parts one after another): the first half of
    -- the due rows, the fresh ones, the rest of the due ones.
    SELECT id, lease_until, lease_owner FROM due WHERE n <= ($3 + 1) / 2
    UNION ALL
    SELECT id, lease_until, lease_owner FROM fresh
    UNION ALL
    SELECT id, lease_until, lease_owner FROM due WHERE n > ($3 + 1) / 2
    LIMIT $3) was
WHERE s.id = was.id
RETURNING
    -- A timer fired: the row was left unleased until a time (a WAIT's end, a back-off, a
    -- delayed start), not leased by an instance that died, nor free since its insert.
    CASE WHEN was.lease_owner IS NULL AND was.lease_until > '-infinity'
         THEN extract(epoch
             FROM now() - was.lease_until)::float8 END AS fired_late_s, s.id, s.workflow_name,
                 s.status, s.payload, s.headers, s.current_step_id, s.step_request,
                 s.failed_step_id, s.reason, s.step_attempts, (extract(epoch
                 FROM s.created_at) * 1000000)::bigint AS created_us,
                     coalesce(s.workflow_version, 1) AS version, s.parent_id, s.retries,
                     CASE WHEN s.failed_step_id IS NULL THEN extract(epoch
             FROM s.deadline - now())::float8 * 1000 END AS deadline_in_ms, s.priority;

-- leases::RENEW
WITH ids AS (SELECT unnest($3::uuid[]) AS id),
renewed AS (
    UPDATE service_requests s SET lease_until = now() + $2::float8 * interval '1 millisecond'
    FROM ids WHERE s.id = ids.id AND s.lease_owner = $1
    RETURNING s.id)
SELECT s.id FROM ids JOIN service_requests s ON s.id = ids.id
WHERE s.lease_owner IS NOT NULL AND s.lease_owner <> $1;

-- leases::RELEASE
UPDATE service_requests SET lease_owner = NULL,
    lease_until = CASE WHEN $3::float8 > 0 THEN now() + $3::float8 * interval '1 millisecond' ELSE '-infinity' END
    FROM unnest($2::uuid[]) AS u(id)
    WHERE service_requests.id = u.id AND lease_owner = $1;

-- leases::LOAD_CONTEXT
SELECT st.step_name, CASE WHEN st.request = '' THEN r.payload ELSE st.request END, st.response
    FROM steps_status st
    JOIN service_requests r ON r.id = st.service_request_id
    WHERE st.service_request_id = $1 AND st.step_id > 0
    ORDER BY st.id;

-- transitions::WRITE_TRANSITIONS
WITH input AS (
    -- One array of rows (migration 15's type), not an array per column.
    SELECT * FROM UNNEST($1::step_transition[])
), fenced AS (
    UPDATE service_requests s SET
        -- Between steps the stored status stays NEW (or RESUMED): status is in the claim
        -- index's predicate, so leaving it alone lets the update be HOT (no index writes).
        -- Reads show such a request as IN_PROGRESS.
        status = CASE WHEN i.status = 'IN_PROGRESS' THEN s.status ELSE i.status END,
        current_step_id = i.next_step, step_request = i.next_request,
        failed_step_id = i.failed_step, reason = i.reason, updated_at = now(),
        step_attempts = i.attempts, last_error = i.last_error,
        finished_at = CASE WHEN i.status IN ('COMPLETED', 'FAILED', 'CANCELLED') THEN now() END,
        lease_owner = CASE WHEN i.release THEN NULL ELSE s.lease_owner END,
        -- A pending retry waits unowned until it is due; the sweeper claims it then.
        lease_until = CASE WHEN i.retry_in_ms IS NOT NULL
                           THEN now() + i.retry_in_ms::float8 * interval '1 millisecond'
                           WHEN i.release THEN '-infinity'::timestamptz ELSE s.lease_until END
    FROM input i
    -- The fence: still leased to this instance, and not cancelled meanwhile.
    WHERE s.id = i.id AND s.lease_owner = $2 AND s.status <> 'CANCELLED'
    RETURNING s.id, s.status, s.concurrency_key IS NOT NULL AS keyed
), records AS (
    INSERT INTO steps_status (service_request_id, step_id, step_name, status, request, response,
                              started_at, finished_at, time_taken_ms, reason, attempts)
    SELECT i.id, i.step_id, i.step_name, i.step_status, i.step_request, i.step_response,
           to_timestamp(i.started_ms / 1000.0), to_timestamp(i.finished_ms / 1000.0),
           CASE WHEN i.finished_ms IS NULL THEN NULL ELSE round(i.finished_ms - i.started_ms)::bigint END,
           i.step_reason, i.step_attempts
    FROM input i LEFT JOIN fenced f ON f.id = i.id
    -- A request cancelled while one of its steps was in flight still gets that step's
    -- outcome as its entry (nothing after it starts); only unfenced rows are looked at.
    -- (0: no record; below 0: a lane's step, `workflow::fan::lane_step_id`)
    WHERE i.step_id <> 0
      AND (f.id IS NOT NULL
           OR EXISTS (SELECT 1
               FROM service_requests c
               WHERE c.id = i.id AND c.status = 'CANCELLED'))
), freed AS (DELETE
    FROM concurrency_slots c
    WHERE c.id = ANY (ARRAY(SELECT f.id
        FROM fenced f
        WHERE f.keyed AND f.status IN ('COMPLETED', 'FAILED', 'CANCELLED'))))
SELECT id FROM fenced;

-- transitions::WRITE_TRANSITIONS_TELLING
WITH input AS (
    -- One array of rows (migration 15's type), not an array per column.
    SELECT * FROM UNNEST($1::step_transition[])
), fenced AS (
    UPDATE service_requests s SET
        -- Between steps the stored status stays NEW (or RESUMED): status is in the claim
        -- index's predicate, so leaving it alone lets the update be HOT (no index writes).
        -- Reads show such a request as IN_PROGRESS.
        status = CASE WHEN i.status = 'IN_PROGRESS' THEN s.status ELSE i.status END,
        current_step_id = i.next_step, step_request = i.next_request,
        failed_step_id = i.failed_step, reason = i.reason, updated_at = now(),
        step_attempts = i.attempts, last_error = i.last_error,
        finished_at = CASE WHEN i.status IN ('COMPLETED', 'FAILED', 'CANCELLED') THEN now() END,
        lease_owner = CASE WHEN i.release THEN NULL ELSE s.lease_owner END,
        -- A pending retry waits unowned until it is due; the sweeper claims it then.
        lease_until = CASE WHEN i.retry_in_ms IS NOT NULL
                           THEN now() + i.retry_in_ms::float8 * interval '1 millisecond'
                           WHEN i.release THEN '-infinity'::timestamptz ELSE s.lease_until END
    FROM input i
    -- The fence: still leased to this instance, and not cancelled meanwhile.
    WHERE s.id = i.id AND s.lease_owner = $2 AND s.status <> 'CANCELLED'
    RETURNING s.id, s.notify, s.workflow_name, s.workflow_version, s.reason, s.status,
        s.concurrency_key IS NOT NULL AS keyed
), records AS (
    INSERT INTO steps_status (service_request_id, step_id, step_name, status, request, response,
                              started_at, finished_at, time_taken_ms, reason, attempts)
    SELECT i.id, i.step_id, i.step_name, i.step_status, i.step_request, i.step_response,
           to_timestamp(i.started_ms / 1000.0), to_timestamp(i.finished_ms / 1000.0),
           CASE WHEN i.finished_ms IS NULL THEN NULL ELSE round(i.finished_ms - i.started_ms)::bigint END,
           i.step_reason, i.step_attempts
    FROM input i LEFT JOIN fenced f ON f.id = i.id
    -- A request cancelled while one of its steps was in flight still gets that step's
    -- outcome as its entry (nothing after it starts); only unfenced rows are looked at.
    -- (0: no record; below 0: a lane's step, `workflow::fan::lane_step_id`)
    WHERE i.step_id <> 0
      AND (f.id IS NOT NULL
           OR EXISTS (SELECT 1
               FROM service_requests c
               WHERE c.id = i.id AND c.status = 'CANCELLED'))
),
    told AS (INSERT INTO notifications (service_request_id, workflow_name, workflow_version, status, reason) SELECT n.id, n.workflow_name, coalesce(n.workflow_version, 1), n.status, n.reason
    FROM fenced n
    WHERE n.notify IS NOT NULL AND n.notify & (CASE n.status WHEN 'COMPLETED' THEN 1 WHEN 'FAILED' THEN 2 WHEN 'CANCELLED' THEN 4 ELSE 0 END) <> 0),
        freed AS (DELETE
    FROM concurrency_slots c
    WHERE c.id = ANY (ARRAY(SELECT f.id
        FROM fenced f
        WHERE f.keyed AND f.status IN ('COMPLETED', 'FAILED', 'CANCELLED'))))
SELECT id FROM fenced;

-- step_responses::REQUEST_STATE
SELECT workflow_name, status, current_step_id, coalesce(workflow_version, 1)
    FROM service_requests
    WHERE id = $1;

-- step_responses::RESUME
WITH resumed AS (
    UPDATE service_requests SET status = 'RESUMED', current_step_id = $3,
        -- '' marks the payload in a record, NULL in the row (see sql::step_request).
        step_request = COALESCE($4, (SELECT NULLIF(request, '') FROM steps_status
                                     WHERE service_request_id = $1 AND step_id = $2
                                         ORDER BY id DESC
                                         LIMIT 1)),
        failed_step_id = $5, reason = $6, updated_at = now(),
        step_attempts = 0, last_error = NULL,
        -- Leased to this instance when it has room to continue the request at once;
        -- otherwise free for any sweeper.
        lease_owner = $10,
        lease_until = CASE WHEN $10::uuid IS NULL THEN '-infinity'::timestamptz
                           ELSE now() + $11::float8 * interval '1 millisecond' END
    WHERE id = $1 AND status = 'PAUSED' AND current_step_id = $2
    RETURNING service_requests.id, service_requests.workflow_name, service_requests.status,
        service_requests.payload, service_requests.headers, service_requests.current_step_id,
        service_requests.step_request, service_requests.failed_step_id, service_requests.reason,
        service_requests.step_attempts, (extract(epoch
        FROM service_requests.created_at) * 1000000)::bigint AS created_us,
            coalesce(service_requests.workflow_version, 1) AS version, service_requests.parent_id,
            service_requests.retries,
            CASE WHEN service_requests.failed_step_id IS NULL THEN extract(epoch
        FROM service_requests.deadline - now())::float8 * 1000 END AS deadline_in_ms,
            service_requests.priority
), answered AS (
    UPDATE steps_status SET status = $7, response = $8, reason = $9, finished_at = now(),
        time_taken_ms = round(extract(epoch FROM now() - started_at) * 1000)::bigint
    WHERE service_request_id = $1 AND step_id = $2 AND status = 'STARTED'
      AND EXISTS (SELECT 1 FROM resumed)
)
SELECT * FROM resumed;

-- step_responses::ANSWERED
SELECT EXISTS (SELECT 1
    FROM steps_status
    WHERE service_request_id = $1 AND step_id = $2 AND status IN ('COMPLETED', 'FAILED'));

-- cancel::CANCEL
WITH RECURSIVE tree AS (
    SELECT $1::uuid AS id
    UNION ALL
    SELECT c.id FROM service_requests c JOIN tree t ON c.parent_id = t.id
    WHERE c.parent_id IS NOT NULL
), done AS (
    UPDATE service_requests SET status = 'CANCELLED',
    reason = CASE WHEN id = $1 THEN $2 ELSE 'its parent was cancelled: ' || $2 END,
    finished_at = now(), updated_at = now(), lease_owner = NULL, lease_until = '-infinity'
    WHERE id IN (SELECT id FROM tree)
      AND status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
    RETURNING id, workflow_name, headers,
        (extract(epoch FROM created_at) * 1000000)::int8 AS created_us, retries, reason,
        notify, workflow_version, status, concurrency_key, lease_until, priority
),
    told AS (INSERT INTO notifications (service_request_id, workflow_name, workflow_version, status, reason) SELECT n.id, n.workflow_name, coalesce(n.workflow_version, 1), n.status, n.reason
    FROM done n
    WHERE n.notify IS NOT NULL AND n.notify & (CASE n.status WHEN 'COMPLETED' THEN 1 WHEN 'FAILED' THEN 2 WHEN 'CANCELLED' THEN 4 ELSE 0 END) <> 0
), slots_gone AS (DELETE
    FROM concurrency_slots q
    WHERE q.id = ANY (ARRAY(SELECT f.id
        FROM done f
        WHERE f.concurrency_key IS NOT NULL AND concurrency_slot_state(f.status,
            f.lease_until) = 0))),
            slots_kept AS (INSERT INTO concurrency_slots (id, workflow_name, concurrency_key,
                queued, rank) SELECT f.id,
                f.workflow_name, f.concurrency_key,
                concurrency_slot_state(f.status, f.lease_until) = 1, -coalesce(f.priority, 5)
    FROM done f
    WHERE f.concurrency_key IS NOT NULL AND concurrency_slot_state(f.status, f.lease_until) > 0
    ON CONFLICT (id) DO UPDATE SET queued = excluded.queued, rank = excluded.rank)
SELECT id, workflow_name, headers, created_us, retries, reason FROM done
ORDER BY id = $1 DESC;

-- cancel::CANCEL_COMPENSATING
WITH RECURSIVE tree AS (
    SELECT c.id FROM service_requests c WHERE c.parent_id = $1
    UNION ALL
    SELECT g.id FROM service_requests g JOIN tree t ON g.parent_id = t.id
    WHERE g.parent_id IS NOT NULL
), me AS (
    UPDATE service_requests SET status = 'IN_PROGRESS', failed_step_id = 0, current_step_id = 0,
        step_request = NULL, reason = $2,
       step_attempts = 0, last_error = NULL, lease_owner = NULL, lease_until = '-infinity',
       updated_at = now()
    WHERE id = $1 AND failed_step_id IS NULL AND status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
    RETURNING id, workflow_name, headers,
        (extract(epoch FROM created_at) * 1000000)::int8 AS created_us, retries, reason,
        status, concurrency_key, lease_until, priority
), done AS (
    UPDATE service_requests SET status = 'CANCELLED',
    reason = 'its parent was cancelled: ' || $2,
    finished_at = now(), updated_at = now(), lease_owner = NULL, lease_until = '-infinity'
    WHERE id IN (SELECT id FROM tree) AND EXISTS (SELECT 1 FROM me)
      AND status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
    RETURNING id, workflow_name, headers,
        (extract(epoch FROM created_at) * 1000000)::int8 AS created_us, retries, reason,
        notify, workflow_version, status, concurrency_key, lease_until, priority
),
    told AS (INSERT INTO notifications (service_request_id, workflow_name, workflow_version, status, reason) SELECT n.id, n.workflow_name, coalesce(n.workflow_version, 1), n.status, n.reason
    FROM done n
    WHERE n.notify IS NOT NULL AND n.notify & (CASE n.status WHEN 'COMPLETED' THEN 1 WHEN 'FAILED' THEN 2 WHEN 'CANCELLED' THEN 4 ELSE 0 END) <> 0
), changed AS (SELECT id, workflow_name, concurrency_key, status, lease_until, priority
    FROM me UNION ALL SELECT id, workflow_name, concurrency_key, status, lease_until, priority
    FROM done), slots_gone AS (DELETE
    FROM concurrency_slots q
    WHERE q.id = ANY (ARRAY(SELECT f.id
        FROM changed f
        WHERE f.concurrency_key IS NOT NULL AND concurrency_slot_state(f.status,
            f.lease_until) = 0))),
            slots_kept AS (INSERT INTO concurrency_slots (id, workflow_name, concurrency_key,
                queued, rank) SELECT f.id,
                f.workflow_name, f.concurrency_key,
                concurrency_slot_state(f.status, f.lease_until) = 1, -coalesce(f.priority, 5)
    FROM changed f
    WHERE f.concurrency_key IS NOT NULL AND concurrency_slot_state(f.status, f.lease_until) > 0
    ON CONFLICT (id) DO UPDATE SET queued = excluded.queued, rank = excluded.rank)
SELECT true, id, workflow_name, headers, created_us, retries, reason FROM me
UNION ALL
SELECT false, id, workflow_name, headers, created_us, retries, reason FROM done;

-- cancel::ASKED_AT_CREATE
SELECT coalesce(labels @> ARRAY[$2::text], false) FROM service_requests WHERE id = $1;

-- cancel::STATUS_AND_REASON
SELECT status, reason FROM service_requests WHERE id = $1;

-- retry::RETRY
WITH retried AS (UPDATE service_requests s SET status = 'NEW',
    current_step_id = CASE WHEN s.status = 'FAILED' THEN coalesce(s.failed_step_id, 1)
                           ELSE greatest(s.current_step_id, 1) END,
    step_request = CASE
        WHEN $2::text IS NOT NULL THEN $2
        WHEN s.status = 'FAILED' AND s.failed_step_id IS NOT NULL THEN
            -- '' marks the payload in a record, NULL in the row (see sql::step_request).
            (SELECT NULLIF(st.request, '') FROM steps_status st
             WHERE st.service_request_id = s.id AND st.step_id = s.failed_step_id
             ORDER BY st.id DESC LIMIT 1)
        WHEN s.status = 'FAILED' THEN NULL
        ELSE s.step_request END,
    failed_step_id = NULL, reason = NULL, finished_at = NULL, step_attempts = 0,
    last_error = NULL, retries = s.retries + 1, updated_at = now(),
    -- A request with a concurrency key waits for a slot again (`slots`).
    lease_owner = NULL,
    lease_until = CASE WHEN s.concurrency_key IS NULL THEN '-infinity'::timestamptz
                       ELSE 'infinity'::timestamptz END,
    deadline = now() + (s.deadline - coalesce(s.start_at, s.created_at))
        WHERE s.id = $1 AND s.status IN ('FAILED', 'CANCELLED')
  AND (s.status = 'CANCELLED' OR s.failed_step_id IS NOT NULL
       OR NOT EXISTS (SELECT 1 FROM steps_status x WHERE x.service_request_id = s.id))
           RETURNING s.retries, s.headers, s.id, s.workflow_name, s.concurrency_key, s.status,
               s.lease_until, s.priority), slots_gone AS (DELETE
               FROM concurrency_slots q
               WHERE q.id = ANY (ARRAY(SELECT f.id
                   FROM retried f
                   WHERE f.concurrency_key IS NOT NULL AND concurrency_slot_state(f.status,
                       f.lease_until) = 0))),
                       slots_kept AS (INSERT INTO concurrency_slots (id, workflow_name,
                           concurrency_key, queued, rank) SELECT f.id,
                           f.workflow_name, f.concurrency_key,
                           concurrency_slot_state(f.status, f.lease_until) = 1,
                           -coalesce(f.priority, 5)
               FROM retried f
               WHERE f.concurrency_key IS NOT NULL AND concurrency_slot_state(f.status,
                   f.lease_until) > 0
               ON CONFLICT (id) DO UPDATE SET queued = excluded.queued,
                   rank = excluded.rank) SELECT retries, headers, concurrency_key IS NOT NULL
           FROM retried;

-- retry::STATUS
SELECT status FROM service_requests WHERE id = $1;

-- retry::RETRY_MATCHING
WITH candidates AS (
    SELECT s.id FROM service_requests s
    WHERE s.id >= $3 AND s.id < $4 AND s.status = ANY($1)
      AND ($5::text IS NULL OR s.workflow_name = $5)
      AND ($6::timestamptz IS NULL OR s.created_at > $6)
      AND ($8::timestamptz IS NULL OR s.created_at < $8)
      AND s.status IN ('FAILED', 'CANCELLED')
  AND (s.status = 'CANCELLED' OR s.failed_step_id IS NOT NULL
       OR NOT EXISTS (SELECT 1 FROM steps_status x WHERE x.service_request_id = s.id))
    ORDER BY s.id DESC LIMIT $7::bigint + 1
    FOR UPDATE SKIP LOCKED
), taken AS (
    SELECT id FROM candidates ORDER BY id DESC LIMIT $7::bigint
), retried AS (
    UPDATE service_requests s SET status = 'NEW',
    current_step_id = CASE WHEN s.status = 'FAILED' THEN coalesce(s.failed_step_id, 1)
                           ELSE greatest(s.current_step_id, 1) END,
    step_request = CASE
        WHEN $2::text IS NOT NULL THEN $2
        WHEN s.status = 'FAILED' AND s.failed_step_id IS NOT NULL THEN
            -- '' marks the payload in a record, NULL in the row (see sql::step_request).
            (SELECT NULLIF(st.request, '') FROM steps_status st
             WHERE st.service_request_id = s.id AND st.step_id = s.failed_step_id
             ORDER BY st.id DESC LIMIT 1)
        WHEN s.status = 'FAILED' THEN NULL
        ELSE s.step_request END,
    failed_step_id = NULL, reason = NULL, finished_at = NULL, step_attempts = 0,
    last_error = NULL, retries = s.retries + 1, updated_at = now(),
    -- A request with a concurrency key waits for a slot again (`slots`).
    lease_owner = NULL,
    lease_until = CASE WHEN s.concurrency_key IS NULL THEN '-infinity'::timestamptz
                       ELSE 'infinity'::timestamptz END,
    deadline = now() + (s.deadline - coalesce(s.start_at, s.created_at))
        FROM taken t
        WHERE s.id = t.id AND s.status IN ('FAILED', 'CANCELLED')
  AND (s.status = 'CANCELLED' OR s.failed_step_id IS NOT NULL
       OR NOT EXISTS (SELECT 1 FROM steps_status x WHERE x.service_request_id = s.id))
           RETURNING s.id, s.workflow_name, s.concurrency_key, s.status, s.lease_until, s.priority
), slots_gone AS (DELETE
    FROM concurrency_slots q
    WHERE q.id = ANY (ARRAY(SELECT f.id
        FROM retried f
        WHERE f.concurrency_key IS NOT NULL AND concurrency_slot_state(f.status,
            f.lease_until) = 0))),
            slots_kept AS (INSERT INTO concurrency_slots (id, workflow_name, concurrency_key,
                queued, rank) SELECT f.id,
                f.workflow_name, f.concurrency_key,
                concurrency_slot_state(f.status, f.lease_until) = 1, -coalesce(f.priority, 5)
    FROM retried f
    WHERE f.concurrency_key IS NOT NULL AND concurrency_slot_state(f.status, f.lease_until) > 0
    ON CONFLICT (id) DO UPDATE SET queued = excluded.queued, rank = excluded.rank)
SELECT (SELECT count(*) FROM retried), (SELECT count(*) FROM candidates) > $7::bigint;

-- rerun::SOURCE
SELECT workflow_name, payload, headers, coalesce(workflow_version, 1), labels
    FROM service_requests
    WHERE id = $1;

-- rerun::LAST_RECORDS
SELECT DISTINCT ON (step_id) id, step_id, status, response
    FROM steps_status
    WHERE service_request_id = $1 AND step_id > 0
    ORDER BY step_id, id DESC;

-- rerun::INSERT
WITH run AS (
    INSERT INTO service_requests (id, workflow_name, status, payload, headers,
                                  current_step_id, step_request, rerun_of,
                                  lease_owner, lease_until, workflow_version, deadline,
                                  concurrency_key, priority, labels, notify)
    VALUES ($1, $3, 'NEW', $4, $5, $6, $7, $2, NULL,
            -- With the original's concurrency key, it waits for a slot (`slots`).
            CASE WHEN (SELECT o.concurrency_key FROM service_requests o WHERE o.id = $2) IS NULL
                 THEN '-infinity'::timestamptz ELSE 'infinity'::timestamptz END,
            NULLIF($10, 1),
            -- The original's deadline, as long again from now.
            (SELECT now() + (o.deadline - coalesce(o.start_at, o.created_at))
             FROM service_requests o WHERE o.id = $2),
            (SELECT o.concurrency_key FROM service_requests o WHERE o.id = $2),
            (SELECT o.priority FROM service_requests o WHERE o.id = $2),
            (SELECT o.labels FROM service_requests o WHERE o.id = $2),
            (SELECT o.notify FROM service_requests o WHERE o.id = $2))
    RETURNING id, workflow_name, concurrency_key, status, lease_until, priority),
        slots_gone AS (DELETE
        FROM concurrency_slots q
        WHERE q.id = ANY (ARRAY(SELECT f.id
            FROM run f
            WHERE f.concurrency_key IS NOT NULL AND concurrency_slot_state(f.status,
                f.lease_until) = 0))),
                slots_kept AS (INSERT INTO concurrency_slots (id, workflow_name, concurrency_key,
                    queued, rank) SELECT f.id,
                    f.workflow_name, f.concurrency_key,
                    concurrency_slot_state(f.status, f.lease_until) = 1, -coalesce(f.priority, 5)
        FROM run f
        WHERE f.concurrency_key IS NOT NULL AND concurrency_slot_state(f.status, f.lease_until) > 0
        ON CONFLICT (id) DO UPDATE SET queued = excluded.queued, rank = excluded.rank)
INSERT INTO steps_status (service_request_id, step_id, step_name, status, request, response,
                          started_at, finished_at, time_taken_ms, reason, attempts)
-- A record's request is copied as it is, the payload's mark ('', sql::step_request)
-- included: records are copied only for a rerun from a later step, whose payload is
-- the original's (http::rerun::plan).
SELECT run.id, st.step_id, st.step_name, st.status, st.request, st.response,
       now(), now(), 0, $9, st.attempts
FROM run, unnest($8::bigint[]) WITH ORDINALITY AS c(record_id, n)
JOIN steps_status st ON st.service_request_id = $2 AND st.id = c.record_id
ORDER BY c.n;

-- children::START
WITH fenced AS (
    UPDATE service_requests s SET status = 'PAUSED', current_step_id = $2, updated_at = now(),
           step_attempts = 0, last_error = NULL, lease_owner = NULL, lease_until = '-infinity'
    WHERE s.id = $1 AND s.lease_owner = $3 AND s.status <> 'CANCELLED'
    RETURNING s.id, s.headers, s.priority, s.labels
), record AS (
    INSERT INTO steps_status (service_request_id, step_id, step_name, status, request,
                              started_at, attempts, child_id)
    SELECT id, $2, $4, 'STARTED', $5, to_timestamp($6::float8 / 1000.0), $7, $8 FROM fenced
), child AS (
    INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner, lease_until,
                                  workflow_version, parent_id, parent_step_id, parent_told,
                                  deadline, priority, labels, notify)
    SELECT $8, $9, $5, f.headers, NULL, '-infinity',
        NULLIF(CASE WHEN $10 > 0 THEN $10 ELSE coalesce(w.version, 1) END, 1), $1, $2, false,
        now() + $11::float8 * interval '1 millisecond', f.priority, f.labels, $12::smallint
    FROM fenced f LEFT JOIN workflows w ON w.name = $9
    RETURNING id
)
SELECT count(*) FROM child;

-- children::UNTOLD
SELECT c.id, c.parent_id, c.parent_step_id, c.status, c.reason,
       (SELECT st.response FROM steps_status st
        WHERE st.service_request_id = c.id AND st.status IN ('COMPLETED', 'SKIPPED')
        ORDER BY st.id DESC LIMIT 1), c.fan_index
FROM service_requests c
WHERE c.parent_id IS NOT NULL AND NOT c.parent_told
  AND c.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
ORDER BY c.id LIMIT $1;

-- children::TOLD
UPDATE service_requests SET parent_told = true WHERE id = $1;

-- lanes::RECORDS
SELECT st.step_id, st.status, CASE WHEN st.request = '' THEN r.payload ELSE st.request END,
    st.response
    FROM steps_status st
    JOIN service_requests r ON r.id = st.service_request_id
    WHERE st.service_request_id = $1 AND st.step_id BETWEEN $2 AND $3
    ORDER BY st.id;

-- compensations::LAST_RECORDS
SELECT DISTINCT ON (step_id) step_id, status, response
    FROM steps_status
    WHERE service_request_id = $1 AND step_id > 0
    ORDER BY step_id, id DESC;

-- compensations::UNDOABLE
SELECT c.id, c.workflow_name, coalesce(c.workflow_version, 1) FROM service_requests c
WHERE c.parent_id = $1 AND c.parent_step_id = $2 AND c.fan_index IS NOT NULL
  AND c.status IN ('COMPLETED', 'CANCELLED');

-- compensations::UNDO_CHILDREN
WITH held AS (
    SELECT 1
        FROM service_requests p
        WHERE p.id = $1 AND p.lease_owner = $3 AND p.status <> 'CANCELLED'
), kids AS (
    UPDATE service_requests c SET status = 'IN_PROGRESS', failed_step_id = 0, current_step_id = 0,
        step_request = NULL, reason = $5,
           finished_at = NULL, parent_told = false, step_attempts = 0, last_error = NULL,
           lease_owner = NULL, lease_until = '-infinity', updated_at = now()
    WHERE c.id = ANY($4) AND c.parent_id = $1 AND c.parent_step_id = $2 AND EXISTS (SELECT 1
        FROM held)
      AND c.status IN ('COMPLETED', 'CANCELLED')
    RETURNING 1
), n AS (SELECT count(*) AS n FROM kids
), paused AS (
    UPDATE service_requests s SET status = 'PAUSED', current_step_id = $2, updated_at = now(),
        step_attempts = 0,
           lease_owner = NULL, lease_until = '-infinity'
    FROM n WHERE s.id = $1 AND s.lease_owner = $3 AND n.n > 0
    RETURNING 1
), joined AS (
    UPDATE fan_joins j SET finished = j.finished - n.n, tolerated = j.total, done = false
    FROM n WHERE j.parent_id = $1 AND j.step_id = $2 AND n.n > 0
    RETURNING 1
)
SELECT (SELECT count(*) FROM held), (SELECT n FROM n);

-- compensations::GO_ON
UPDATE service_requests SET status = 'RESUMED', current_step_id = $3, step_attempts = 0,
    updated_at = now(),
       lease_owner = NULL, lease_until = '-infinity'
WHERE id = $1 AND current_step_id = $2 AND failed_step_id IS NOT NULL AND status = 'PAUSED';

-- fan::START
WITH fenced AS (
    UPDATE service_requests s SET status = 'PAUSED', current_step_id = $2, updated_at = now(),
           step_attempts = 0, last_error = NULL, lease_owner = NULL, lease_until = '-infinity'
    WHERE s.id = $1 AND s.lease_owner = $3 AND s.status <> 'CANCELLED'
    RETURNING s.id, s.headers, s.priority, s.labels
), record AS (
    INSERT INTO steps_status (service_request_id, step_id, step_name, status, request,
                              started_at, attempts)
    SELECT id, $2, $4, 'STARTED', $5, to_timestamp($6::float8 / 1000.0), $7 FROM fenced
), fresh AS (
    SELECT f.headers, f.priority, f.labels FROM fenced f
    WHERE NOT EXISTS (SELECT 1 FROM fan_joins j WHERE j.parent_id = $1 AND j.step_id = $2)
), kids AS (
    INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner, lease_until,
                                  workflow_version, parent_id, parent_step_id, parent_told,
                                  fan_index, priority, labels, notify)
    SELECT c.id, c.workflow, c.payload, coalesce($15::text, f.headers),
           CASE WHEN c.n <= $16::int THEN $3::uuid END,
           CASE WHEN c.held THEN 'infinity'::timestamptz
                WHEN c.n <= $16::int THEN now() + $17::float8 * interval '1 millisecond'
                ELSE '-infinity'::timestamptz END,
           NULLIF(CASE WHEN c.version > 0 THEN c.version ELSE coalesce((SELECT w.version
               FROM workflows w
               WHERE w.name = c.workflow), 1) END, 1),
           $1, $2, false, (c.n - 1)::int, f.priority, f.labels, $18::smallint
    FROM fresh f,
         unnest($8::uuid[], $9::text[], $10::int[], $11::text[], $12::bool[])
           WITH ORDINALITY AS c(id, workflow, version, payload, held, n)
    RETURNING 1
), joined AS (
    INSERT INTO fan_joins (parent_id, step_id, total, tolerated, branches, switch,
                           max_iterations, last_child)
    SELECT $1, $2, cardinality($8::uuid[]), $13, $14::text[], $19::bool, $20::int,
           CASE WHEN $20::int IS NOT NULL THEN ($8::uuid[])[1] END
    FROM fresh
    RETURNING 1
)
SELECT (SELECT count(*) FROM fenced), (SELECT count(*) FROM fresh),
       (SELECT coalesce($15::text, f.headers) FROM fresh f);

-- fan::RESTART
WITH retried AS (UPDATE service_requests s SET status = 'NEW',
    current_step_id = CASE WHEN s.status = 'FAILED' THEN coalesce(s.failed_step_id, 1)
                           ELSE greatest(s.current_step_id, 1) END,
    step_request = CASE
        WHEN $2::text IS NOT NULL THEN $2
        WHEN s.status = 'FAILED' AND s.failed_step_id IS NOT NULL THEN
            -- '' marks the payload in a record, NULL in the row (see sql::step_request).
            (SELECT NULLIF(st.request, '') FROM steps_status st
             WHERE st.service_request_id = s.id AND st.step_id = s.failed_step_id
             ORDER BY st.id DESC LIMIT 1)
        WHEN s.status = 'FAILED' THEN NULL
        ELSE s.step_request END,
    failed_step_id = NULL, reason = NULL, finished_at = NULL, step_attempts = 0,
    last_error = NULL, retries = s.retries + 1, updated_at = now(),
    -- A request with a concurrency key waits for a slot again (`slots`).
    lease_owner = NULL,
    lease_until = CASE WHEN s.concurrency_key IS NULL THEN '-infinity'::timestamptz
                       ELSE 'infinity'::timestamptz END,
    deadline = now() + (s.deadline - coalesce(s.start_at, s.created_at)), parent_told = false
WHERE s.parent_id = $1 AND s.parent_step_id = $3 AND s.fan_index IS NOT NULL AND s.status IN ('FAILED',
    'CANCELLED')
  AND (s.status = 'CANCELLED' OR s.failed_step_id IS NOT NULL
       OR NOT EXISTS (SELECT 1 FROM steps_status x WHERE x.service_request_id = s.id))
           RETURNING s.fan_index, s.id, s.workflow_name, s.concurrency_key, s.status, s.lease_until,
               s.priority), slots_gone AS (DELETE
               FROM concurrency_slots q
               WHERE q.id = ANY (ARRAY(SELECT f.id
                   FROM retried f
                   WHERE f.concurrency_key IS NOT NULL AND concurrency_slot_state(f.status,
                       f.lease_until) = 0))),
                       slots_kept AS (INSERT INTO concurrency_slots (id, workflow_name,
                           concurrency_key, queued, rank) SELECT f.id,
                           f.workflow_name, f.concurrency_key,
                           concurrency_slot_state(f.status, f.lease_until) = 1,
                           -coalesce(f.priority, 5)
               FROM retried f
               WHERE f.concurrency_key IS NOT NULL AND concurrency_slot_state(f.status,
                   f.lease_until) > 0
               ON CONFLICT (id) DO UPDATE SET queued = excluded.queued,
                   rank = excluded.rank) SELECT fan_index
           FROM retried;

-- fan::RUNNING
SELECT count(*) FROM service_requests c
WHERE c.parent_id = $1 AND c.parent_step_id = $2 AND c.fan_index IS NOT NULL
  AND c.lease_until <> 'infinity' AND c.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED');

-- fan::HOLD
UPDATE service_requests SET lease_until = 'infinity'
    WHERE parent_id = $1 AND parent_step_id = $2 AND fan_index = ANY($3);

-- fan::REOPEN
UPDATE fan_joins SET finished = finished - $3, failed = 0, done = false
    WHERE parent_id = $1 AND step_id = $2
    RETURNING finished >= total;

-- fan::COUNT
WITH child AS (
    UPDATE service_requests c SET parent_told = true FROM unnest($1::uuid[]) AS u(id)
    WHERE c.id = u.id AND c.fan_index IS NOT NULL AND NOT c.parent_told AND c.status IN ('COMPLETED',
        'FAILED', 'CANCELLED')
    RETURNING c.parent_id, c.parent_step_id, c.status <> 'COMPLETED' AS failed
), per AS (
    SELECT parent_id, parent_step_id AS step_id, count(*)::int AS n,
           (count(*) FILTER (WHERE failed))::int AS f
    FROM child GROUP BY parent_id, parent_step_id
), locked AS (
    SELECT j.parent_id, j.step_id FROM fan_joins j, per
    WHERE j.parent_id = per.parent_id AND j.step_id = per.step_id
    ORDER BY j.parent_id, j.step_id
    FOR UPDATE OF j
), counted AS (
    UPDATE fan_joins j SET finished = j.finished + per.n, failed = j.failed + per.f
    FROM per, locked l
    WHERE j.parent_id = per.parent_id AND j.step_id = per.step_id
      AND l.parent_id = j.parent_id AND l.step_id = j.step_id
    RETURNING j.parent_id, j.step_id, j.total, j.finished, j.failed, j.tolerated, per.n
), next AS (
    SELECT h.id FROM counted j CROSS JOIN LATERAL (
        SELECT h.id FROM service_requests h
        WHERE h.parent_id = j.parent_id AND h.parent_step_id = j.step_id
          AND h.lease_until = 'infinity' AND j.failed <= j.tolerated AND j.finished < j.total
          AND h.status IN ('NEW', 'IN_PROGRESS', 'RESUMED')
        ORDER BY h.fan_index LIMIT j.n
        FOR UPDATE OF h
    ) h
), released AS (
    UPDATE service_requests s SET lease_owner = $2::uuid,
           lease_until = CASE WHEN $2::uuid IS NULL THEN '-infinity'::timestamptz ELSE now() + $3::float8 * interval '1 millisecond' END,
           updated_at = now()
    FROM next WHERE s.id = next.id
    RETURNING s.id, s.workflow_name, s.status, s.payload, s.headers, s.current_step_id,
        s.step_request, s.failed_step_id, s.reason, s.step_attempts, (extract(epoch
        FROM s.created_at) * 1000000)::bigint AS created_us,
            coalesce(s.workflow_version, 1) AS version, s.parent_id, s.retries,
            CASE WHEN s.failed_step_id IS NULL THEN extract(epoch
        FROM s.deadline - now())::float8 * 1000 END AS deadline_in_ms, s.priority
)
SELECT true, parent_id, step_id, total, finished, failed, tolerated,
       NULL::uuid, NULL::text, NULL::text, NULL::text, NULL::text, NULL::int, NULL::text,
       NULL::int, NULL::text, NULL::int, NULL::bigint, NULL::int, NULL::uuid, NULL::int,
       NULL::float8, NULL::int2
FROM counted
UNION ALL
SELECT false, NULL, NULL, NULL, NULL, NULL, NULL, r.* FROM released r;

-- fan::CANCEL_REST
WITH RECURSIVE tree AS (
    SELECT c.id FROM service_requests c
    WHERE c.parent_id = $1 AND c.parent_step_id = $2 AND c.fan_index IS NOT NULL
    UNION ALL
    SELECT g.id FROM service_requests g JOIN tree t ON g.parent_id = t.id
    WHERE g.parent_id IS NOT NULL
), cancelled AS (
    UPDATE service_requests c SET status = 'CANCELLED', reason = 'a sibling branch or item failed',
        finished_at = now(),
       parent_told = (c.parent_id = $1 AND c.parent_step_id = $2) OR c.parent_told,
       lease_owner = NULL, lease_until = '-infinity', updated_at = now()
    WHERE c.id IN (SELECT id FROM tree) AND c.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
    RETURNING c.id, c.parent_id = $1 AND c.parent_step_id = $2 AS own
), counted AS (
    UPDATE fan_joins j SET
        finished = j.finished + (SELECT count(*) FROM cancelled WHERE own),
        failed = j.failed + (SELECT count(*) FROM cancelled WHERE own)
    WHERE j.parent_id = $1 AND j.step_id = $2
    RETURNING 1
)
SELECT id FROM cancelled, (SELECT count(*) FROM counted) AS n;

-- fan::PARTS
SELECT c.fan_index, c.id, c.status, c.reason,
       (SELECT st.response FROM steps_status st
        WHERE st.service_request_id = c.id AND st.status IN ('COMPLETED', 'SKIPPED')
        ORDER BY st.id DESC LIMIT 1)
FROM service_requests c
WHERE c.parent_id = $1 AND c.parent_step_id = $2 AND c.fan_index IS NOT NULL
ORDER BY c.fan_index;

-- fan::JOIN
SELECT j.tolerated, j.branches, j.switch, j.max_iterations, j.total, p.workflow_name,
    coalesce(p.workflow_version, 1), p.payload, p.failed_step_id
    FROM fan_joins j
    JOIN service_requests p ON p.id = j.parent_id
    WHERE j.parent_id = $1 AND j.step_id = $2;

-- fan::LAST_PART
SELECT c.fan_index, c.id, c.status, c.reason,
       (SELECT st.response FROM steps_status st
        WHERE st.service_request_id = c.id AND st.status IN ('COMPLETED', 'SKIPPED')
        ORDER BY st.id DESC LIMIT 1)
FROM fan_joins j JOIN service_requests c ON c.id = j.last_child
WHERE j.parent_id = $1 AND j.step_id = $2;

-- fan::NEXT_ITERATION
WITH before AS (
    SELECT last_child FROM fan_joins WHERE parent_id = $1 AND step_id = $2
), grown AS (
    UPDATE fan_joins j SET total = j.total + 1, last_child = $4
    WHERE j.parent_id = $1 AND j.step_id = $2 AND j.total = $3 AND NOT j.done
      AND EXISTS (SELECT 1 FROM service_requests p WHERE p.id = $1 AND p.current_step_id = $2
                  AND p.status = 'PAUSED')
    RETURNING 1
)
INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner, lease_until,
                              workflow_version, parent_id, parent_step_id, parent_told,
                              fan_index, priority, labels, notify)
SELECT $4, c.workflow_name, $5, c.headers, $6::uuid,
       CASE WHEN $6::uuid IS NULL THEN '-infinity'::timestamptz ELSE now() + $7::float8 * interval '1 millisecond' END,
       c.workflow_version, $1, $2, false, $3, c.priority, c.labels, c.notify
FROM grown, before b, service_requests c
WHERE c.id = b.last_child
RETURNING headers, coalesce(workflow_version, 1), workflow_name;

-- fan::DONE
UPDATE fan_joins SET done = true WHERE parent_id = $1 AND step_id = $2;

-- fan::DUE
SELECT parent_id, step_id
    FROM fan_joins
    WHERE NOT done AND (finished >= total OR failed > tolerated)
    ORDER BY parent_id
    LIMIT $1;

-- fan::PLACE
SELECT c.fan_index, c.parent_id, p.workflow_name, p.payload
    FROM service_requests c
    JOIN service_requests p ON p.id = c.parent_id
    WHERE c.id = $1;

-- fan::CHILDREN
SELECT c.id, c.parent_step_id, c.fan_index, c.workflow_name,
    CASE WHEN c.status = 'NEW' AND (c.current_step_id > 0 OR (c.lease_until > now() AND c.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN c.status = 'PAUSED' AND EXISTS (SELECT 1
    FROM service_requests fc
    WHERE fc.parent_id = c.id AND fc.parent_step_id = c.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
        'IN_PROGRESS',
        'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE c.status END AS status,
        count(*) OVER () AS total,
       extract(epoch FROM c.created_at)::float8 * 1000,
       extract(epoch FROM c.finished_at)::float8 * 1000
FROM service_requests c WHERE c.parent_id = $1
ORDER BY c.parent_step_id, c.fan_index, c.id LIMIT $2 OFFSET $3;

-- deadlines::DUE
SELECT id, current_step_id, step_attempts, workflow_name, coalesce(workflow_version, 1)
FROM service_requests
WHERE status = 'PAUSED' AND lease_until > '-infinity' AND lease_until < now()
  AND (CASE WHEN lease_owner = '00000000-0000-0000-0000-000000000000'::uuid THEN 2000000000000::float8 + date_part('epoch',
      created_at - '1970-01-01 00:00:00+00'::timestamptz) WHEN status = 'PAUSED' THEN CASE WHEN lease_until = 'infinity'::timestamptz OR lease_until = '-infinity'::timestamptz THEN 'Infinity'::float8 ELSE 1000000000000::float8 + date_part('epoch',
      lease_until - '1970-01-01 00:00:00+00'::timestamptz) END WHEN lease_until = '-infinity'::timestamptz THEN date_part('epoch',
      created_at - '1970-01-01 00:00:00+00'::timestamptz) - coalesce(priority,
      5)::float8 * 10000000000::float8 WHEN lease_until = 'infinity'::timestamptz THEN 'Infinity'::float8 ELSE date_part('epoch',
          lease_until - '1970-01-01 00:00:00+00'::timestamptz) + (9 - coalesce(priority,
              5))::float8 * 10000000000::float8 END) > 1000000000000::float8 AND (CASE WHEN lease_owner = '00000000-0000-0000-0000-000000000000'::uuid THEN 2000000000000::float8 + date_part('epoch',
      created_at - '1970-01-01 00:00:00+00'::timestamptz) WHEN status = 'PAUSED' THEN CASE WHEN lease_until = 'infinity'::timestamptz OR lease_until = '-infinity'::timestamptz THEN 'Infinity'::float8 ELSE 1000000000000::float8 + date_part('epoch',
      lease_until - '1970-01-01 00:00:00+00'::timestamptz) END WHEN lease_until = '-infinity'::timestamptz THEN date_part('epoch',
      created_at - '1970-01-01 00:00:00+00'::timestamptz) - coalesce(priority,
      5)::float8 * 10000000000::float8 WHEN lease_until = 'infinity'::timestamptz THEN 'Infinity'::float8 ELSE date_part('epoch',
          lease_until - '1970-01-01 00:00:00+00'::timestamptz) + (9 - coalesce(priority,
              5))::float8 * 10000000000::float8 END) < 1000000000000::float8 + date_part('epoch',
      now() - '1970-01-01 00:00:00+00'::timestamptz)
ORDER BY (CASE WHEN lease_owner = '00000000-0000-0000-0000-000000000000'::uuid THEN 2000000000000::float8 + date_part('epoch',
    created_at - '1970-01-01 00:00:00+00'::timestamptz) WHEN status = 'PAUSED' THEN CASE WHEN lease_until = 'infinity'::timestamptz OR lease_until = '-infinity'::timestamptz THEN 'Infinity'::float8 ELSE 1000000000000::float8 + date_part('epoch',
    lease_until - '1970-01-01 00:00:00+00'::timestamptz) END WHEN lease_until = '-infinity'::timestamptz THEN date_part('epoch',
    created_at - '1970-01-01 00:00:00+00'::timestamptz) - coalesce(priority,
    5)::float8 * 10000000000::float8 WHEN lease_until = 'infinity'::timestamptz THEN 'Infinity'::float8 ELSE date_part('epoch',
        lease_until - '1970-01-01 00:00:00+00'::timestamptz) + (9 - coalesce(priority,
            5))::float8 * 10000000000::float8 END)
    LIMIT $1;

-- deadlines::EXPIRE
WITH expired AS (
    UPDATE service_requests SET status = 'RESUMED', current_step_id = $3,
        step_request = CASE WHEN $3 = $2 THEN step_request ELSE
            (SELECT NULLIF(request, '') FROM steps_status
             WHERE service_request_id = $1 AND step_id = $2 ORDER BY id DESC LIMIT 1) END,
        failed_step_id = $7, reason = $8, updated_at = now(),
        step_attempts = $4, last_error = $5, wait_event = NULL, wait_key = NULL, wait_next = NULL,
        lease_owner = NULL,
        lease_until = CASE WHEN $6::float8 IS NULL THEN '-infinity'::timestamptz ELSE now() + $6::float8 * interval '1 millisecond' END
    WHERE id = $1 AND status = 'PAUSED' AND current_step_id = $2
      AND lease_until > '-infinity' AND lease_until < now()
    RETURNING id
), recorded AS (
    UPDATE steps_status SET status = 'FAILED', response = $9, reason = $10, finished_at = now(),
        time_taken_ms = round(extract(epoch FROM now() - started_at) * 1000)::bigint
    WHERE service_request_id = $1 AND step_id = $2 AND status = 'STARTED'
      AND EXISTS (SELECT 1 FROM expired)
)
SELECT count(*) FROM expired;

-- deadlines::PAST_DEADLINE
SELECT s.id, s.current_step_id, s.step_attempts, s.workflow_name,
       coalesce(s.workflow_version, 1)
FROM service_requests s
WHERE s.deadline < now() AND s.failed_step_id IS NULL
  AND s.status IN ('NEW', 'IN_PROGRESS', 'PAUSED', 'RESUMED')
  AND (s.status = 'PAUSED' OR (s.lease_owner IS NULL AND s.lease_until > now() AND s.lease_until < 'infinity'))
ORDER BY s.deadline LIMIT $1;

-- deadlines::END
WITH RECURSIVE ended AS (
    UPDATE service_requests s SET status = 'RESUMED', current_step_id = $3,
        step_request = CASE
            WHEN EXISTS (SELECT 1 FROM steps_status x WHERE x.service_request_id = $1
                         AND x.step_id = $2 AND x.status = 'STARTED')
            THEN (SELECT NULLIF(request, '') FROM steps_status x
                  WHERE x.service_request_id = $1 AND x.step_id = $2
                  ORDER BY x.id DESC LIMIT 1)
            ELSE s.step_request END,
        failed_step_id = $2, reason = $4, updated_at = now(),
        step_attempts = 0, last_error = NULL, wait_event = NULL, wait_key = NULL,
        wait_next = NULL, lease_owner = NULL, lease_until = '-infinity'
    WHERE s.id = $1 AND s.current_step_id = $2 AND s.deadline < now() AND s.failed_step_id IS NULL
  AND s.status IN ('NEW', 'IN_PROGRESS', 'PAUSED', 'RESUMED')
  AND (s.status = 'PAUSED' OR (s.lease_owner IS NULL AND s.lease_until > now() AND s.lease_until < 'infinity'))
    RETURNING s.id
), recorded AS (
    UPDATE steps_status SET status = 'FAILED', response = $5, reason = $6, finished_at = now(),
        time_taken_ms = round(extract(epoch FROM now() - started_at) * 1000)::bigint
    WHERE service_request_id = $1 AND step_id = $2 AND status = 'STARTED'
      AND EXISTS (SELECT 1 FROM ended)
    RETURNING 1
), noted AS (
    INSERT INTO steps_status (service_request_id, step_id, step_name, status, request, response,
                              started_at, finished_at, time_taken_ms, reason, attempts)
    SELECT s.id, $2, $7, 'FAILED', coalesce(s.step_request, ''), $5, now(), now(), 0, $6,
        greatest(s.step_attempts, 1)
    FROM service_requests s
    WHERE s.id = $1 AND $2 > 0 AND EXISTS (SELECT 1 FROM ended)
      AND NOT EXISTS (SELECT 1 FROM recorded)
), tree AS (
    SELECT c.id FROM service_requests c
    WHERE c.parent_id = $1 AND c.parent_step_id = $2 AND EXISTS (SELECT 1 FROM ended)
    UNION ALL
    SELECT g.id FROM service_requests g JOIN tree t ON g.parent_id = t.id
    WHERE g.parent_id IS NOT NULL
), cancelled AS (
    UPDATE service_requests c SET status = 'CANCELLED', reason = 'its parent''s deadline passed',
        finished_at = now(), parent_told = true,
       lease_owner = NULL, lease_until = '-infinity', updated_at = now()
    WHERE c.id IN (SELECT id FROM tree) AND c.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
    RETURNING 1
), joined AS (
    UPDATE fan_joins SET done = true
    WHERE parent_id = $1 AND step_id = $2 AND NOT done AND EXISTS (SELECT 1 FROM ended)
    RETURNING 1
)
SELECT (SELECT count(*) FROM ended), (SELECT count(*) FROM cancelled),
       (SELECT count(*) FROM joined);

-- deadlines::TIMERS
WITH due AS (
    SELECT min(lease_until) AS at FROM service_requests
    WHERE (status IN ('NEW', 'IN_PROGRESS',
        'RESUMED') OR (status = 'PAUSED' AND lease_until > '-infinity'::timestamptz) OR lease_owner = '00000000-0000-0000-0000-000000000000'::uuid) AND lease_until > '-infinity' AND lease_until <= now()
)
SELECT (SELECT count(*) FROM service_requests
        WHERE (status IN ('NEW', 'IN_PROGRESS',
            'RESUMED') OR (status = 'PAUSED' AND lease_until > '-infinity'::timestamptz) OR lease_owner = '00000000-0000-0000-0000-000000000000'::uuid) AND lease_until > now() AND lease_until < 'infinity'),
       coalesce(extract(epoch FROM now() - (SELECT min(at) FROM due)) * 1000, 0)::float8;

-- audit::RECORD
INSERT INTO audit_log (actor, action, target, outcome) VALUES ($1, $2, $3, $4);

-- audit::LIST
SELECT id, to_json(at) #>> '{}', actor, action, target, outcome
    FROM audit_log
    WHERE $1::bigint = 0 OR id < $1
    ORDER BY id DESC
    LIMIT $2;

-- sessions::CREATE
INSERT INTO console_sessions (id_hash, token_digest) VALUES ($1, $2);

-- sessions::TOUCH
UPDATE console_sessions SET seen_at = now()
    WHERE id_hash = $1 AND seen_at > now() - $2::float8 * interval '1 millisecond' AND created_at > now() - $3::float8 * interval '1 millisecond'
    RETURNING token_digest;

-- sessions::END
DELETE FROM console_sessions WHERE id_hash = $1;

-- housekeeping::AUDIT
DELETE
    FROM audit_log
    WHERE id IN (SELECT id
        FROM audit_log
        WHERE at < now() - $1::float8 * interval '1 millisecond'
        ORDER BY id
        LIMIT $2);

-- housekeeping::DEAD_LETTERS
DELETE
    FROM dead_letters
    WHERE id IN (SELECT id
        FROM dead_letters
        WHERE created_at < now() - $1::float8 * interval '1 millisecond'
        ORDER BY id
        LIMIT $2);

-- housekeeping::NOTIFICATIONS
DELETE
    FROM notifications
    WHERE id IN (SELECT id
        FROM notifications
        WHERE state <> 'pending' AND finished_at < now() - $1::float8 * interval '1 millisecond'
        ORDER BY id
        LIMIT $2);

-- housekeeping::SESSIONS
DELETE
    FROM console_sessions
    WHERE id_hash IN (SELECT id_hash
        FROM console_sessions
        WHERE seen_at < now() - $1::float8 * interval '1 millisecond' OR created_at < now() - $2::float8 * interval '1 millisecond'
        LIMIT $3);

-- events::LOCK
SELECT pg_advisory_xact_lock(hashtext($1::text), hashtext($2::text));

-- events::KEPT
SELECT e.payload, e.id
    FROM events e
    WHERE e.event = $1 AND e.key = $2 AND e.keep_until > now() AND NOT EXISTS (SELECT 1
        FROM event_takes t
        WHERE t.service_request_id = $3 AND t.event = e.event AND t.event_id = e.id AND t.step_id <> $4)
    ORDER BY e.received_at DESC
    LIMIT 1;

-- events::PAUSE
WITH fenced AS (
    UPDATE service_requests s SET status = 'PAUSED', current_step_id = $2,
        wait_event = $4, wait_key = $5, wait_next = $10, lease_owner = NULL,
        lease_until = CASE WHEN $9::float8 IS NULL THEN '-infinity'::timestamptz ELSE now() + $9::float8 * interval '1 millisecond' END,
        step_attempts = CASE WHEN $9::float8 IS NULL THEN 0 ELSE 1 END, last_error = NULL,
        updated_at = now()
    WHERE s.id = $1 AND s.lease_owner = $3
    RETURNING s.id
)
INSERT INTO steps_status (service_request_id, step_id, step_name, status, request, started_at,
    attempts)
SELECT id, $2, $6, 'STARTED', $7, to_timestamp($8::float8 / 1000.0), 1 FROM fenced
RETURNING 1;

-- events::DELIVER
WITH fresh AS (
    INSERT INTO events (event, id, key, payload, traceparent, keep_until)
    VALUES ($1, $2, $3, $4, $5, now() + $6::float8 * interval '1 millisecond')
    ON CONFLICT (event, id) DO NOTHING
    RETURNING to_json(keep_until) #>> '{}' AS keep_until
), locked AS (
    SELECT w.id, w.current_step_id AS step FROM service_requests w
    WHERE w.status = 'PAUSED' AND w.wait_event = $1 AND w.wait_key = $3
      AND EXISTS (SELECT 1 FROM fresh)
    FOR UPDATE
), waiting AS (
    -- Numbered apart from the lock: FOR UPDATE takes no window function.
    SELECT id, step, row_number() OVER (ORDER BY id) <= $8 AS leased FROM locked
), resumed AS (
    UPDATE service_requests s SET status = 'RESUMED', current_step_id = coalesce(s.wait_next, 0),
        step_request = $4,
        wait_event = NULL, wait_key = NULL, wait_next = NULL, step_attempts = 0,
        last_error = NULL, updated_at = now(),
        lease_owner = CASE WHEN w.leased THEN $7::uuid END,
        lease_until = CASE WHEN w.leased THEN now() + $9::float8 * interval '1 millisecond' ELSE '-infinity'::timestamptz END
    FROM waiting w WHERE s.id = w.id
    RETURNING w.step, w.leased, s.id, s.workflow_name, s.status, s.payload, s.headers,
        s.current_step_id, s.step_request, s.failed_step_id, s.reason, s.step_attempts,
        (extract(epoch
        FROM s.created_at) * 1000000)::bigint AS created_us,
            coalesce(s.workflow_version, 1) AS version, s.parent_id, s.retries,
            CASE WHEN s.failed_step_id IS NULL THEN extract(epoch
        FROM s.deadline - now())::float8 * 1000 END AS deadline_in_ms, s.priority
), took AS (
    INSERT INTO event_takes (service_request_id, step_id, event, event_id)
    SELECT r.id, r.step, $1, $2 FROM resumed r
    ON CONFLICT DO NOTHING
), answered AS (
    UPDATE steps_status st SET status = 'COMPLETED', response = $4, finished_at = now(),
        time_taken_ms = round(extract(epoch FROM now() - st.started_at) * 1000)::bigint
    FROM resumed r
    WHERE st.service_request_id = r.id AND st.step_id = r.step AND st.status = 'STARTED'
)
SELECT f.keep_until, r.step, r.leased, r.id, r.workflow_name, r.status,
       CASE WHEN r.leased THEN r.payload END,
       CASE WHEN r.leased OR r.headers LIKE '%"traceparent"%' THEN r.headers END,
       r.current_step_id, CASE WHEN r.leased THEN r.step_request END, r.failed_step_id,
       r.reason, r.step_attempts, r.created_us, r.version, r.parent_id, r.retries,
       r.deadline_in_ms, r.priority
FROM fresh f LEFT JOIN resumed r ON true;

-- events::FORGET
DELETE
    FROM events
    WHERE ctid IN (SELECT ctid
        FROM events
        WHERE keep_until < now() - $1::float8 * interval '1 millisecond'
        LIMIT $2);

-- events::TAKE
INSERT INTO event_takes (service_request_id, step_id, event, event_id)
    VALUES ($1, $2, $3, $4)
    ON CONFLICT DO NOTHING;

-- notifications::CLAIM
WITH cand AS (
    SELECT n.id, n.service_request_id FROM notifications n
    WHERE n.state = 'pending' AND n.next_at <= now()
    ORDER BY n.next_at, n.id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), due AS (
    SELECT c.id FROM cand c
    WHERE c.id = (SELECT min(e.id) FROM notifications e
                  WHERE e.service_request_id = c.service_request_id
                    AND e.state NOT IN ('delivered', 'failed'))
)
UPDATE notifications x SET next_at = now() + $2::float8 * interval '1 millisecond',
                           attempts = x.attempts + 1
FROM due WHERE x.id = due.id
RETURNING x.id, x.service_request_id, x.workflow_name, x.workflow_version, x.status, x.reason,
          x.attempts, to_json(x.finished_at) #>> '{}',
          (SELECT to_json(r.created_at) #>> '{}' FROM service_requests r
           WHERE r.id = x.service_request_id),
          (SELECT r.labels FROM service_requests r WHERE r.id = x.service_request_id),
          (SELECT s.response FROM steps_status s
           WHERE s.service_request_id = x.service_request_id AND s.step_id > 0
           ORDER BY s.id DESC LIMIT 1);

-- notifications::DELIVERED
UPDATE notifications SET state = 'delivered', delivered_at = now(), last_error = NULL
WHERE id = ANY($1);

-- notifications::AGAIN
UPDATE notifications SET next_at = now() + $2::float8 * interval '1 millisecond',
                         last_error = $3
WHERE id = $1;

-- notifications::FAILED
UPDATE notifications SET state = 'failed', last_error = $2 WHERE id = $1;

-- notifications::OF_REQUEST
SELECT id, status, state, attempts, last_error, to_json(finished_at) #>> '{}',
       to_json(delivered_at) #>> '{}'
FROM notifications WHERE service_request_id = $1 ORDER BY id LIMIT 100;

-- pauses::LIST
SELECT workflow_name, to_json(paused_at) #>> '{}', paused_by FROM workflow_pauses
ORDER BY workflow_name;

-- pauses::GET
SELECT workflow_name, to_json(paused_at) #>> '{}', paused_by FROM workflow_pauses
WHERE workflow_name = $1;

-- pauses::PAUSE
WITH made AS (
    INSERT INTO workflow_pauses (workflow_name, paused_by) VALUES ($1, $2)
    ON CONFLICT (workflow_name) DO NOTHING
    RETURNING workflow_name, paused_at, paused_by
)
SELECT workflow_name, to_json(paused_at) #>> '{}', paused_by FROM made
UNION ALL
SELECT workflow_name, to_json(paused_at) #>> '{}', paused_by FROM workflow_pauses
WHERE workflow_name = $1 AND NOT EXISTS (SELECT 1 FROM made);

-- pauses::UNPAUSE
DELETE FROM workflow_pauses WHERE workflow_name = $1;

-- pauses::FREE
UPDATE service_requests SET lease_owner = NULL, lease_until = '-infinity'
WHERE workflow_name = $1 AND lease_owner = '00000000-0000-0000-0000-000000000000'::uuid AND (CASE WHEN lease_owner = '00000000-0000-0000-0000-000000000000'::uuid THEN 2000000000000::float8 + date_part('epoch',
    created_at - '1970-01-01 00:00:00+00'::timestamptz) WHEN status = 'PAUSED' THEN CASE WHEN lease_until = 'infinity'::timestamptz OR lease_until = '-infinity'::timestamptz THEN 'Infinity'::float8 ELSE 1000000000000::float8 + date_part('epoch',
    lease_until - '1970-01-01 00:00:00+00'::timestamptz) END WHEN lease_until = '-infinity'::timestamptz THEN date_part('epoch',
    created_at - '1970-01-01 00:00:00+00'::timestamptz) - coalesce(priority,
    5)::float8 * 10000000000::float8 WHEN lease_until = 'infinity'::timestamptz THEN 'Infinity'::float8 ELSE date_part('epoch',
        lease_until - '1970-01-01 00:00:00+00'::timestamptz) + (9 - coalesce(priority,
            5))::float8 * 10000000000::float8 END) >= 2000000000000::float8 AND (CASE WHEN lease_owner = '00000000-0000-0000-0000-000000000000'::uuid THEN 2000000000000::float8 + date_part('epoch',
    created_at - '1970-01-01 00:00:00+00'::timestamptz) WHEN status = 'PAUSED' THEN CASE WHEN lease_until = 'infinity'::timestamptz OR lease_until = '-infinity'::timestamptz THEN 'Infinity'::float8 ELSE 1000000000000::float8 + date_part('epoch',
    lease_until - '1970-01-01 00:00:00+00'::timestamptz) END WHEN lease_until = '-infinity'::timestamptz THEN date_part('epoch',
    created_at - '1970-01-01 00:00:00+00'::timestamptz) - coalesce(priority,
    5)::float8 * 10000000000::float8 WHEN lease_until = 'infinity'::timestamptz THEN 'Infinity'::float8 ELSE date_part('epoch',
        lease_until - '1970-01-01 00:00:00+00'::timestamptz) + (9 - coalesce(priority,
            5))::float8 * 10000000000::float8 END) < 'Infinity'::float8;

-- pauses::PARK
WITH p AS (
    SELECT 1 FROM workflow_pauses WHERE workflow_name = $3 FOR KEY SHARE
), parked AS (
    UPDATE service_requests SET lease_owner = '00000000-0000-0000-0000-000000000000'::uuid,
                                lease_until = '9999-12-31 00:00:00+00'
    WHERE id = $1 AND lease_owner = $2 AND EXISTS (SELECT 1 FROM p)
    RETURNING 1
)
SELECT (SELECT count(*) FROM p), (SELECT count(*) FROM parked);

-- pauses::PARKED_COUNTS
SELECT workflow_name, count(*)
    FROM service_requests
    WHERE lease_owner = '00000000-0000-0000-0000-000000000000'::uuid AND (CASE WHEN lease_owner = '00000000-0000-0000-0000-000000000000'::uuid THEN 2000000000000::float8 + date_part('epoch',
        created_at - '1970-01-01 00:00:00+00'::timestamptz) WHEN status = 'PAUSED' THEN CASE WHEN lease_until = 'infinity'::timestamptz OR lease_until = '-infinity'::timestamptz THEN 'Infinity'::float8 ELSE 1000000000000::float8 + date_part('epoch',
        lease_until - '1970-01-01 00:00:00+00'::timestamptz) END WHEN lease_until = '-infinity'::timestamptz THEN date_part('epoch',
        created_at - '1970-01-01 00:00:00+00'::timestamptz) - coalesce(priority,
        5)::float8 * 10000000000::float8 WHEN lease_until = 'infinity'::timestamptz THEN 'Infinity'::float8 ELSE date_part('epoch',
            lease_until - '1970-01-01 00:00:00+00'::timestamptz) + (9 - coalesce(priority,
                5))::float8 * 10000000000::float8 END) >= 2000000000000::float8 AND (CASE WHEN lease_owner = '00000000-0000-0000-0000-000000000000'::uuid THEN 2000000000000::float8 + date_part('epoch',
        created_at - '1970-01-01 00:00:00+00'::timestamptz) WHEN status = 'PAUSED' THEN CASE WHEN lease_until = 'infinity'::timestamptz OR lease_until = '-infinity'::timestamptz THEN 'Infinity'::float8 ELSE 1000000000000::float8 + date_part('epoch',
        lease_until - '1970-01-01 00:00:00+00'::timestamptz) END WHEN lease_until = '-infinity'::timestamptz THEN date_part('epoch',
        created_at - '1970-01-01 00:00:00+00'::timestamptz) - coalesce(priority,
        5)::float8 * 10000000000::float8 WHEN lease_until = 'infinity'::timestamptz THEN 'Infinity'::float8 ELSE date_part('epoch',
            lease_until - '1970-01-01 00:00:00+00'::timestamptz) + (9 - coalesce(priority,
                5))::float8 * 10000000000::float8 END) < 'Infinity'::float8
    GROUP BY workflow_name;

-- triggers::INSERT
INSERT INTO triggers (name, definition, paused) VALUES ($1, $2, $3)
RETURNING definition, paused, created_at, updated_at;

-- triggers::GET
SELECT definition, paused, created_at, updated_at FROM triggers WHERE name = $1;

-- triggers::LIST
SELECT definition, paused, created_at, updated_at FROM triggers ORDER BY name LIMIT $1;

-- triggers::PUT
UPDATE triggers SET definition = $2, paused = coalesce($3, paused), updated_at = now()
WHERE name = $1
RETURNING definition, paused, created_at, updated_at;

-- triggers::DELETE
DELETE FROM triggers WHERE name = $1;

-- triggers::SET_PAUSED
UPDATE triggers SET paused = $2, updated_at = now() WHERE name = $1
RETURNING definition, paused, created_at, updated_at;

-- schedules::INSERT
INSERT INTO schedules (name, definition, paused, next_fire_at)
VALUES ($1, $2, $3, CASE WHEN $3 THEN NULL ELSE $4::timestamptz END)
RETURNING definition, paused, next_fire_at, created_at, updated_at;

-- schedules::NOW
SELECT now();

-- schedules::GET
SELECT definition, paused, next_fire_at, created_at, updated_at, now()
FROM schedules WHERE name = $1;

-- schedules::LIST
SELECT definition, paused, next_fire_at, created_at, updated_at
FROM schedules ORDER BY name LIMIT $1;

-- schedules::PUT
UPDATE schedules SET definition = $2, paused = coalesce($3, paused),
       next_fire_at = CASE WHEN coalesce($3, paused) THEN NULL ELSE $4::timestamptz END,
       updated_at = now()
WHERE name = $1
RETURNING definition, paused, next_fire_at, created_at, updated_at;

-- schedules::DELETE
DELETE FROM schedules WHERE name = $1;

-- schedules::PAUSE
UPDATE schedules SET paused = true, next_fire_at = NULL WHERE name = $1;

-- schedules::RESUME
UPDATE schedules SET paused = false, next_fire_at = $2 WHERE name = $1 AND paused;

-- schedules::LAST_FIRES
SELECT f.fire_at, f.service_request_id,
    CASE WHEN r.status = 'NEW' AND (r.current_step_id > 0 OR (r.lease_until > now() AND r.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN r.status = 'PAUSED' AND EXISTS (SELECT 1
    FROM service_requests fc
    WHERE fc.parent_id = r.id AND fc.parent_step_id = r.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
        'IN_PROGRESS',
        'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE r.status END,
        f.skipped
FROM schedule_fires f LEFT JOIN service_requests r ON r.id = f.service_request_id
WHERE f.schedule = $1 ORDER BY f.fire_at DESC LIMIT $2;

-- schedules::LAST_FIRES_OF
SELECT f.schedule, f.fire_at, f.service_request_id,
    CASE WHEN r.status = 'NEW' AND (r.current_step_id > 0 OR (r.lease_until > now() AND r.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN r.status = 'PAUSED' AND EXISTS (SELECT 1
    FROM service_requests fc
    WHERE fc.parent_id = r.id AND fc.parent_step_id = r.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
        'IN_PROGRESS',
        'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE r.status END,
        f.skipped
FROM unnest($1::text[]) AS n(name)
CROSS JOIN LATERAL (SELECT * FROM schedule_fires
                    WHERE schedule = n.name ORDER BY fire_at DESC LIMIT $2) f
LEFT JOIN service_requests r ON r.id = f.service_request_id
ORDER BY f.schedule, f.fire_at DESC;

-- schedules::DUE
SELECT name, definition, next_fire_at, now() FROM schedules
WHERE NOT paused AND next_fire_at <= now()
ORDER BY next_fire_at
LIMIT $1
FOR UPDATE SKIP LOCKED;

-- schedules::SET_NEXT
UPDATE schedules SET next_fire_at = $2 WHERE name = $1;

-- schedules::FIRE
WITH s AS (
    SELECT name FROM schedules WHERE name = $1 FOR KEY SHARE
), prev AS (
    SELECT r.status FROM (
        SELECT f.service_request_id AS id FROM schedule_fires f
        WHERE f.schedule = $1 AND f.service_request_id IS NOT NULL
        ORDER BY f.fire_at DESC LIMIT 1) l
    LEFT JOIN service_requests r ON r.id = l.id
), busy AS (
    SELECT $8::bool AND EXISTS (
        SELECT 1 FROM prev WHERE status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')) AS b
), fire AS (
    INSERT INTO schedule_fires (schedule, fire_at, service_request_id, skipped)
    SELECT s.name, $2, CASE WHEN busy.b THEN NULL ELSE $3::uuid END,
           CASE WHEN busy.b THEN 'overlap' END
    FROM s, busy
    ON CONFLICT DO NOTHING
    RETURNING service_request_id
), req AS (
    INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner,
                                  lease_until, created_at, workflow_version,
                                  concurrency_key, priority, notify)
    SELECT fire.service_request_id, $4, $5, '[]', NULL,
           CASE WHEN $9::text IS NULL THEN '-infinity'::timestamptz
                ELSE 'infinity'::timestamptz END, $6,
                    NULLIF(CASE WHEN $7::int > 0 THEN $7::int ELSE coalesce((SELECT w.version
                    FROM workflows w
                    WHERE w.name = $4), 1) END, 1), $9, $10, $11::smallint
    FROM fire WHERE fire.service_request_id IS NOT NULL
    RETURNING id, workflow_name, concurrency_key, status, lease_until, priority
), slots_gone AS (DELETE
    FROM concurrency_slots q
    WHERE q.id = ANY (ARRAY(SELECT f.id
        FROM req f
        WHERE f.concurrency_key IS NOT NULL AND concurrency_slot_state(f.status,
            f.lease_until) = 0))),
            slots_kept AS (INSERT INTO concurrency_slots (id, workflow_name, concurrency_key,
                queued, rank) SELECT f.id,
                f.workflow_name, f.concurrency_key,
                concurrency_slot_state(f.status, f.lease_until) = 1, -coalesce(f.priority, 5)
    FROM req f
    WHERE f.concurrency_key IS NOT NULL AND concurrency_slot_state(f.status, f.lease_until) > 0
    ON CONFLICT (id) DO UPDATE SET queued = excluded.queued, rank = excluded.rank)
SELECT (SELECT count(*) FROM fire), (SELECT count(*) FROM req);

-- schedules::FIRE_AT
SELECT service_request_id FROM schedule_fires WHERE schedule = $1 AND fire_at = $2;

-- schedules::PRUNE
DELETE FROM schedule_fires f
USING schedules s,
      LATERAL (SELECT fire_at FROM schedule_fires
               WHERE schedule = s.name ORDER BY fire_at DESC OFFSET $1 LIMIT 1) cut
WHERE f.schedule = s.name AND f.fire_at <= cut.fire_at
  AND f.fire_at < now() - interval '1 hour';

-- partitions::TRY_LOCK
SELECT pg_try_advisory_lock($1);

-- partitions::LAYOUT
SELECT (SELECT relkind
    FROM pg_class
    WHERE oid = to_regclass('service_requests')) = 'p', (extract(epoch FROM now()) * 1000)::float8;

-- partitions::LIST
SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'service_requests'::regclass;

-- partitions::ADD
SELECT clamp_add_partitions($1, $2, $3);

-- partitions::INSERTED
SELECT coalesce((SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = $1), 0);

-- keeper::UNLOCK
SELECT pg_advisory_unlock($1);

-- retention::STILL_OPEN
SELECT count(*)
    FROM unnest($1::uuid[]) AS u(id)
    JOIN service_requests s ON s.id = u.id
    WHERE s.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED');

-- keeper::OVERRIDES
SELECT name, (definition->'retention')::text FROM workflows WHERE definition ? 'retention';

-- keeper::BOUNDS
SELECT conrelid::regclass::text, pg_get_constraintdef(oid), convalidated
    FROM pg_constraint
    WHERE conname = 'clamp_p0_bound';

-- keeper::HEAP_BYTES
SELECT coalesce(sum(pg_relation_size(to_regclass(t))), 0)::bigint
    FROM unnest(ARRAY['service_requests', 'steps_status', 'fan_joins', 'event_takes']) t;

-- keeper::SWAP
SELECT clamp_partition_existing($1);

-- keeper::SESSION_TIMEOUT
SET statement_timeout = '10min';

-- keeper::SESSION_SEQSCAN
SET enable_seqscan = on;

-- keeper::SWAP_LOCK_TIMEOUT
SET LOCAL lock_timeout = '2s';

-- keeper::LOCK_TIMEOUT
SET lock_timeout = '1s';

-- keeper::STARTUP_LOCK_TIMEOUT
SET lock_timeout = '10s';

-- keeper::LOCK
SELECT pg_advisory_lock($1)::text;

-- keeper::RESET_LOCK_TIMEOUT
RESET lock_timeout;

-- keeper::RESET_STATEMENT_TIMEOUT
RESET statement_timeout;

-- status::GET_HEADS
SELECT r.id, r.workflow_name, coalesce(r.workflow_version, 1) AS workflow_version,
    CASE WHEN r.status = 'NEW' AND (r.current_step_id > 0 OR (r.lease_until > now() AND r.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' ELSE r.status END AS status,
        r.current_step_id,
    r.reason, to_json(r.created_at) #>> '{}' AS created_at, extract(epoch
    FROM r.finished_at)::float8 * 1000 AS request_finished_ms, r.step_attempts, r.last_error,
        r.retries, r.rerun_of, r.parent_id, r.fan_index,
        CASE WHEN r.lease_owner IS NULL AND r.lease_until > now() THEN to_json(r.lease_until) #>> '{}' END AS retry_at,
            to_json(r.start_at) #>> '{}' AS start_at,
        r.wait_event, r.wait_key, to_json(r.deadline) #>> '{}' AS deadline,
        CASE WHEN r.lease_until = 'infinity' AND r.status = 'NEW' THEN r.concurrency_key END AS concurrency_key,
            r.priority
    FROM (SELECT DISTINCT unnest($1::uuid[])) AS u(id)
    JOIN service_requests r ON r.id = u.id;

-- status::GET_WHOLE
SELECT r.id, r.workflow_name, coalesce(r.workflow_version, 1) AS workflow_version,
    CASE WHEN r.status = 'NEW' AND (r.current_step_id > 0 OR (r.lease_until > now() AND r.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' ELSE r.status END AS status,
        r.current_step_id,
    r.reason, to_json(r.created_at) #>> '{}' AS created_at, extract(epoch
    FROM r.finished_at)::float8 * 1000 AS request_finished_ms, r.step_attempts, r.last_error,
        r.retries, r.rerun_of, r.parent_id, r.fan_index,
        CASE WHEN r.lease_owner IS NULL AND r.lease_until > now() THEN to_json(r.lease_until) #>> '{}' END AS retry_at,
            to_json(r.start_at) #>> '{}' AS start_at,
        r.wait_event, r.wait_key, to_json(r.deadline) #>> '{}' AS deadline,
        CASE WHEN r.lease_until = 'infinity' AND r.status = 'NEW' THEN r.concurrency_key END AS concurrency_key,
            r.priority,
        st.step_id, st.step_name, st.status AS step_status,
        CASE WHEN st.request = '' THEN r.payload ELSE st.request END AS request, st.response,
        st.time_taken_ms, st.attempts, st.reason AS step_reason, st.child_id, extract(epoch
    FROM st.started_at)::float8 * 1000 AS started_ms, extract(epoch
    FROM st.finished_at)::float8 * 1000 AS finished_ms
    FROM (SELECT DISTINCT unnest($1::uuid[])) AS u(id)
    JOIN service_requests r ON r.id = u.id
    LEFT JOIN steps_status st ON st.service_request_id = r.id
    ORDER BY r.id, st.id;

-- status::PROCEEDING
SELECT DISTINCT c.parent_id
    FROM service_requests c
    JOIN service_requests p ON p.id = c.parent_id AND p.current_step_id = c.parent_step_id
    WHERE c.parent_id = ANY($1) AND c.fan_index IS NOT NULL AND c.status IN ('NEW', 'IN_PROGRESS',
        'RESUMED') AND c.lease_until <> 'infinity';

-- status::SLOT_AHEAD
SELECT count(*)
    FROM concurrency_slots q
    WHERE q.workflow_name = $1 AND q.concurrency_key = $2 AND q.queued AND (q.rank,
        q.id) < (-$4::int, $3::uuid);

-- queries::INSERT_WORKFLOW
WITH w AS (
                INSERT INTO workflows (id, name, description, enabled, definition, version)
                VALUES ($1, $2, $3, $4,
                    $5::jsonb || jsonb_build_object('created_at', now(), 'updated_at', now()), 1)
                RETURNING name, description, definition, created_at)
             INSERT INTO workflow_versions (name, version, description, definition, created_at)
             SELECT name, 1, description, definition, created_at FROM w
             RETURNING definition ->> 'created_at';

-- queries::PUT_WORKFLOW
WITH cur AS (
            SELECT name, version, definition FROM workflows WHERE name = $1 FOR UPDATE
        ), next AS (
            UPDATE workflows w SET version = w.version + 1, description = $2, enabled = $3,
                   updated_at = now(),
                   definition = $4::jsonb - ARRAY['id', 'version', 'created_at', 'updated_at']
                       || jsonb_build_object('id', w.id, 'version', w.version + 1,
                                             'created_at', w.created_at, 'updated_at', now())
            FROM cur
            WHERE w.name = cur.name
              AND (cur.definition - ARRAY['id', 'version', 'created_at', 'updated_at']) IS DISTINCT
                  FROM ($4::jsonb - ARRAY['id', 'version', 'created_at', 'updated_at'])
            RETURNING w.name, w.version, w.description, w.definition
        ), kept AS (
            INSERT INTO workflow_versions (name, version, description, definition)
            SELECT name, version, description, definition FROM next
        )
        SELECT (SELECT definition FROM next), (SELECT definition FROM cur);

-- queries::WORKFLOW_VERSION
SELECT definition || jsonb_build_object('version', version)
    FROM workflow_versions
    WHERE name = $1 AND version = $2;

-- queries::WORKFLOW_VERSIONS
SELECT version, to_json(created_at) #>> '{}', description
    FROM workflow_versions
    WHERE name = $1
    ORDER BY version;

-- queries::DEFINITION
SELECT definition FROM workflows WHERE name = $1;

-- queries::ALL_WORKFLOWS
SELECT definition FROM workflows ORDER BY created_at;

-- queries::COUNT_WORKFLOWS
SELECT count(*) FROM workflows;

-- queries::REQUESTS_PAGE
SELECT s.id, s.workflow_name,
    CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
    FROM service_requests fc
    WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
        'IN_PROGRESS',
        'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END AS status,
        to_json(s.created_at) #>> '{}' AS created_at, s.payload, s.current_step_id, s.reason,
        s.labels
    FROM service_requests s
    WHERE s.workflow_name = $1
    ORDER BY s.id DESC
    LIMIT $2 OFFSET $3;

-- search::SEARCH_ALL
SELECT s.id, s.workflow_name,
    CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
    FROM service_requests fc
    WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
        'IN_PROGRESS',
        'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END AS status,
        to_json(s.created_at) #>> '{}' AS created_at, s.payload, s.current_step_id, s.reason,
        s.labels
    FROM service_requests s
    WHERE s.id >= $1 AND s.id < $2 AND ($3::text[] IS NULL OR CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
        FROM service_requests fc
        WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
            'IN_PROGRESS',
            'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END = ANY($3)) AND ($4::timestamptz IS NULL OR s.created_at > $4) AND ($5::timestamptz IS NULL OR s.created_at < $5)
    ORDER BY s.id DESC
    LIMIT $6;

-- search::SEARCH_WORKFLOW
SELECT s.id, s.workflow_name,
    CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
    FROM service_requests fc
    WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
        'IN_PROGRESS',
        'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END AS status,
        to_json(s.created_at) #>> '{}' AS created_at, s.payload, s.current_step_id, s.reason,
        s.labels
    FROM service_requests s
    WHERE s.workflow_name = $7 AND s.id >= $1 AND s.id < $2 AND ($3::text[] IS NULL OR CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
        FROM service_requests fc
        WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
            'IN_PROGRESS',
            'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END = ANY($3)) AND ($4::timestamptz IS NULL OR s.created_at > $4) AND ($5::timestamptz IS NULL OR s.created_at < $5)
    ORDER BY s.id DESC
    LIMIT $6;

-- search::SEARCH_SETTLED_BADLY
SELECT s.id, s.workflow_name,
    CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
    FROM service_requests fc
    WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
        'IN_PROGRESS',
        'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END AS status,
        to_json(s.created_at) #>> '{}' AS created_at, s.payload, s.current_step_id, s.reason,
        s.labels
    FROM service_requests s
    WHERE s.status IN ('FAILED',
        'CANCELLED') AND s.id >= $1 AND s.id < $2 AND ($3::text[] IS NULL OR CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
        FROM service_requests fc
        WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
            'IN_PROGRESS',
            'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END = ANY($3)) AND ($4::timestamptz IS NULL OR s.created_at > $4) AND ($5::timestamptz IS NULL OR s.created_at < $5)
    ORDER BY s.id DESC
    LIMIT $6;

-- search::SEARCH_SETTLED_BADLY_WORKFLOW
SELECT s.id, s.workflow_name,
    CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
    FROM service_requests fc
    WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
        'IN_PROGRESS',
        'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END AS status,
        to_json(s.created_at) #>> '{}' AS created_at, s.payload, s.current_step_id, s.reason,
        s.labels
    FROM service_requests s
    WHERE s.status IN ('FAILED',
        'CANCELLED') AND s.workflow_name = $7 AND s.id >= $1 AND s.id < $2 AND ($3::text[] IS NULL OR CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
        FROM service_requests fc
        WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
            'IN_PROGRESS',
            'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END = ANY($3)) AND ($4::timestamptz IS NULL OR s.created_at > $4) AND ($5::timestamptz IS NULL OR s.created_at < $5)
    ORDER BY s.id DESC
    LIMIT $6;

-- search::SEARCH_RERUNS
SELECT s.id, s.workflow_name,
    CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
    FROM service_requests fc
    WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
        'IN_PROGRESS',
        'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END AS status,
        to_json(s.created_at) #>> '{}' AS created_at, s.payload, s.current_step_id, s.reason,
        s.labels
    FROM service_requests s
    WHERE s.rerun_of = $8 AND ($7::text IS NULL OR s.workflow_name = $7) AND s.id >= $1 AND s.id < $2 AND ($3::text[] IS NULL OR CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
        FROM service_requests fc
        WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
            'IN_PROGRESS',
            'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END = ANY($3)) AND ($4::timestamptz IS NULL OR s.created_at > $4) AND ($5::timestamptz IS NULL OR s.created_at < $5)
    ORDER BY s.id DESC
    LIMIT $6;

-- search::SEARCH_AWAITING
SELECT s.id, s.workflow_name,
    CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
    FROM service_requests fc
    WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
        'IN_PROGRESS',
        'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END AS status,
        to_json(s.created_at) #>> '{}' AS created_at, s.payload, s.current_step_id, s.reason,
        s.labels
    FROM service_requests s
    WHERE s.status = 'PAUSED' AND s.wait_event = $8 AND ($9::text IS NULL OR s.wait_key = $9) AND ($7::text IS NULL OR s.workflow_name = $7) AND s.id >= $1 AND s.id < $2 AND ($3::text[] IS NULL OR CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
        FROM service_requests fc
        WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
            'IN_PROGRESS',
            'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END = ANY($3)) AND ($4::timestamptz IS NULL OR s.created_at > $4) AND ($5::timestamptz IS NULL OR s.created_at < $5)
    ORDER BY s.id DESC
    LIMIT $6;

-- search::SEARCH_LABELS_RECENT
SELECT s.id, s.workflow_name,
    CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
    FROM service_requests fc
    WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
        'IN_PROGRESS',
        'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END AS status,
        to_json(s.created_at) #>> '{}' AS created_at, s.payload, s.current_step_id, s.reason,
        s.labels
    FROM service_requests s
    WHERE s.labels @> $8::text[] AND ($7::text IS NULL OR s.workflow_name = $7) AND s.id >= coalesce((SELECT w.id
        FROM service_requests w
        WHERE w.id >= $1 AND w.id < $2
        ORDER BY w.id DESC OFFSET 2000 - 1
        LIMIT 1),
            $1) AND s.id >= $1 AND s.id < $2 AND ($3::text[] IS NULL OR CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
        FROM service_requests fc
        WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
            'IN_PROGRESS',
            'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END = ANY($3)) AND ($4::timestamptz IS NULL OR s.created_at > $4) AND ($5::timestamptz IS NULL OR s.created_at < $5)
    ORDER BY s.id DESC
    LIMIT $6;

-- search::SEARCH_LABELS
SELECT s.id, s.workflow_name,
    CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
    FROM service_requests fc
    WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
        'IN_PROGRESS',
        'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END AS status,
        to_json(s.created_at) #>> '{}' AS created_at, s.payload, s.current_step_id, s.reason,
        s.labels
    FROM service_requests s
    WHERE s.labels @> $8::text[] AND ($7::text IS NULL OR s.workflow_name = $7) AND s.id >= $1 AND s.id < $2 AND ($3::text[] IS NULL OR CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
        FROM service_requests fc
        WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
            'IN_PROGRESS',
            'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END = ANY($3)) AND ($4::timestamptz IS NULL OR s.created_at > $4) AND ($5::timestamptz IS NULL OR s.created_at < $5)
    ORDER BY uuid_send(s.id) DESC
    LIMIT $6;

-- search::SEARCH_WAITING_SLOT
SELECT s.id, s.workflow_name,
    CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
    FROM service_requests fc
    WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
        'IN_PROGRESS',
        'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END AS status,
        to_json(s.created_at) #>> '{}' AS created_at, s.payload, s.current_step_id, s.reason,
        s.labels
    FROM service_requests s
    WHERE s.id IN (SELECT q.id
        FROM concurrency_slots q
        WHERE q.queued AND q.id >= $1 AND q.id < $2 AND ($8::text IS NULL OR q.concurrency_key = $8) AND ($7::text IS NULL OR q.workflow_name = $7)) AND s.id >= $1 AND s.id < $2 AND ($3::text[] IS NULL OR CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
            FROM service_requests fc
            WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
                'IN_PROGRESS',
                'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END = ANY($3)) AND ($4::timestamptz IS NULL OR s.created_at > $4) AND ($5::timestamptz IS NULL OR s.created_at < $5)
    ORDER BY s.id DESC
    LIMIT $6;

-- stats::COUNTS
SELECT extract(epoch
    FROM date_trunc('minute', s.created_at))::bigint AS minute,
        CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR (s.lease_until > now() AND s.lease_owner <> '00000000-0000-0000-0000-000000000000'::uuid)) THEN 'IN_PROGRESS' WHEN s.status = 'PAUSED' AND EXISTS (SELECT 1
    FROM service_requests fc
    WHERE fc.parent_id = s.id AND fc.parent_step_id = s.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
        'IN_PROGRESS',
        'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE s.status END AS status,
        count(*)
    FROM service_requests s
    WHERE s.id >= $1 AND s.id < $2 AND s.created_at > $3 AND s.created_at < $4 AND ($5::text IS NULL OR s.workflow_name = $5)
    GROUP BY 1, 2
    ORDER BY 1, 2;

-- kafka_offsets::GET
SELECT next_offset FROM kafka_offsets WHERE topic = $1 AND partition = $2;

-- kafka_offsets::SET
INSERT INTO kafka_offsets (topic, partition, next_offset)
    VALUES ($1, $2, $3)
    ON CONFLICT (topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset,
        updated_at = now();

-- kafka_offsets::TRY_LOCK
SELECT pg_try_advisory_lock($1, $2);

-- kafka_offsets::UNLOCK
SELECT pg_advisory_unlock($1, $2);

-- kafka_offsets::JOIN
SELECT pg_advisory_lock_shared($1, -1);

-- kafka_offsets::MEMBERS
SELECT count(*)
    FROM pg_locks
    WHERE locktype = 'advisory' AND classid = ($1::int8 & 4294967295)::oid AND objid = 4294967295::oid AND objsubid = 2 AND granted;

-- dead_letters::INSERT
INSERT INTO dead_letters (source, topic, partition, record_offset, body, reason)
    VALUES ($1, $2, $3, $4, $5, $6);

-- connect::READ_ONLY
SHOW transaction_read_only;

-- pool::sql::EMPTY
;

-- pool::sql::PING
SELECT 1;

-- pool::sql::GENERIC_PLANS
SET plan_cache_mode = force_generic_plan;

-- pool::sql::BEGIN
BEGIN;

-- pool::sql::COMMIT
COMMIT;

-- migrate::MIGRATION_TIMEOUT
SET LOCAL statement_timeout = '15min';

-- migrate::LOCK
SELECT pg_advisory_xact_lock($1);

-- migrate::CREATE_LEDGER
CREATE TABLE IF NOT EXISTS schema_migrations (
            version integer PRIMARY KEY,
            applied_at timestamptz NOT NULL DEFAULT now());

-- migrate::APPLIED
SELECT version FROM schema_migrations;

-- migrate::RECORD
INSERT INTO schema_migrations (version) VALUES ($1);

-- buffer::set_statement_timeout
-- (a template, built per call: the parts in braces are filled in)
SET statement_timeout = {ms};

-- queries::workflows_page_sql
-- (a template, built per call: the parts in braces are filled in)
SELECT definition FROM workflows ORDER BY {order} LIMIT $1 OFFSET $2;

-- migrate::create_database
-- (a template, built per call: the parts in braces are filled in)
CREATE DATABASE "{name}";

-- retention::look_sql
-- (a template, built per call: the parts in braces are filled in)
SELECT count(*)::bigint,
    count(*) FILTER (WHERE s.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED'))::bigint,
       (extract(epoch
           FROM max(s.finished_at + (CASE WHEN a.wf IS NULL THEN d.ms ELSE a.ms END) * interval '1 millisecond')) * 1000)::float8,
       coalesce(bool_or(s.status IN ('COMPLETED', 'FAILED',
           'CANCELLED') AND (CASE WHEN a.wf IS NULL THEN d.ms ELSE a.ms END) IS NULL),
           false),
       (extract(epoch FROM now()) * 1000)::float8,
       (array_agg(s.id) FILTER (WHERE s.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')))[1:1000]
FROM service_requests_p{suffix} s
LEFT JOIN unnest($1::text[], $2::text[], $3::float8[]) a(wf, st, ms)
       ON a.wf = s.workflow_name AND a.st = s.status
LEFT JOIN unnest($4::text[], $5::float8[]) d(st, ms) ON d.st = s.status;

-- retention::export_sql
-- (a template, built per call: the parts in braces are filled in)
SELECT json_build_object('request', to_jsonb(s), 'steps', coalesce((SELECT jsonb_agg(to_jsonb(st)
    ORDER BY st.id)
    FROM steps_status_p{suffix} st
    WHERE st.service_request_id = s.id), '[]'::jsonb))::text
    FROM service_requests_p{suffix} s
    ORDER BY s.id;

-- retention::detach_sql
-- (a template, built per call: the parts in braces are filled in)
ALTER TABLE service_requests DETACH PARTITION service_requests_p{suffix} CONCURRENTLY;
ALTER TABLE steps_status DETACH PARTITION steps_status_p{suffix} CONCURRENTLY;
ALTER TABLE fan_joins DETACH PARTITION fan_joins_p{suffix} CONCURRENTLY;
ALTER TABLE event_takes DETACH PARTITION event_takes_p{suffix} CONCURRENTLY;

-- retention::detach_sql (finalize)
-- (a template, built per call: the parts in braces are filled in)
ALTER TABLE service_requests DETACH PARTITION service_requests_p{suffix} FINALIZE;
ALTER TABLE steps_status DETACH PARTITION steps_status_p{suffix} FINALIZE;
ALTER TABLE fan_joins DETACH PARTITION fan_joins_p{suffix} FINALIZE;
ALTER TABLE event_takes DETACH PARTITION event_takes_p{suffix} FINALIZE;

-- retention::attach_sql
-- (a template, built per call: the parts in braces are filled in)
ALTER TABLE service_requests ATTACH PARTITION service_requests_p{suffix} FOR
    VALUES
    FROM (MINVALUE) TO (MAXVALUE);
ALTER TABLE steps_status ATTACH PARTITION steps_status_p{suffix} FOR
    VALUES
    FROM (MINVALUE) TO (MAXVALUE);
ALTER TABLE fan_joins ATTACH PARTITION fan_joins_p{suffix} FOR VALUES FROM (MINVALUE) TO (MAXVALUE);
ALTER TABLE event_takes ATTACH PARTITION event_takes_p{suffix} FOR
    VALUES
    FROM (MINVALUE) TO (MAXVALUE);

-- retention::drop_sql
-- (a template, built per call: the parts in braces are filled in)
DROP TABLE IF EXISTS service_requests_p{suffix}, steps_status_p{suffix}, fan_joins_p{suffix},
    event_takes_p{suffix};

-- keeper::add_bound_sql
-- (a template, built per call: the parts in braces are filled in)
ALTER TABLE {table} ADD CONSTRAINT clamp_p0_bound CHECK ({key} < '{bound}') NOT VALID;

-- keeper::validate_bound_sql
-- (a template, built per call: the parts in braces are filled in)
ALTER TABLE {table} VALIDATE CONSTRAINT clamp_p0_bound;

-- keeper::drop_bound_sql
-- (a template, built per call: the parts in braces are filled in)
ALTER TABLE {table} DROP CONSTRAINT IF EXISTS clamp_p0_bound;

-- keeper::statement_timeout_sql
-- (a template, built per call: the parts in braces are filled in)
SET statement_timeout = {ms};
