"""topometrics.report.paper: the paper's tables, keyed as the report joins them, and Table 1 against our ladder."""

from tests.helpers import REPO
from topometrics.models.model import GPT, GPTConfig, count_parameters
from topometrics.params import load_params
from topometrics.report import paper

TABLES = [getattr(paper, f"PAPER_TABLE{i}") for i in range(1, 9)]
KEYS = {"rung", "step", "fraction", "method", "target"}


def test_every_table_is_its_join_keys_then_paper_values_without_gaps():
    for table in TABLES:
        keys = [c for c in table.columns if not c.startswith("paper ")]
        assert keys and set(keys) <= KEYS, table.columns
        assert list(table.columns[: len(keys)]) == keys  # the keys first, then the paper's values
        assert not table.empty and not table[keys].duplicated().any()
        assert table[keys].notna().all().all() and table.notna().any().all()  # a value in every column


def test_table_1_lists_the_ladders_rungs_with_the_parameter_counts_our_model_has():
    params = load_params(REPO / "params.yaml")
    assert paper.PAPER_TABLE1["rung"].tolist() == list(params.ladder)
    for rung, n_params in zip(paper.PAPER_TABLE1["rung"], paper.PAPER_TABLE1["paper n_params"], strict=True):
        assert count_parameters(GPT(GPTConfig(**params.rung_shape(rung)))) == n_params, rung
    assert paper.PAPER_TABLE1["paper final loss"].is_monotonic_decreasing  # larger rungs end lower
