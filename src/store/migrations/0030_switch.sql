-- SWITCH steps (beyond Clamp): a SWITCH starts the one path its value picks as a child
-- request, through the fan-out machinery; its join is marked so that the step's answer
-- is that child's last answer (not an object of branches), and its `branches` hold the
-- case taken.
ALTER TABLE fan_joins ADD COLUMN IF NOT EXISTS switch boolean NOT NULL DEFAULT false;
