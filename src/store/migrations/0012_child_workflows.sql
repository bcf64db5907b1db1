-- Workflows inside workflows (a step of mode WORKFLOW): a child service request names
-- its parent and the parent's step that waits for it; that step's record names the
-- child. `parent_told` says the child's outcome reached the parent. Nullable columns and
-- constant defaults rewrite nothing; both indexes are partial, so a request without a
-- parent adds no entry to either (the second holds only finished children whose parent
-- has not heard yet, the work of the reporter that tells parents).
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS parent_id uuid;
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS parent_step_id integer;
-- NULL for requests without a parent (no room in their rows); a child starts false.
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS parent_told boolean;
ALTER TABLE steps_status ADD COLUMN IF NOT EXISTS child_id uuid;
CREATE INDEX IF NOT EXISTS service_requests_children
    ON service_requests (parent_id, id) WHERE parent_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS service_requests_untold_children
    ON service_requests (id)
    WHERE parent_id IS NOT NULL AND NOT parent_told
      AND status IN ('COMPLETED', 'FAILED', 'CANCELLED');
