-- Answer deadlines of ASYNC steps: a step sent with an answerTimeout pauses its request
-- with the deadline as lease_until (no claim takes a PAUSED row). Only such rows are in
-- this index (a pause without a deadline keeps '-infinity'), so the look for overdue
-- answers reads the overdue ones and nothing else, and other writes only test the
-- predicate.
CREATE INDEX IF NOT EXISTS service_requests_answer_due
    ON service_requests (lease_until) WHERE status = 'PAUSED' AND lease_until > '-infinity';
