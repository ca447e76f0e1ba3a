"""The page `dvc plots show` fills (stage `plots_page`): it draws every plot in a browser that has no network.

The end-to-end tests run the real stage and the real `dvc plots show` in a copy of this project (its dvc.yaml,
.dvc/config and .dvc/plots), then open the written page in headless Chromium with its proxy pointed at a closed
port, so anything fetched from a CDN fails. A probe script counts, per plot, the SVGs Vega drew and their drawn
lines (Vega-Embed 7, which the page inlines, renders SVG by default).
"""

import html
import json
import re
from pathlib import Path

import pytest
from dvc_render.html import PAGE_HTML

from tests.pipeline.helpers import make_project, run
from tests.report.helpers import CHROMIUM, NO_CHROMIUM, chromium
from topometrics.report.plots_page import PLACEHOLDERS, PLOTS, page_template

LOSS_CSV = "step,rung,val_loss\n0,tiny,4.2\n10,tiny,3.1\n20,tiny,2.9\n0,small,4.1\n10,small,2.8\n20,small,2.5\n"
CURVE_CSV = "step,val_loss\n0,4.2\n10,3.1\n20,2.9\n"
NP_CSV = "step,rung,np\n0,tiny,0.31\n10,tiny,0.35\n20,tiny,0.38\n0,small,0.30\n10,small,0.36\n20,small,0.41\n"
NOWHERE = "--proxy-server=127.0.0.1:9"  # the discard port: every http(s) request fails, as offline

# Injected into a copy of the page: once Vega has drawn (virtual time), each plot div's number of Vega SVGs and of
# drawn lines (paths of the line marks with a non-empty outline) go into a <pre id="drawn"> that --dump-dom prints.
DRAWN_PROBE = """<script>
setTimeout(function () {
  var out = [];
  document.querySelectorAll("body > div[id]").forEach(function (div) {
    var paths = div.querySelectorAll("svg.marks g.mark-line path");
    var lines = Array.prototype.filter.call(paths, function (p) { return p.getAttribute("d"); }).length;
    out.push({id: div.id, svgs: div.querySelectorAll("svg.marks").length, lines: lines});
  });
  var pre = document.createElement("pre"); pre.id = "drawn"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 3000);
</script>"""


def test_the_page_keeps_dvc_renders_plot_placeholder_and_leaves_out_its_cdn_scripts():
    page = page_template("window.vegaEmbed = function () {};")
    assert PLOTS in page and "{refresh_tag}" in page
    assert "{scripts}" not in page  # where dvc-render writes its CDN <script src> tags
    assert '<script type="text/javascript">window.vegaEmbed = function () {};</script>' in page
    assert "src=" not in page


@pytest.mark.parametrize("bundle", ["var a = '</SCRIPT>';", *(f"var a = '{p}';" for p in PLACEHOLDERS)])
def test_a_bundle_that_would_end_its_script_or_be_filled_by_dvc_render_is_refused(bundle):
    with pytest.raises(ValueError, match="the Vega bundle"):
        page_template(bundle)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A copy of this project with the `plots_page` stage reproduced, the report stage's two plot files and two
    runs' validation curves of the train stage (its live plots absent, as when no run is training)."""
    root = make_project(tmp_path_factory.mktemp("plots") / "project")
    run(["dvc", "repro", "plots_page"], root)
    (root / "reports/plots/loss.csv").write_text(LOSS_CSV)
    (root / "reports/plots/np.csv").write_text(NP_CSV)
    (root / "reports/curves").mkdir()
    for run_name in ("tiny-42", "small-42"):
        (root / f"reports/curves/{run_name}.csv").write_text(CURVE_CSV)
    return root


def drawn(page: Path, profile: Path) -> list[dict]:
    """Each plot div of a `dvc plots` page with its number of Vega SVGs and of drawn lines, with no network."""
    probe = page.with_name("drawn-probe.html")
    head, tail = page.read_text().rsplit("</body>", 1)
    probe.write_text(head + DRAWN_PROBE + "</body>" + tail)
    dom = chromium(probe, profile, NOWHERE, "--dump-dom").stdout
    found = re.search(r'<pre id="drawn">(.*?)</pre>', dom, flags=re.S)
    assert found, "the probe did not run"
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)
def test_dvc_plots_show_draws_every_plot_with_no_network(project, tmp_path):
    out = tmp_path / "out"
    run(["dvc", "plots", "show", "-o", str(out)], project)  # every plot of dvc.yaml
    text = (out / "index.html").read_text()
    assert not re.search(r"<script[^>]*\ssrc=", text) and "cdn.jsdelivr" not in text
    plots = drawn(out / "index.html", tmp_path / "profile")
    lines = {
        "reports_curves_small-42_csv": 2,  # DVC's linear template: the smoothed line over the raw one
        "reports_curves_tiny-42_csv": 2,
        "reports_live_plots_metrics": 0,  # no run is training: the axes, no line
        "reports_plots_loss_csv": 2,  # by_rung: one line per rung, tiny and small
        "reports_plots_np_csv": 2,
    }
    assert plots == [{"id": plot, "svgs": 1, "lines": n} for plot, n in lines.items()]


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)
def test_with_dvc_renders_own_page_the_same_plot_draws_nothing_with_no_network(project, tmp_path):
    cdn_page = tmp_path / "cdn.html"  # what `dvc plots show` writes without plots.html_template
    cdn_page.write_text(PAGE_HTML)
    out = tmp_path / "out"
    run(["dvc", "plots", "show", "reports/plots/loss.csv", "--html-template", str(cdn_page), "-o", str(out)], project)
    assert '<script src="https://cdn.jsdelivr.net/npm/vega@' in (out / "index.html").read_text()
    plots = drawn(out / "index.html", tmp_path / "profile")
    assert plots == [{"id": "reports_plots_loss_csv", "svgs": 0, "lines": 0}]
