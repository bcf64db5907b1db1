-- Workflow versions (PUT /workflow/{name}). `workflows` keeps one row per name with its
-- latest definition and version number, as the list and Clamp's routes read it; every
-- version's definition is kept in `workflow_versions` for good, so a request pinned to
-- one keeps its steps whatever comes after. A request names the version it runs; every
-- request before versions ran version 1. New columns without defaults, or with constant
-- ones, rewrite nothing.
ALTER TABLE workflows ADD COLUMN IF NOT EXISTS version integer NOT NULL DEFAULT 1;
CREATE TABLE IF NOT EXISTS workflow_versions (
    name        text NOT NULL,
    version     integer NOT NULL,
    description text NOT NULL DEFAULT '',
    definition  jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);
INSERT INTO workflow_versions (name, version, description, definition, created_at)
SELECT name, 1, description, definition || jsonb_build_object('version', 1), created_at
FROM workflows
ON CONFLICT DO NOTHING;
UPDATE workflows SET definition = definition || jsonb_build_object('version', 1)
WHERE NOT definition ? 'version';
-- NULL is version 1 (most requests): a NULL takes no room in the row, which keeps the
-- row within the same 8-byte step as before versions (readers coalesce).
ALTER TABLE service_requests ADD COLUMN IF NOT EXISTS workflow_version integer;
