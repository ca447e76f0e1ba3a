-- topometrics warehouse: tables. Schema version 3 (topometrics.analysis.warehouse.SCHEMA_VERSION).
-- Keys are (rung, variant, seed, step): a "rung" is a ladder model (tiny ... xl) or an external series
-- (e.g. 'EleutherAI/pythia-14m'); `kind` in runs/rungs says which. `variant` is the recipe variant
-- (params.yaml `variants`; 'base' = the recipe in `train`, and for external series).

-- Build provenance: schema_version, code_version, duckdb_version, params (JSON), sql:<file> hashes.
CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL);

-- The analysis params the views read (one row), so that views stay pure SQL and still follow params.yaml.
CREATE TABLE settings (
    phase_threshold DOUBLE NOT NULL,   -- diminishing returns: |dNP| below this fraction of its peak
    np_patience INTEGER NOT NULL,      -- Rieck et al. 2019 Algorithm 2: checkpoints without NP improvement
    np_min_delta DOUBLE NOT NULL,      -- ... an improvement must beat the best NP by more than this
    loss_patience INTEGER NOT NULL,    -- validation-loss patience, in checkpoints
    loss_min_delta DOUBLE NOT NULL,    -- ... an improvement must lower the best val loss by more than this
    alpha DOUBLE NOT NULL DEFAULT 0.05, -- family-wise level of Bonferroni-corrected verdicts
    loss_unit VARCHAR NOT NULL DEFAULT 'nats' -- analysis.loss_unit: final_checkpoints.loss in nats/token or bits/byte
);

-- One row per training run (rung x variant x seed): params snapshot, corpus used, code version.
CREATE TABLE runs (
    rung VARCHAR NOT NULL,
    variant VARCHAR NOT NULL DEFAULT 'base',
    seed INTEGER NOT NULL,
    kind VARCHAR NOT NULL,             -- 'ladder' (trained here) or 'series' (external checkpoints)
    config_json VARCHAR,               -- data/config/<rung>.json verbatim: model shape + recipe
    steps INTEGER,                     -- planned optimizer steps (recipe.steps)
    ckpt_every INTEGER,
    lr DOUBLE,                         -- peak learning rate
    warmup INTEGER,
    min_lr_ratio DOUBLE,
    corpus_requested VARCHAR,
    corpus_used VARCHAR,
    corpus_sha256 VARCHAR,
    corpus_fallback BOOLEAN,
    corpus_reason VARCHAR,
    code_version VARCHAR,
    status VARCHAR,                    -- how a ladder run ended: 'complete' or 'diverged' (data/runs/<run>/run.json);
                                       -- diverged runs are excluded from fits and predictions, with this reason
    status_reason VARCHAR,             -- e.g. 'loss is nan at step 1234; kept checkpoints up to step 1200'
    tokens_per_s DOUBLE,               -- training throughput its own process measured (tokens per wall second,
                                       -- checkpoints included; data/runs/<run>/summary.json), NULL when not recorded
    PRIMARY KEY (rung, variant, seed)
);

