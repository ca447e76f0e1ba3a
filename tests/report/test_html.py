"""topometrics.report.html: the report stage reads the series stage's status file or names it in one line."""

import re
import subprocess
import sys

import pytest

from tests.helpers import REPO


@pytest.mark.parametrize("text", ["{", '{"series": [1, 2]}', "[]", '{"series": ' + "[" * 100_000 + "]" * 100_000 + "}"])
def test_a_series_status_file_that_is_not_the_series_stages_is_one_line_naming_it(tmp_path, text):
    status = tmp_path / "status.json"
    status.write_text(text)
    cmd = [sys.executable, str(REPO / "stages/report.py"), "--warehouse", str(tmp_path / "w.duckdb"),
           "--series-status", str(status), "--out", str(tmp_path / "reports")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()
    assert re.fullmatch(rf"error: {status} is not the series stage's status file( \(\w+\))?; rewrite it with "
                        r"`dvc repro -f series`", line), line  # fmt: skip
