"""tools/device_check.sh, the GPU check as the lent machine runs it: from a bare checkout (no editable install,
no .whl/), with `python3` the interpreter, it runs `python -m bench device` with the options it is given and
leaves the JSON and the whole log under $OUT, with the check's exit status."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def bare_checkout(root: Path) -> Path:
    """What travels to the device machine and matters here: the package, the benches, params.yaml; no venv."""
    root.mkdir()
    for name in ("topometrics", "bench", "tools", "params.yaml"):
        (root / name).symlink_to(REPO / name)
    return root


def run_check(checkout: Path, out: Path, *options: str) -> subprocess.CompletedProcess:
    # python3 is the environment's interpreter there; here this one's, with no path to the repository
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"OUT": str(out), "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"}
    return subprocess.run(
        ["bash", "tools/device_check.sh", *options], cwd=checkout, env=env, capture_output=True, text=True
    )


def test_the_device_check_runs_from_a_bare_checkout_and_leaves_its_json_and_log_in_out(tmp_path):
    out = tmp_path / "out"
    done = run_check(
        bare_checkout(tmp_path / "checkout"),
        out,
        "--tiny",
        "--device",
        "cpu",
        "--sections",
        "families",
        "--families",
        "np,vr",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "device.json").read_text())
    assert report["environment"]["python"] == sys.version.split()[0] and report["tiny"] is True
    assert set(report["families"]["seconds"]) == {"np", "vr"} and "train" not in report
    log = (out / "device.log").read_text()
    assert log.startswith("device check: Python ") and "cuda: none" in log.splitlines()[0]
    assert f"device: wrote {out / 'device.json'}" in log


def test_a_bad_option_is_the_checks_own_usage_error_and_its_status(tmp_path):
    out = tmp_path / "out"
    done = run_check(bare_checkout(tmp_path / "checkout"), out, "--sections", "train,gpu")
    assert done.returncode == 2
    assert "--sections: unknown ['gpu']" in (out / "device.log").read_text()
