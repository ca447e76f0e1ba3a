-- stopping_decisions (view, v1): stop the runs a predictor says will end worst at a fraction of training
-- (successive halving's rule, Li et al. 2018; ranking by the current loss is its baseline): per cv x fraction
-- x scope ('sweep', 'rung') x kill share x predictor, the compute saved (share of training steps not run),
-- the regret (p_best_killed: share of cell-bootstrap sweeps that stop the eventual best run; gap: best kept
-- final loss - best final loss, with its 95% cell-bootstrap interval) and wrong_kills (share of stopped runs
-- that belong to the kept share). decision, for a family's predictor against the best baseline at equal
-- savings (topometrics.verdict.stopping):
--   helps decide      the upper bound of delta_wrong (cells as units, level 1 - alpha / m) is below 0
--   no evidence       otherwise; 'not enough cells' when the bound cannot be computed
--   baseline          a baseline row; 'skipped: <reason>' when the runs cannot carry the decision (the
--                     reason says how many runs or cells it needs)
CREATE OR REPLACE VIEW stopping_decisions AS
SELECT cv, fraction, scope, kill_share, predictor, kind, n, n_cells, killed, saved, saved_low, saved_high,
    best_killed, p_best_killed, gap, gap_low, gap_high, wrong_kills, versus, delta_wrong, delta_low, delta_high,
    decision, status, reason
FROM stopping;
