-- final_checkpoints (view, v1): the last checkpoint of every run with its parameter count.
-- `complete` is false when the run stopped before its planned steps (diverged or interrupted).
CREATE OR REPLACE VIEW final_checkpoints AS
SELECT c.rung, c.variant, c.seed, c.step, c.val_loss, c.train_loss, g.n_params, g.kind,
       coalesce(c.step = r.steps, TRUE) AS complete
FROM checkpoints AS c
JOIN (SELECT rung, variant, seed, max(step) AS step FROM checkpoints GROUP BY rung, variant, seed) AS last USING (rung, variant, seed, step)
LEFT JOIN runs AS r USING (rung, variant, seed)
LEFT JOIN rungs AS g USING (rung);
