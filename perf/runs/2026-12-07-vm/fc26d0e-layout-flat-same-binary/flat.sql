DO $$
DECLARE t text; o text;
BEGIN
  ALTER SEQUENCE steps_status_id_seq OWNED BY NONE;
  FOREACH t IN ARRAY ARRAY['service_requests', 'steps_status', 'fan_joins', 'event_takes'] LOOP
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING INDEXES INCLUDING STORAGE)', t || '_flat', t);
    EXECUTE format('DROP TABLE %I CASCADE', t);
    EXECUTE format('ALTER TABLE %I RENAME TO %I', t || '_flat', t);
    EXECUTE format('ALTER TABLE %I SET (%s)', t, clamp_partition_options(t));
  END LOOP;
  ALTER SEQUENCE steps_status_id_seq OWNED BY steps_status.id;
  CREATE TRIGGER concurrency_slots_delete AFTER DELETE ON service_requests FOR EACH ROW
    WHEN (old.concurrency_key IS NOT NULL) EXECUTE FUNCTION concurrency_slots_follow();
END $$;
