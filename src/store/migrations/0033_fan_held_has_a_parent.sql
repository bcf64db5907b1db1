-- The fan-out's held children, and only them: a request waiting for a concurrency slot is
-- held at lease_until 'infinity' as well, and under the old predicate every one of them
-- was in this index. Worse, a key's looks (a probe of its queue: workflow, key, held) met
-- the old predicate too, and their generic plans on partitions without statistics read
-- this index, every held row of every key, instead of the keyed index's few entries.
-- A fan-out's looks name the parent, which implies the new condition.
DROP INDEX IF EXISTS service_requests_fan_held;
CREATE INDEX IF NOT EXISTS service_requests_fan_held
    ON service_requests (parent_id, parent_step_id, fan_index)
    WHERE lease_until = 'infinity' AND parent_id IS NOT NULL;
