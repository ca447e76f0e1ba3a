-- topology_verdict (view, v3): what each family of inputs adds to the prediction of a run's final
-- validation loss, per cross-validation scheme x training fraction (topometrics.verdict.verdict, which
-- computes the test, the bounds and the verdict word; topometrics.verdict.inference, the statistics).
-- role: 'primary' (the pre-registered endpoint, judged alone at alpha), 'topology' (exploratory:
-- p_adjusted is Holm over the topology rows of the scheme), 'context' (baselines and the all-families
-- row, uncorrected). Verdict words:
--   skipped: <reason>           the comparison could not run (too few groups / checkpoints / values)
--   not enough runs (n, cells)  the smallest p the cell permutations can give cannot pass the level
--   adds                        p_adjusted < alpha and the gain is >= analysis.min_effect of mae_without
--   hurts                       the one-sided 95% lower bound of delta_mae is above 0 and the reverse
--                               one-sided permutation test (p_reverse) passes the level; else no evidence
--   ruled out (> X %)           the 95% upper bound on the gain, X % of mae_without, is within
--                               analysis.equivalence_margin: for a linear use of these columns only
--   no evidence                 otherwise
-- Errors in units of the seed-to-seed SD of the final loss: mae_*_sd = mae_* / seed_sd.
-- role 'outlier' (topometrics.verdict.decisions.outlier_verdict, leave-one-seed-out): does the family make
-- the predicted final loss rank the outlier runs (final loss > analysis.outlier_sd robust SDs above their
-- cell's other seeds) above their cell-mates? n_outliers, auroc_without / auroc_with (within-cell AUROC),
-- auroc_low / auroc_high (one-sided 95% bounds of the gain, cell bootstrap), statistic = the AUROC gain;
-- p_adjusted is Holm over the outlier rows; 'adds' needs the gain >= analysis.outlier_min_gain, 'hurts'
-- auroc_high < 0; no MAE columns. With fewer than 2 outlier runs the row reads 'skipped: <why>'.
CREATE OR REPLACE VIEW topology_verdict AS
SELECT v.cv, coalesce(v.level, 'between') AS level, v.fraction, v.family, v.comparison, v.role, v.baseline,
    v.n, v.n_cells, v.n_groups,
    v.mae_without, v.mae_with, v.delta_mae, v.ci_low, v.ci_high, v.gain_share, v.bound_share, v.seed_sd,
    v.mae_without / nullif(v.seed_sd, 0) AS mae_without_sd, v.mae_with / nullif(v.seed_sd, 0) AS mae_with_sd,
    v.decision_without, v.decision_with, v.decision_current, v.n_outliers, v.auroc_without, v.auroc_with,
    v.auroc_low, v.auroc_high, v.statistic, v.p_value, v.p_adjusted, v.p_reverse, v.min_p,
    s.alpha, v.verdict, v.reason
FROM incremental_validity AS v CROSS JOIN settings AS s;
