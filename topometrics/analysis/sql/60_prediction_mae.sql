-- prediction_mae (view, v1): per variant x method x cv x training fraction, the mean absolute error over runs
-- (rung x variant x seed) of predicted vs actual final validation loss (paper Table 5).
-- improvement_pct compares with the loss-only power law on the same runs (paired: only runs where
-- both succeeded), 100 * (baseline MAE - MAE) / baseline MAE; positive = better than loss-only.
CREATE OR REPLACE VIEW prediction_mae AS
WITH base AS (
    SELECT fraction, rung, variant, seed, predicted AS base_predicted
    FROM predictions
    WHERE method = 'loss_power_law' AND status = 'ok'
), joined AS (
    SELECT p.*, b.base_predicted, p.status = 'ok' AS ok, p.status = 'ok' AND b.base_predicted IS NOT NULL AS paired
    FROM predictions AS p
    LEFT JOIN base AS b USING (fraction, rung, variant, seed)
), agg AS (
    SELECT variant, method, cv, fraction,
        count(*) FILTER (WHERE ok) AS n,
        count(*) FILTER (WHERE NOT ok) AS n_failed,
        count(DISTINCT seed) FILTER (WHERE ok) AS n_seeds,
        avg(abs(predicted - actual)) FILTER (WHERE ok) AS mae,
        count(*) FILTER (WHERE paired) AS n_paired,
        avg(abs(predicted - actual)) FILTER (WHERE paired) AS mae_paired,
        avg(abs(base_predicted - actual)) FILTER (WHERE paired) AS baseline_mae
    FROM joined
    GROUP BY variant, method, cv, fraction
)
SELECT variant, method, cv, fraction, n, n_failed, n_seeds, mae, n_paired, baseline_mae,
    100 * (baseline_mae - mae_paired) / nullif(baseline_mae, 0) AS improvement_pct
FROM agg;
