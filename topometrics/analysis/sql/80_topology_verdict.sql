-- topology_verdict (view, v1): what each family of inputs adds to the prediction of a run's final
-- validation loss, per cross-validation scheme x training fraction (topometrics.analysis.verdict).
-- Bonferroni over the tested comparisons (families x fractions) of the same scheme: n_tests = the
-- rows with a p-value; p_bonferroni = min(1, p * n_tests). Verdict words, at settings.alpha:
--   skipped: <reason>           the comparison could not run (too few groups / checkpoints / values)
--   not enough runs (n=k)       even the smallest two-sided Wilcoxon p with k pairs, 2^(1-k), cannot
--                               pass the corrected level: the design cannot show anything
--   adds                        p_bonferroni < alpha and the whole CI of delta_mae is below 0
--   hurts                       p_bonferroni < alpha and the whole CI is above 0
--   no evidence                 otherwise (including every paired difference 0: no p-value)
CREATE OR REPLACE VIEW topology_verdict AS
WITH tested AS (
    SELECT v.*, s.alpha,
        count(*) FILTER (WHERE v.status = 'ok' AND v.p_value IS NOT NULL AND NOT isnan(v.p_value))
            OVER (PARTITION BY v.cv) AS n_tests
    FROM incremental_validity AS v CROSS JOIN settings AS s
)
SELECT cv, fraction, family, comparison, n, n_groups, mae_without, mae_with, delta_mae, ci_low, ci_high,
    p_value, least(1.0, p_value * n_tests) AS p_bonferroni, n_tests, alpha,
    CASE
        WHEN status <> 'ok' THEN 'skipped: ' || coalesce(reason, 'no reason recorded')
        WHEN n_tests > 0 AND power(2.0, 1 - n) >= alpha / n_tests THEN 'not enough runs (n=' || n || ')'
        WHEN p_value * n_tests < alpha AND ci_high < 0 THEN 'adds'
        WHEN p_value * n_tests < alpha AND ci_low > 0 THEN 'hurts'
        ELSE 'no evidence'
    END AS verdict,
    reason
FROM tested;
