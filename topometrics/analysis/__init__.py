"""Analysis: the warehouse and what is computed over it.

Entry points: ``warehouse.build_warehouse`` / ``populate`` (the DuckDB store, with the pure-SQL views in
``sql/``); ``tables.run_analysis`` (tests, fits and predictions over a populated connection, calling
:mod:`topometrics.verdict` for the verdict); ``predict`` (final-loss predictors); ``partial``
(partial Spearman within runs); ``stats`` (p-values, bootstrap CIs, robust fits);
``metrics_file.build_metrics`` (the summary ``dvc metrics diff`` compares); ``forecast.load_forecaster`` /
``forecast_line`` (the stage's live forecaster read back: a new run's predicted final loss, standard library only).
``query.main`` (``python -m topometrics.analysis.query "SQL"``: ad hoc SQL on the warehouse, read-only).
"""
