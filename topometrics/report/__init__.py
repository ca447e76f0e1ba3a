"""The offline report: warehouse frames to tables, figures and one HTML page.

Entry points: ``frames.load`` (the warehouse's tables for the report); ``contents.build`` (tables,
figures and DVC plot frames; a piece that cannot be shown is ``frames.Missing`` with its reason);
``html.render_html``; ``answer.answer`` (the opening: the verdict in a few sentences, or why there is
none and the command that gives one); ``verdict.section`` (the verdict's table and forest plot);
``figures`` and ``charts`` (pure functions to ``alt.Chart``); ``paper`` (the paper's own numbers).
"""
