-- final_checkpoints (view, v1): the last checkpoint of every run with its parameter count.
-- `complete` is false when the run stopped before its planned steps (diverged or interrupted).
-- `loss` is the validation loss in analysis.loss_unit (settings.loss_unit): val_loss (nats per token of the
-- run's own tokenizer) or val_bpb (bits per UTF-8 byte, comparable across tokenizers).
CREATE OR REPLACE VIEW final_checkpoints AS
SELECT c.rung, c.variant, c.seed, c.step, c.val_loss, c.train_loss, g.n_params, g.kind, c.val_bpb,
       CASE WHEN (SELECT any_value(loss_unit) FROM settings) = 'bpb' THEN c.val_bpb ELSE c.val_loss END AS loss,
       coalesce(c.step = r.steps, TRUE) AS complete
FROM checkpoints AS c
JOIN (SELECT rung, variant, seed, max(step) AS step FROM checkpoints GROUP BY rung, variant, seed) AS last USING (rung, variant, seed, step)
LEFT JOIN runs AS r USING (rung, variant, seed)
LEFT JOIN rungs AS g USING (rung);
