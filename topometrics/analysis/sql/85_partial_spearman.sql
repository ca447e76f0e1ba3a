-- partial_spearman (view, v1): within-run Spearman rho of each layer-'all' feature with the
-- validation loss, with training progress partialled out (tests.kind = 'partial_spearman'):
-- control 'w_fro' (the network's weight norm) or 'step'. Next to the raw rho of
-- feature_loss_spearman, so a feature that only reads progress shows raw rho near -1, partial near 0.
CREATE OR REPLACE VIEW partial_spearman AS
SELECT t.rung, t.variant, t.seed, t.feature, t.layer, t.other AS control, t.estimate AS partial_rho,
    t.ci_low, t.ci_high, t.p_value, t.p_bonferroni, t.significant, t.n, s.rho AS raw_rho, t.reason
FROM tests AS t
LEFT JOIN feature_loss_spearman AS s USING (rung, variant, seed, feature, layer)
WHERE t.kind = 'partial_spearman';
