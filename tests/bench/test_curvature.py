"""bench.curvature: each model measured in its own process, the products counted, the JSON written."""

import json

from bench.curvature import main
from tests.repo_params import features_params


def test_the_curvature_bench_measures_each_model_in_a_fresh_process_and_counts_its_products(tmp_path, capsys):
    out = tmp_path / "curvature.json"
    assert main(["--models", "xl", "--out", str(out)]) == 0
    (result,) = json.loads(out.read_text())
    params = features_params()
    assert result["model"] == "xl" and result["parameters"] == 97_200 and not result["large_model_path"]
    # a random init's top eigenvalues stay clustered: all Lanczos steps, the 3 deflation products, the least probes
    assert result["products"] == params.hessian_iters + 3 + params.hessian_probes
    assert result["reasons"] == [f"Lanczos did not converge in {params.hessian_iters} steps (features.hessian_iters)"]
    assert result["peak_rss_mb"] >= result["peak_rss_before_mb"] > 0 and result["cpu_s"] > 0
    assert "xl: 0.1M parameters, curvature: peak" in capsys.readouterr().err


def test_the_whole_surface_runs_the_hess_slice_on_a_random_init(tmp_path):
    out = tmp_path / "surface.json"
    assert main(["--models", "xl", "--whole-surface", "--out", str(out)]) == 0
    (result,) = json.loads(out.read_text())
    assert result["what"].startswith("whole surface") and result["reasons"] == []  # nothing NULL: hess slice ran
