"""topometrics.series.hub: a checkpoint's step from its revision or folder name, and hub revisions offline."""

import huggingface_hub.constants
import pytest

from topometrics.series.hub import hub_checkpoints, step_from_name


def test_uncached_revisions_offline_are_skipped_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    found = list(hub_checkpoints("acme/absent", ("step0", "main"), cache_dir=tmp_path))
    assert [(s["revision"], s["status"]) for s in found] == [("main", "skipped"), ("step0", "skipped")]
    assert "cannot tell the step" in found[0]["reason"]
    assert found[1]["reason"].startswith("not cached and not downloadable (LocalEntryNotFoundError")


def test_a_hub_revision_whose_step_the_warehouse_cannot_hold_is_skipped_before_any_download(monkeypatch, tmp_path):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    found = list(hub_checkpoints("acme/absent", ("step2147483648", "step2147483647"), cache_dir=tmp_path))
    beyond = "step 2,147,483,648 is beyond the warehouse's 32-bit step column (at most 2**31-1)"
    assert found[0] == {"revision": "step2147483648", "step": None, "status": "skipped",
                        "reason": f"revision 'step2147483648': {beyond}"}  # fmt: skip
    assert found[1]["step"] == 2**31 - 1 and found[1]["reason"].startswith("not cached and not downloadable")


@pytest.mark.parametrize(
    ("name", "step"),
    [("step0", 0), ("step143000", 143000), ("step_001000", 1000), ("checkpoint-500", 500), ("main", None)],
)
def test_step_from_name(name, step):
    assert step_from_name(name) == step
