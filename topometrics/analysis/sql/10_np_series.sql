-- np_series (view, v1): the neural-persistence series NP(t) used by `phases` and `early_stopping`.
-- NP = mean over linear layers of the per-layer `np_norm` (Rieck et al. 2019 normalisation), the
-- paper's "mean neural persistence" (section 3.2). One source per run, the first that exists:
--   1. layer 'all', feature 'np_norm' (the features stage writes the mean over layers there);
--   2. the mean of the per-layer `np_norm` rows, computed here.
-- `np_source` names the one used.
CREATE OR REPLACE VIEW np_series AS
WITH candidates AS (
    SELECT rung, variant, seed, step, value AS np, 'all/np_norm' AS np_source, 1 AS preference
    FROM features
    WHERE layer = 'all' AND feature = 'np_norm' AND value IS NOT NULL AND NOT isnan(value)
    UNION ALL
    SELECT rung, variant, seed, step, avg(value), 'avg(layer np_norm)', 2
    FROM features
    WHERE layer <> 'all' AND feature = 'np_norm' AND value IS NOT NULL AND NOT isnan(value)
    GROUP BY rung, variant, seed, step
), chosen AS (
    SELECT rung, variant, seed, min(preference) AS preference FROM candidates GROUP BY rung, variant, seed
)
SELECT c.rung, c.variant, c.seed, c.step, c.np, c.np_source
FROM candidates AS c
JOIN chosen USING (rung, variant, seed, preference);
