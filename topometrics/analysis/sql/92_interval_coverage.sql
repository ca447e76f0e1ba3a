-- interval_coverage (view, v1): how often the conformal prediction intervals of every verdict predictor
-- (topometrics.verdict.intervals) hold the run's final loss, per cv x level x fraction x predictor x nominal
-- coverage (0.8, 0.95). n: runs with a finite interval; covered: the measured share; half_width: its mean.
-- Split conformal calibrated on the held-out residuals of the other folds (CV+, Barber et al. 2021): a
-- measured share well below nominal says the runs are not exchangeable across folds (e.g. leave-one-rung-out).
CREATE OR REPLACE VIEW interval_coverage AS
SELECT cv, level, fraction, predictor, any_value(kind) AS kind, nominal,
    count(*) AS n, avg(covered) AS covered, avg(covered) - nominal AS shortfall, avg(half_width) AS half_width
FROM prediction_intervals
WHERE isfinite(half_width)
GROUP BY cv, level, fraction, predictor, nominal;
