"""Analysis: the warehouse and what is computed over it.

Entry points: ``warehouse.build_warehouse`` / ``populate`` (the DuckDB store, with the pure-SQL views in
``sql/``); ``tables.run_analysis`` (tests, fits and predictions over a populated connection);
``verdict`` (between-run incremental validity: comparisons, Holm, verdict words); ``inference`` (its fit,
Clark-West statistic, cell-block permutation p, cell bounds); ``remedy`` (what makes the verdict
computable); ``predict`` (final-loss predictors); ``partial``
(partial Spearman within runs); ``decisions`` (pair-order accuracy, the seed-to-seed noise ceiling,
outlier runs and ``outlier_verdict``, the verdict's rows on whether topology flags them);
``stats`` (p-values, bootstrap CIs, robust fits);
``metrics_file.build_metrics`` (the summary ``dvc metrics diff`` compares).
"""
