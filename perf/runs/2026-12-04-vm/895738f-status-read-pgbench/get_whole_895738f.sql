\set n random(0, 19999)
SELECT r.id, r.workflow_name, coalesce(r.workflow_version, 1) AS workflow_version,
    CASE WHEN r.status = 'NEW' AND (r.current_step_id > 0 OR (r.lease_until > now() AND r.lease_owner IS NOT NULL)) THEN 'IN_PROGRESS' WHEN r.status = 'PAUSED' AND EXISTS (SELECT 1
    FROM service_requests fc
    WHERE fc.parent_id = r.id AND fc.parent_step_id = r.current_step_id AND fc.fan_index IS NOT NULL AND fc.status IN ('NEW',
        'IN_PROGRESS',
        'RESUMED') AND fc.lease_until <> 'infinity') THEN 'IN_PROGRESS' ELSE r.status END AS status,
        r.current_step_id, r.reason, to_json(r.created_at) #>> '{}' AS created_at, extract(epoch
    FROM r.finished_at)::float8 * 1000 AS request_finished_ms, r.step_attempts, r.last_error,
        r.retries, r.rerun_of, r.parent_id, r.fan_index,
        CASE WHEN r.lease_owner IS NULL AND r.lease_until > now() THEN to_json(r.lease_until) #>> '{}' END AS retry_at,
            to_json(r.start_at) #>> '{}' AS start_at,
        r.wait_event, r.wait_key, to_json(r.deadline) #>> '{}' AS deadline, r.concurrency_key,
        CASE WHEN r.concurrency_key IS NOT NULL AND r.lease_until = 'infinity' AND r.status = 'NEW' THEN (SELECT count(*)
    FROM service_requests q
    WHERE q.workflow_name = r.workflow_name AND q.concurrency_key = r.concurrency_key AND q.id < r.id AND q.concurrency_key IS NOT NULL AND q.lease_until = 'infinity' AND q.status = 'NEW') END AS slot_ahead,
        st.step_id, st.step_name, st.status AS step_status,
        CASE WHEN st.request = '' THEN r.payload ELSE st.request END AS request, st.response,
        st.time_taken_ms, st.attempts, st.reason AS step_reason, st.child_id, extract(epoch
    FROM st.started_at)::float8 * 1000 AS started_ms, extract(epoch
    FROM st.finished_at)::float8 * 1000 AS finished_ms
    FROM service_requests r
    LEFT JOIN steps_status st ON st.service_request_id = r.id
    WHERE r.id = ANY(ARRAY[(SELECT id FROM ids WHERE n = :n)])
    ORDER BY r.id, st.id;
