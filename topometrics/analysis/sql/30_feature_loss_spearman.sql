-- feature_loss_spearman (view, v1): per rung x variant x seed x feature x layer, Spearman's rho between the
-- feature and the validation loss across checkpoints (paper section 3.3, Tables 2-4).
-- Spearman = Pearson correlation of average ranks: tied values share the mean of the ranks they
-- span (rank() gives the lowest; adding (ties - 1) / 2 gives the average), which is what
-- scipy.stats.spearmanr does. NULL/NaN values are left out; rho is NULL when either side is constant.
CREATE OR REPLACE VIEW feature_loss_spearman AS
WITH pairs AS (
    SELECT f.rung, f.variant, f.seed, f.feature, f.layer, f.step, f.value AS x, c.val_loss AS y
    FROM features AS f
    JOIN checkpoints AS c USING (rung, variant, seed, step)
    WHERE f.value IS NOT NULL AND NOT isnan(f.value) AND c.val_loss IS NOT NULL AND NOT isnan(c.val_loss)
), ranked AS (
    SELECT rung, variant, seed, feature, layer,
        rank() OVER (PARTITION BY rung, variant, seed, feature, layer ORDER BY x)
            + (count(*) OVER (PARTITION BY rung, variant, seed, feature, layer, x) - 1) / 2.0 AS rx,
        rank() OVER (PARTITION BY rung, variant, seed, feature, layer ORDER BY y)
            + (count(*) OVER (PARTITION BY rung, variant, seed, feature, layer, y) - 1) / 2.0 AS ry
    FROM pairs
)
SELECT rung, variant, seed, feature, layer, count(*) AS n,
    CASE WHEN var_pop(rx) > 0 AND var_pop(ry) > 0 THEN corr(rx, ry) END AS rho
FROM ranked
GROUP BY rung, variant, seed, feature, layer;
