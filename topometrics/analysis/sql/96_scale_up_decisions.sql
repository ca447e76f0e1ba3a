-- scale_up_decisions (view, v1): scaling up as a decision, per fraction x predictor over the rungs the
-- verdict's leave-one-rung-out held out (topometrics.verdict.scale_up): at each held-out rung the predictor,
-- fitted on the other rungs and reading the first part of this rung's runs, chooses the recipe it predicts
-- to end best. hits = decisions whose choice was the recipe that ended best; mean_regret / max_regret =
-- the chosen recipe's final loss minus the best recipe's; gain_* = the next smaller rung's best final loss
-- minus the choice's predicted / the winner's actual final loss, summed over the rungs that have a smaller
-- one (what scaling up was predicted to buy, and bought). Two to five rungs give two to five decisions: no
-- test, the numbers describe this sweep.
CREATE OR REPLACE VIEW scale_up_decisions AS
SELECT fraction, predictor, any_value(kind) AS kind,
    count(*) FILTER (WHERE status = 'ok') AS decisions,
    sum(hit) AS hits,
    avg(regret) AS mean_regret,
    max(regret) AS max_regret,
    sum(gain_predicted) AS gain_predicted,
    sum(gain_actual) FILTER (WHERE gain_predicted IS NOT NULL) AS gain_actual,
    string_agg(CASE WHEN status = 'ok' THEN rung || ': ' || chosen || CASE WHEN hit = 1 THEN ' (best)'
        ELSE ' (best: ' || winner || ')' END END, '; ' ORDER BY rung) AS choices
FROM scale_up
GROUP BY fraction, predictor;
