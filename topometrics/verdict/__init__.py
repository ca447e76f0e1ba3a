"""The verdict: does a family predict a run's final loss beyond what the researcher already knows?

Entry points: ``verdict.comparisons`` / ``verdict.word`` (between-run incremental validity: the comparisons,
Holm, the verdict words); ``baselines`` (what the researcher already knows, declared once: loss laws, gradient
norm, weight norm, recipe); ``levels`` (between cells / within cells); ``inference`` (its fit, Clark-West
statistic, cell-block permutation p, cell bounds); ``decisions`` (pair-order accuracy, the seed-to-seed noise
ceiling, outlier runs and ``outlier_verdict``); ``remedy`` (what makes the verdict computable).
"""
