"""tools/product_memory.py: every stage of one exact product runs on a small GPT and is reported in MiB and vectors."""

from tools.product_memory import main, stages


def test_every_stage_is_reported_as_memory_above_its_start_in_mib_and_model_sized_vectors(capsys):
    found = main(["--model", "xl", "--context", "16"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("xl: one float32 vector of the model's size is ")
    assert list(found) == [
        "forward, its graph kept",
        "first backward",
        "first backward, create_graph",
        "first backward, create_graph, dots kept",
        "both passes",
    ]
    assert all(v["mib"] >= 0 and v["vectors"] >= 0 for v in found.values()) and len(lines) == 1 + len(found)


def test_the_first_stage_keeps_a_dot_per_parameter_for_the_second():
    import torch

    from bench.features import SURFACE_MODELS
    from topometrics.models.model import GPT

    model = GPT(SURFACE_MODELS["xl"])
    run = stages(model, torch.randint(0, 128, (1, 17)))
    assert len(run["first backward, create_graph, dots kept"]()) == len(list(model.parameters()))
    assert run["first backward"]() == []  # gradients dropped as they arrive, nothing kept
    assert all(p.grad is None for p in model.parameters())
