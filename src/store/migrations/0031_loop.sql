-- LOOP steps (beyond Clamp): a LOOP runs its body as a child request per iteration, one
-- after another, through the fan-out machinery; its join keeps the bound, and its total
-- grows by one as each next iteration is inserted (fenced on the total it had, so two
-- instances applying one join start the next iteration once), and its last iteration's
-- id is kept so that reading it is one lookup however many iterations ran. NULL: not a
-- loop.
ALTER TABLE fan_joins ADD COLUMN IF NOT EXISTS max_iterations int;
ALTER TABLE fan_joins ADD COLUMN IF NOT EXISTS last_child uuid;