-- One row per rung: shape and parameter count. A series' n_params counts the elements of every tensor its
-- safetensors files hold (a tied head stored once counts once), its shape is its config.json's; NULL where a
-- series states none (no config.json, a live monitor's log) or no checkpoint of it was computed.
CREATE TABLE rungs (
    rung VARCHAR PRIMARY KEY,
    kind VARCHAR NOT NULL,
    n_params BIGINT,
    vocab_size INTEGER,
    context INTEGER,
    hidden INTEGER,
    layers INTEGER,
    heads INTEGER
);

-- Every optimizer step: train loss, gradient 2-norm before clipping, learning rate used.
CREATE TABLE steps (
    rung VARCHAR NOT NULL, variant VARCHAR NOT NULL DEFAULT 'base', seed INTEGER NOT NULL, step INTEGER NOT NULL,
    train_loss DOUBLE, grad_norm DOUBLE, lr DOUBLE,
    PRIMARY KEY (rung, variant, seed, step)
);

-- Every checkpoint: held-out validation loss and the train loss logged there. External series
-- (run folders, live monitor logs) have rows for their computed steps; reason says why a loss is NULL.
CREATE TABLE checkpoints (
    rung VARCHAR NOT NULL, variant VARCHAR NOT NULL DEFAULT 'base', seed INTEGER NOT NULL, step INTEGER NOT NULL,
    val_loss DOUBLE, train_loss DOUBLE, reason VARCHAR,
    val_bpb DOUBLE,                    -- val_loss in bits per UTF-8 byte of the scored text (NULL: not recorded)
    PRIMARY KEY (rung, variant, seed, step)
);

-- The features stage's contract (docs/features.md); layer = 'all' for aggregates; NULL value => reason.
CREATE TABLE features (
    rung VARCHAR NOT NULL, variant VARCHAR NOT NULL DEFAULT 'base', seed INTEGER NOT NULL, step INTEGER NOT NULL,
    layer VARCHAR NOT NULL, feature VARCHAR NOT NULL, value DOUBLE, reason VARCHAR,
    PRIMARY KEY (rung, variant, seed, step, layer, feature)
);

-- Persistence diagrams: source in {weights, representation}; one row per (birth, death) pair.
CREATE TABLE diagrams (
    rung VARCHAR NOT NULL, variant VARCHAR NOT NULL DEFAULT 'base', seed INTEGER NOT NULL, step INTEGER NOT NULL,
    source VARCHAR NOT NULL, layer VARCHAR NOT NULL, dim INTEGER NOT NULL, birth DOUBLE, death DOUBLE
);

-- Final-loss predictions from the first `fraction` of training (paper Table 5).
CREATE TABLE predictions (
    method VARCHAR NOT NULL,           -- loss_power_law, schedule_aware, topology, loss_topology, ...
    cv VARCHAR NOT NULL,               -- 'none' (per-run fit), 'rung' or 'seed' (leave-one-group-out)
    fraction DOUBLE NOT NULL,
    rung VARCHAR NOT NULL, variant VARCHAR NOT NULL DEFAULT 'base', seed INTEGER NOT NULL,
    predicted DOUBLE,                  -- NULL when status = 'failed'
    actual DOUBLE,                     -- final-checkpoint validation loss
    status VARCHAR NOT NULL,           -- 'ok', 'failed', or 'excluded' (a diverged run: see runs.status)
    reason VARCHAR,                    -- why it failed
    trained_on VARCHAR                 -- learned methods: the rung:seed pairs the model was fitted on
);

-- Fitted curves: power laws against N (kind 'scaling') and loss-curve fits (kind 'loss_curve').
CREATE TABLE fits (
    kind VARCHAR NOT NULL,
    target VARCHAR NOT NULL,           -- feature name, 'val_loss', or the prediction method
    layer VARCHAR,
    rung VARCHAR, variant VARCHAR DEFAULT 'base', seed INTEGER, fraction DOUBLE,
    a DOUBLE, b DOUBLE, c DOUBLE,      -- f(N) = a*N^b + c, or L(t) = a*t^(-b) + c
    params_json VARCHAR,               -- every fitted parameter, by name
    r2 DOUBLE, spearman_rho DOUBLE, spearman_p DOUBLE, n INTEGER,
    status VARCHAR NOT NULL, reason VARCHAR
);

-- Statistical tests: Spearman with bootstrap CI, Steiger/Fisher-z comparisons, across-seed summaries.
CREATE TABLE tests (
    kind VARCHAR NOT NULL,             -- spearman, topo_vs_spectral, spearman_across_seeds, mae_across_seeds
    rung VARCHAR, variant VARCHAR DEFAULT 'base', seed INTEGER,
    feature VARCHAR, layer VARCHAR,
    other VARCHAR,                     -- the compared feature (topo_vs_spectral) or method/fraction
    estimate DOUBLE, ci_low DOUBLE, ci_high DOUBLE,
    statistic DOUBLE, p_value DOUBLE, n INTEGER,
    p_bonferroni DOUBLE, significant BOOLEAN, reason VARCHAR
);

-- Between-run incremental validity (topometrics.verdict.verdict): per cv scheme x fraction x nested comparison,
-- the paired difference of absolute final-loss errors (model with the family minus without).
CREATE TABLE incremental_validity (
    cv VARCHAR NOT NULL,               -- leave-one-<cv>-out: seed, variant or rung
    level VARCHAR,                     -- 'between' (which rung x recipe cell ends better; cells permuted within
                                       -- their rung) or 'within' (which seed of a cell; cell means removed,
                                       -- seeds shuffled within their cell); topometrics.verdict.levels
    fraction DOUBLE NOT NULL,
    family VARCHAR NOT NULL,           -- weight_norm, recipe, a verdict family, everything
    comparison VARCHAR NOT NULL,       -- 'primary', '(2) vs (1)', '(3) vs <baseline>', '(4) vs (2)',
                                       -- 'outliers (AUROC)'
    role VARCHAR,                      -- 'primary', 'topology' (exploratory, Holm), 'outlier' (exploratory,
                                       -- Holm among themselves), 'context' (uncorrected)
    baseline VARCHAR,                  -- the smaller model (topometrics.verdict.baselines): 'loss', 'norm' (loss
                                       -- curve + weight norm), 'recipe' (+ the run's recipe: the default),
                                       -- 'norm+<family>', 'recipe+<family>' (+ a geometric family)
    n INTEGER,                         -- runs predicted by both models (the pairs)
    n_cells INTEGER,                   -- rung x recipe cells among them (the units of the bounds)
    n_groups INTEGER,
    mae_without DOUBLE, mae_with DOUBLE,  -- nats
    delta_mae DOUBLE,                  -- mean(error_with - error_without); negative = the family helps
    ci_low DOUBLE, ci_high DOUBLE,     -- one-sided 95% bounds of delta_mae, cells as units (t over cell means)
    gain_share DOUBLE,                 -- -delta_mae / mae_without
    bound_share DOUBLE,                -- -ci_low / mae_without: the largest gain the data allow
    seed_sd DOUBLE,                    -- pooled within-cell SD of the final loss (nats): the noise ceiling
    decision_without DOUBLE, decision_with DOUBLE, decision_current DOUBLE,  -- share of run pairs ordered right:
                                       -- pairs of different cells (level between) or of one cell (within)
    n_outliers INTEGER,                -- role 'outlier' (topometrics.verdict.decisions): outlier runs among n
    auroc_without DOUBLE, auroc_with DOUBLE,  -- ... within-cell AUROC of the predicted final loss for them
    auroc_low DOUBLE, auroc_high DOUBLE,      -- ... one-sided 95% bounds of auroc_with - auroc_without (cells)
    statistic DOUBLE,                  -- Clark-West mean 2 e_without (pred_with - pred_without), nats^2;
                                       -- role 'outlier': auroc_with - auroc_without
    p_value DOUBLE,                    -- one-sided, from cell-block permutation refits
    p_adjusted DOUBLE,                 -- Holm over the scheme's topology rows, or over the outlier rows;
                                       -- = p_value for the others
    p_reverse DOUBLE,                  -- the reverse one-sided p (the family points away from the base's error
                                       -- more than a permuted one): 'hurts' needs it below the level
    min_p DOUBLE,                      -- the smallest p the permutations can give
    verdict VARCHAR,                   -- the word (see the topology_verdict view)
    status VARCHAR NOT NULL,           -- 'ok' or 'skipped'
    reason VARCHAR,                    -- why skipped, or notes (inputs not used)
    inputs VARCHAR                     -- input columns of the larger model
);

-- The paired per-run predictions behind every 'ok' row of incremental_validity.
CREATE TABLE incremental_errors (
    cv VARCHAR NOT NULL, level VARCHAR, fraction DOUBLE NOT NULL, family VARCHAR NOT NULL, comparison VARCHAR,
    rung VARCHAR NOT NULL, seed INTEGER NOT NULL, variant VARCHAR,
    actual DOUBLE, predicted_without DOUBLE, predicted_with DOUBLE,
    error_without DOUBLE, error_with DOUBLE
);

-- Every verdict predictor's out-of-fold final-loss prediction per run with its conformal prediction interval
-- (topometrics.verdict.intervals: the held-out residuals of the other folds of its own cross-validation).
CREATE TABLE prediction_intervals (
    cv VARCHAR NOT NULL,               -- leave-one-<cv>-out, as incremental_errors
    level VARCHAR,                     -- the verdict level of the predictions ('between' where it has none)
    fraction DOUBLE NOT NULL,
    predictor VARCHAR NOT NULL,        -- a baseline ('loss', 'norm', ...) or '<baseline>+<family>'
    kind VARCHAR,                      -- 'baseline' or 'family'
    rung VARCHAR NOT NULL, seed INTEGER NOT NULL, variant VARCHAR,
    fold VARCHAR,                      -- the run's held-out group (its seed, variant or rung)
    actual DOUBLE, predicted DOUBLE,   -- final loss and its out-of-fold prediction (analysis.loss_unit)
    nominal DOUBLE NOT NULL,           -- the interval's nominal coverage: 0.8 or 0.95
    half_width DOUBLE,                 -- conformal half-width; inf when the other folds hold too few runs
    low DOUBLE, high DOUBLE,
    covered DOUBLE                     -- 1 when low <= actual <= high, 0 when not; NULL for an infinite interval
);

-- Scaling up as a decision (topometrics.verdict.scale_up): per fraction x predictor x rung held out by the
-- verdict's leave-one-rung-out, the recipe its predictions choose against the one that ends best; see the
-- scale_up_decisions view.
CREATE TABLE scale_up (
    fraction DOUBLE NOT NULL,
    predictor VARCHAR NOT NULL,        -- a baseline or '<baseline>+<family>' (the verdict's, cv = 'rung')
    kind VARCHAR,                      -- 'baseline' or 'family'
    rung VARCHAR NOT NULL,             -- the held-out rung: no fitted model saw its runs
    smaller VARCHAR,                   -- the next smaller rung by parameter count (NULL for the smallest)
    n_recipes INTEGER, n_runs INTEGER, -- recipes (and runs) of the rung with a prediction
    chosen VARCHAR,                    -- the recipe with the lowest predicted final loss (mean over its seeds)
    winner VARCHAR,                    -- the recipe with the lowest actual final loss (mean over its seeds)
    hit DOUBLE,                        -- 1 when chosen = winner
    regret DOUBLE,                     -- actual final loss of chosen - of winner (>= 0, analysis.loss_unit)
    predicted_best DOUBLE,             -- chosen's predicted final loss
    actual_chosen DOUBLE, actual_winner DOUBLE,
    gain_predicted DOUBLE,             -- smaller rung's best actual final loss - predicted_best: the predicted
    gain_actual DOUBLE,                -- gain of scaling up, and the actual one (smaller best - winner)
    status VARCHAR NOT NULL,           -- 'ok' or 'skipped'
    reason VARCHAR                     -- why skipped (fewer than 2 recipes with a prediction at the rung)
);

-- Stopping the worst share of runs by a predictor at a fraction of training (topometrics.verdict.stopping):
-- one row per cv x fraction x scope x kill share x predictor; see the stopping_decisions view.
CREATE TABLE stopping (
    cv VARCHAR NOT NULL,               -- the verdict predictions' scheme; 'none' when only the current loss ranks
    fraction DOUBLE NOT NULL,
    scope VARCHAR NOT NULL,            -- 'sweep' (the worst share of all runs) or 'rung' (of each rung's runs)
    kill_share DOUBLE NOT NULL,        -- share of runs stopped: 0.25, 0.5, 0.75 (floor(share x runs))
    predictor VARCHAR NOT NULL,        -- 'current loss' (successive halving), a baseline, '<baseline>+<family>'
    kind VARCHAR,                      -- 'baseline' or 'family'
    n INTEGER, n_cells INTEGER,        -- runs the predictor ranks, and their rung x recipe cells
    killed INTEGER,                    -- runs stopped
    saved DOUBLE, saved_low DOUBLE, saved_high DOUBLE,  -- share of training steps not run, 95% cell bootstrap
    best_killed DOUBLE,                -- 1 when the eventual best run is stopped (mean over rungs for scope rung)
    p_best_killed DOUBLE,              -- share of cell-bootstrap sweeps in which the best run is stopped
    gap DOUBLE, gap_low DOUBLE, gap_high DOUBLE,  -- best kept final loss - best final loss, 95% cell bootstrap
    wrong_kills DOUBLE,                -- share of runs stopped that belong to the kept share by final loss
    versus VARCHAR,                    -- family rows: the baseline tested against (fewest wrong kills)
    delta_wrong DOUBLE, delta_low DOUBLE, delta_high DOUBLE,  -- wrong_kills(family) - wrong_kills(versus) on
                                       -- the runs both rank; bounds at 1 - alpha / m, cells as units
    decision VARCHAR,                  -- 'helps decide', 'no evidence', 'not enough cells', 'baseline', 'skipped: ...'
    status VARCHAR NOT NULL,           -- 'ok' or 'skipped'
    reason VARCHAR                     -- why skipped, with the runs it needs
);
