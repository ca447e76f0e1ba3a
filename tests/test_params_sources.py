"""topometrics.params_sources: the series and compute params and their validation."""

import pytest
import yaml

from tests.helpers import REPO
from topometrics.params import ParamsError, parse_params


def test_series_params_hold_the_papers_pythia_validation_and_validate():
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    pythia = parse_params(raw).series.sources["pythia-14m"]
    assert pythia.model == "EleutherAI/pythia-14m"
    assert pythia.revisions == ("step0", "step1000", "step5000", "step10000", "step50000", "step100000", "step143000")
    for bad, message in [
        ({"sources": {"x": {}}}, "series.sources.x: give exactly one of model"),
        ({"sources": {"x": {"model": "a/b"}}}, "series.sources.x.revisions is empty"),
        ({"sources": {"x": {"path": "/p", "revisions": ["step1"]}}}, "revisions applies to model only"),
        ({"sources": {"x": {"model": "a/b", "revisions": ["s"], "typo": 1}}}, "unknown param series.sources.x.typo"),
        ({"seq_len": 0}, "series.seq_len must be positive"),
        ({"sources": {"x": {"path": "/p", "log": "/l"}}}, "give exactly one of model .* or log"),
        ({"sources": {"x": {"log": "/l", "losses": "a.csv"}}}, "series.sources.x.losses applies to path only"),
        ({"sources": {"x": {"log": "/l", "layers": {"attn.q": "a"}}}}, "layers does not apply to a monitor log"),
        ({"sources": {"x": {"path": "/p", "layers": {"attn.q": 1}}}}, "series.sources.x.layers must map names"),
    ]:
        with pytest.raises(ParamsError, match=message):
            parse_params(raw | {"series": raw["series"] | bad})
    with pytest.raises(ParamsError, match=r"^missing param series: add it to params.yaml"):
        parse_params({k: v for k, v in raw.items() if k != "series"})
