-- changepoints (view, v1): changepoints of each run's validation loss, headline features and learning rate, by
-- PELT (topometrics.dynamics.changepoints, analysis.changepoint_penalty), beside the phases view's threshold rule.
-- One row per run and series: the first changepoint's step (NULL: none, or reason says why), the count, and
-- for a feature its first changepoint's lag in checkpoints after the validation loss's and the learning rate's
-- (negative: the feature breaks first). Read from the analysis stage's tests rows (kind changepoint/_lag).
CREATE OR REPLACE VIEW changepoints AS
SELECT c.rung, c.variant, c.seed, c.feature AS series,
    c.estimate AS first_step, c.n AS count, c.reason,
    v.estimate AS lag_vs_val_loss, v.reason AS lag_vs_val_loss_reason,
    l.estimate AS lag_vs_lr, l.reason AS lag_vs_lr_reason,
    p.diminishing_step AS np_threshold_step
FROM tests AS c
LEFT JOIN tests AS v ON v.kind = 'changepoint_lag' AND v.other = 'val_loss'
    AND v.rung = c.rung AND v.variant = c.variant AND v.seed = c.seed AND v.feature = c.feature
LEFT JOIN tests AS l ON l.kind = 'changepoint_lag' AND l.other = 'lr'
    AND l.rung = c.rung AND l.variant = c.variant AND l.seed = c.seed AND l.feature = c.feature
LEFT JOIN phases AS p ON p.rung = c.rung AND p.variant = c.variant AND p.seed = c.seed
WHERE c.kind = 'changepoint';
