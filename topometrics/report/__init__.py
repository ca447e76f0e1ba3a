"""The offline report: warehouse frames to tables, figures and one HTML page.

Entry points: ``frames.load`` (the warehouse's tables for the report); ``contents.build`` (tables,
figures and DVC plot frames; a piece that cannot be shown is ``frames.Missing`` with its reason);
``html.render_html``; ``verdict.section`` (the verdict's sentences, table and forest plot);
``figures`` and ``charts`` (pure functions to ``alt.Chart``); ``paper`` (the paper's own numbers).
"""
