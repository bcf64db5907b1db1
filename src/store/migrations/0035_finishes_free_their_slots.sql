-- A finish's slot row deleted by the statement that finishes it (docs/decisions.md,
-- "Finishes free their slots"). The update trigger of migration 34 ran its function once
-- per finishing row of a limited workflow: a plpgsql call running a DELETE of its own,
-- an executor started and ended for one row (without it, the finishing step writes cost
-- about 12 % less a row). The executor's step writes that finish a limited request now
-- delete the finished rows' slot rows in the same statement
-- (`transitions::WRITE_TRANSITIONS_FREEING`) and say so for their transaction
-- (`SET LOCAL clamp.slot_rows = 'freed'`); the trigger leaves only finishes to them, so
-- any other change of a slot row in that transaction (none the step writes make today)
-- still goes by the trigger, and every other statement's finishes (a cancel, a deadline,
-- a fan-out's child) do as before.
DROP TRIGGER IF EXISTS concurrency_slots_update ON service_requests;
CREATE TRIGGER concurrency_slots_update AFTER UPDATE ON service_requests
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL AND (
        (OLD.status = 'NEW' AND OLD.lease_until = 'infinity')
            <> (NEW.status = 'NEW' AND NEW.lease_until = 'infinity')
        OR (OLD.status IN ('NEW', 'IN_PROGRESS', 'PAUSED', 'RESUMED')
            AND OLD.lease_until < 'infinity')
            <> (NEW.status IN ('NEW', 'IN_PROGRESS', 'PAUSED', 'RESUMED')
                AND NEW.lease_until < 'infinity')
        OR OLD.priority IS DISTINCT FROM NEW.priority)
        AND (NEW.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
             OR current_setting('clamp.slot_rows', true) IS DISTINCT FROM 'freed'))
    EXECUTE FUNCTION concurrency_slots_follow();
