-- feature_loss_spearman (view, v2): per rung x variant x seed x feature x layer, Spearman's rho between the
-- feature and the loss across checkpoints (paper section 3.3, Tables 2-4).
-- `loss` names the loss of each row: the validation loss when the run (or series) logged one at any of its
-- checkpoints, else its training loss (an external series whose losses file has only a training loss);
-- a run with neither has no rows here (the report says so).
-- Spearman = Pearson correlation of average ranks: tied values share the mean of the ranks they
-- span (rank() gives the lowest; adding (ties - 1) / 2 gives the average), which is what
-- scipy.stats.spearmanr does. NULL/NaN values are left out; rho is NULL when either side is constant.
CREATE OR REPLACE VIEW feature_loss_spearman AS
WITH losses AS (
    SELECT rung, variant, seed, step, val_loss, train_loss,
        CASE WHEN count(val_loss) FILTER (WHERE NOT isnan(val_loss)) OVER (PARTITION BY rung, variant, seed) > 0
             THEN 'val_loss' ELSE 'train_loss' END AS loss
    FROM checkpoints
), pairs AS (
    SELECT f.rung, f.variant, f.seed, f.feature, f.layer, f.step, f.value AS x, l.loss,
        CASE l.loss WHEN 'val_loss' THEN l.val_loss ELSE l.train_loss END AS y
    FROM features AS f
    JOIN losses AS l USING (rung, variant, seed, step)
    WHERE f.value IS NOT NULL AND NOT isnan(f.value)
), ranked AS (
    SELECT rung, variant, seed, feature, layer, loss,
        rank() OVER (PARTITION BY rung, variant, seed, feature, layer ORDER BY x)
            + (count(*) OVER (PARTITION BY rung, variant, seed, feature, layer, x) - 1) / 2.0 AS rx,
        rank() OVER (PARTITION BY rung, variant, seed, feature, layer ORDER BY y)
            + (count(*) OVER (PARTITION BY rung, variant, seed, feature, layer, y) - 1) / 2.0 AS ry
    FROM pairs
    WHERE y IS NOT NULL AND NOT isnan(y)
)
SELECT rung, variant, seed, feature, layer, any_value(loss) AS loss, count(*) AS n,
    CASE WHEN var_pop(rx) > 0 AND var_pop(ry) > 0 THEN corr(rx, ry) END AS rho
FROM ranked
GROUP BY rung, variant, seed, feature, layer;
