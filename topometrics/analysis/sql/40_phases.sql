-- phases (view, v1): phase transitions of neural persistence (paper section 3.3, Table 6).
-- dNP(t) = NP(t) - NP(previous checkpoint), attributed to the later checkpoint t (np_series).
-- peak_step: the step of maximum |dNP| (earliest on ties); diminishing_step: the first later step
-- where |dNP| < settings.phase_threshold * peak ("diminishing returns"; NULL if it never happens).
-- Fractions are of the planned training length (runs.steps; the last NP step for series).
CREATE OR REPLACE VIEW phases AS
WITH d AS (
    SELECT rung, variant, seed, step, np_source,
        abs(np - lag(np) OVER (PARTITION BY rung, variant, seed ORDER BY step)) AS abs_delta
    FROM np_series
), peak AS (
    SELECT rung, variant, seed, np_source, step AS peak_step, abs_delta AS peak_abs_delta
    FROM (SELECT *, row_number() OVER (PARTITION BY rung, variant, seed ORDER BY abs_delta DESC, step) AS k
          FROM d WHERE abs_delta IS NOT NULL)
    WHERE k = 1
), later AS (
    SELECT p.rung, p.variant, p.seed, min(d.step) AS diminishing_step
    FROM peak AS p
    JOIN d ON d.rung = p.rung AND d.variant = p.variant AND d.seed = p.seed AND d.step > p.peak_step
    CROSS JOIN settings AS s
    WHERE d.abs_delta < s.phase_threshold * p.peak_abs_delta
    GROUP BY p.rung, p.variant, p.seed
), total AS (
    SELECT n.rung, n.variant, n.seed, coalesce(any_value(r.steps), max(n.step)) AS total_steps
    FROM np_series AS n LEFT JOIN runs AS r USING (rung, variant, seed)
    GROUP BY n.rung, n.variant, n.seed
)
SELECT p.rung, p.variant, p.seed, p.np_source, t.total_steps,
    p.peak_step, p.peak_abs_delta, p.peak_step / t.total_steps AS peak_fraction,
    s.phase_threshold,
    l.diminishing_step, l.diminishing_step / t.total_steps AS diminishing_fraction
FROM peak AS p
JOIN total AS t USING (rung, variant, seed)
LEFT JOIN later AS l USING (rung, variant, seed)
CROSS JOIN settings AS s;
