"""The HTML page `dvc plots show` and `dvc plots diff` fill, with Vega, Vega-Lite and Vega-Embed inlined (offline).

dvc-render fills an HTML template by replacing ``{plot_divs}`` (required) with one ``<div>`` per plot, each calling
``vegaEmbed``, ``{scripts}`` with ``<script src>`` tags to a CDN, and ``{refresh_tag}``. This page keeps
``{plot_divs}`` and ``{refresh_tag}``, leaves ``{scripts}`` out (so no CDN tag is ever written) and inlines
vl-convert's bundle instead, which defines ``vegaEmbed`` (Vega-Embed 7: it draws SVG). The bundle is about 0.9 MB
with its licence comments minified away, so the page is written by the ``plots_page`` stage from the installed
vl-convert and DVC-cached, not kept in git; ``.dvc/config`` names it (``plots.html_template``).
"""

from __future__ import annotations

import vl_convert as vlc

# dvc-render's built-in templates and .dvc/plots/by_rung.json declare Vega-Lite v5: the bundle compiles them with
# the newest v5 vl-convert ships (Vega 6 then draws them, with a console note that they were compiled for Vega v5).
DVC_VL_VERSION = "5.21"

# dvc-render's placeholders (dvc_render.html.HTML), replaced by plain string replacement.
PLOTS = "{plot_divs}"
PLACEHOLDERS = (PLOTS, "{scripts}", "{refresh_tag}")

_PAGE = """<!DOCTYPE html>
<html>
<head>
    <meta charset="utf-8">
    {refresh_tag}
    <title>DVC Plot</title>
    <script type="text/javascript">BUNDLE</script>
    <style>
        table {
            border-spacing: 15px;
        }
    </style>
</head>
<body>
    {plot_divs}
</body>
</html>
"""


def vega_bundle(vl_version: str = DVC_VL_VERSION) -> str:
    """Vega, Vega-Lite ``vl_version`` and Vega-Embed as one script (vl-convert's, read from the installed package)."""
    return vlc.javascript_bundle(vl_version=vl_version)


def page_template(bundle: str) -> str:
    """dvc-render's page with ``bundle`` inlined in place of its CDN ``<script src>`` tags.

    Raises ValueError when the bundle cannot sit inside a ``<script>`` element (it spells ``</script``) or spells
    one of dvc-render's placeholders, which dvc-render would replace inside the script.
    """
    if "</script" in bundle.lower():
        raise ValueError("the Vega bundle contains '</script' and cannot be inlined; use vega_bundle()")
    spelled = [p for p in PLACEHOLDERS if p in bundle]
    if spelled:
        raise ValueError(f"the Vega bundle spells {spelled[0]}, which dvc-render would replace inside the script")
    return _PAGE.replace("BUNDLE", bundle)
