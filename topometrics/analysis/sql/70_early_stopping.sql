-- early_stopping (view, v1): where two patience rules would have stopped each run, and the steps saved.
-- NP rule = Rieck et al. 2019, Algorithm 2: best P starts at 0; NP(t) > P + np_min_delta is an
-- improvement (P <- NP(t), counter <- 0), anything else adds 1 to the counter; stop when the counter
-- reaches np_patience. The validation-loss rule is the same with "val_loss < best - loss_min_delta".
-- Patience counts checkpoints, not steps. A rule that never fires stops at the final checkpoint.
CREATE OR REPLACE VIEW early_stopping AS
WITH RECURSIVE
np AS (
    SELECT rung, variant, seed, step, np AS v, row_number() OVER (PARTITION BY rung, variant, seed ORDER BY step) AS i
    FROM np_series
),
vl AS (
    SELECT rung, variant, seed, step, val_loss AS v, row_number() OVER (PARTITION BY rung, variant, seed ORDER BY step) AS i
    FROM checkpoints
    WHERE val_loss IS NOT NULL AND NOT isnan(val_loss)
),
np_walk (rung, variant, seed, i, step, best, wait) AS (
    SELECT n.rung, n.variant, n.seed, n.i, n.step,
        CASE WHEN n.v > s.np_min_delta THEN n.v ELSE 0.0 END,
        CASE WHEN n.v > s.np_min_delta THEN 0 ELSE 1 END
    FROM np AS n CROSS JOIN settings AS s
    WHERE n.i = 1
    UNION ALL
    SELECT n.rung, n.variant, n.seed, n.i, n.step,
        CASE WHEN n.v > w.best + s.np_min_delta THEN n.v ELSE w.best END,
        CASE WHEN n.v > w.best + s.np_min_delta THEN 0 ELSE w.wait + 1 END
    FROM np_walk AS w
    JOIN np AS n ON n.rung = w.rung AND n.variant = w.variant AND n.seed = w.seed AND n.i = w.i + 1
    CROSS JOIN settings AS s
    WHERE w.wait < s.np_patience
),
loss_walk (rung, variant, seed, i, step, best, wait) AS (
    SELECT rung, variant, seed, i, step, v, 0 FROM vl WHERE i = 1
    UNION ALL
    SELECT n.rung, n.variant, n.seed, n.i, n.step,
        CASE WHEN n.v < w.best - s.loss_min_delta THEN n.v ELSE w.best END,
        CASE WHEN n.v < w.best - s.loss_min_delta THEN 0 ELSE w.wait + 1 END
    FROM loss_walk AS w
    JOIN vl AS n ON n.rung = w.rung AND n.variant = w.variant AND n.seed = w.seed AND n.i = w.i + 1
    CROSS JOIN settings AS s
    WHERE w.wait < s.loss_patience
),
np_stop AS (
    SELECT w.rung, w.variant, w.seed, min(w.step) AS step
    FROM np_walk AS w CROSS JOIN settings AS s WHERE w.wait >= s.np_patience GROUP BY w.rung, w.variant, w.seed
),
loss_stop AS (
    SELECT w.rung, w.variant, w.seed, min(w.step) AS step
    FROM loss_walk AS w CROSS JOIN settings AS s WHERE w.wait >= s.loss_patience GROUP BY w.rung, w.variant, w.seed
),
last AS (SELECT rung, variant, seed, max(step) AS final_step FROM checkpoints GROUP BY rung, variant, seed)
SELECT l.rung, l.variant, l.seed, l.final_step,
    s.np_patience, s.np_min_delta, s.loss_patience, s.loss_min_delta,
    n.step IS NOT NULL AS np_fired,
    coalesce(n.step, l.final_step) AS np_stop_step,
    l.final_step - coalesce(n.step, l.final_step) AS np_steps_saved,
    cn.val_loss AS np_stop_val_loss,
    v.step IS NOT NULL AS loss_fired,
    coalesce(v.step, l.final_step) AS loss_stop_step,
    l.final_step - coalesce(v.step, l.final_step) AS loss_steps_saved,
    cv.val_loss AS loss_stop_val_loss,
    cf.val_loss AS final_val_loss
FROM last AS l
CROSS JOIN settings AS s
LEFT JOIN np_stop AS n USING (rung, variant, seed)
LEFT JOIN loss_stop AS v USING (rung, variant, seed)
LEFT JOIN checkpoints AS cn ON cn.rung = l.rung AND cn.variant = l.variant AND cn.seed = l.seed AND cn.step = coalesce(n.step, l.final_step)
LEFT JOIN checkpoints AS cv ON cv.rung = l.rung AND cv.variant = l.variant AND cv.seed = l.seed AND cv.step = coalesce(v.step, l.final_step)
LEFT JOIN checkpoints AS cf ON cf.rung = l.rung AND cf.variant = l.variant AND cf.seed = l.seed AND cf.step = l.final_step;
