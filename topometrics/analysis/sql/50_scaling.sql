-- scaling (view, v1): every feature at each run's final feature checkpoint against the rung's
-- parameter count N: the input of the power-law fits f(N) = a*N^b + c (paper Tables 1 and 7).
-- The final validation loss enters as feature 'val_loss', layer 'checkpoint', in analysis.loss_unit.
CREATE OR REPLACE VIEW scaling AS
SELECT f.rung, f.variant, f.seed, g.kind, g.n_params, f.step, f.feature, f.layer, f.value
FROM features AS f
JOIN (SELECT rung, variant, seed, max(step) AS step FROM features GROUP BY rung, variant, seed) AS last USING (rung, variant, seed, step)
JOIN rungs AS g USING (rung)
WHERE g.n_params IS NOT NULL AND f.value IS NOT NULL AND NOT isnan(f.value)
UNION ALL
SELECT rung, variant, seed, kind, n_params, step, 'val_loss' AS feature, 'checkpoint' AS layer, loss AS value
FROM final_checkpoints
WHERE n_params IS NOT NULL AND loss IS NOT NULL AND NOT isnan(loss);
