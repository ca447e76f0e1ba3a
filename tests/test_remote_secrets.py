"""topometrics.remote_secrets: a DVC remote's credentials in the tracked .dvc/config stop the first stage."""

import shutil
from pathlib import Path

import pytest

from tests.helpers import REPO
from topometrics.remote_secrets import remote_secrets


def test_a_remote_credential_in_the_tracked_dvc_config_stops_the_corpus_stage_in_one_line(
    tmp_path, monkeypatch, capsys
):
    """An S3 key written without --local lands in .dvc/config, which git tracks: the first stage refuses it, naming
    the file, the remote, the option and the --local command, before any corpus work; .dvc/config.local may hold it."""
    from stages.corpus import main
    from topometrics.errors import run_stage

    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_text(
        "[core]\n    remote = shared\n['remote \"shared\"']\n    url = s3://bucket/topometrics\n"
        "    endpointurl = http://127.0.0.1:5000\n    access_key_id = AKIAEXAMPLE\n    secret_access_key = s3cr3t\n"
    )
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        run_stage(main, ["--out", "data/corpus"])
    err = capsys.readouterr().err
    assert stop.value.code == 1 and not (tmp_path / "data").exists()
    assert err == (
        "error: .dvc/config: remote 'shared' holds access_key_id (and 1 more), which git tracks; move it: dvc remote "
        "modify --local shared access_key_id <value>, then delete it from .dvc/config (rotate a key already "
        "committed)\n"
    )
    local = (tmp_path / ".dvc" / "config").read_text()
    (tmp_path / ".dvc" / "config.local").write_text(local)  # where `dvc remote modify --local` writes: not tracked
    (tmp_path / ".dvc" / "config").write_text(local.split("    access_key_id")[0])
    assert remote_secrets(Path(".dvc/config")) == [] and len(remote_secrets(Path(".dvc/config.local"))) == 2
