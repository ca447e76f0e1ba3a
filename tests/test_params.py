"""params.yaml validation: unknown keys, wrong types and impossible values name the key."""

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import RECIPES, default_raw
from topometrics.params import ParamsError, load_params, parse_params, project_params, run_name
from topometrics.training.train import build_run_config, recipe_fingerprint

REPO = Path(__file__).resolve().parents[1]


def test_the_repository_params_load_and_give_the_papers_ladder():
    params = load_params(REPO / "params.yaml")
    shapes = {rung: params.rung_shape(rung) for rung in params.ladder}
    assert shapes == {
        "tiny": {"hidden": 8, "layers": 1, "heads": 1},
        "small": {"hidden": 16, "layers": 1, "heads": 2},
        "medium": {"hidden": 24, "layers": 2, "heads": 2},
        "large": {"hidden": 32, "layers": 3, "heads": 4},
        "xl": {"hidden": 48, "layers": 3, "heads": 4},
    }
    t = params.train
    assert (t.steps, t.ckpt_every, t.batch_size, t.lr, t.warmup, t.weight_decay, t.grad_clip, t.seeds) == (
        5000,
        100,
        64,
        3e-3,
        200,
        0.01,
        1.0,
        (42,),
    )


def test_empty_rung_inherits_and_partial_rung_overrides():
    raw = default_raw()
    raw["train"]["hidden"] = 64
    raw["ladder"]["tiny"] = {"layers": 2}
    params = parse_params(raw)
    assert params.rung_shape("xl") == {"hidden": 64, "layers": 3, "heads": 4}
    assert params.rung_shape("tiny") == {"hidden": 64, "layers": 2, "heads": 4}


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("train", "hidden_size", 8, "unknown param train.hidden_size"),
        ("train", "steps", "many", "train.steps must be int"),
        ("train", "lr", True, "train.lr must be float"),
        ("train", "steps", 550, "train.steps=550 is not a multiple of train.ckpt_every=100"),
        ("train", "batch_size", 0, "train.batch_size must be positive"),
        ("train", "heads", 5, "ladder.xl: hidden=48 is not divisible by heads=5"),
        ("train", "device", "tpu", "train.device must be auto, cpu or cuda"),
        ("data", "seq_len", -1, "data.seq_len must be positive"),
        ("data", "urls", "http://x", "data.urls must be a list of str"),
        ("analysis", "fractions", [0.2, 1.5], "analysis.fractions must be shares in"),
        ("features", "max_points", 0, "features.max_points must be positive"),
        ("train", "seeds", [], "train.seeds must be a non-empty list of distinct integers"),
        ("train", "seeds", [1, 1], "train.seeds must be a non-empty list of distinct integers"),
        ("train", "seeds", [-1], "train.seeds must be a non-empty list of distinct integers"),
        ("train", "seeds", 42, "train.seeds must be a list of int"),
        ("train", "seed", 42, "unknown param train.seed: train.seed became train.seeds"),
        ("train", "monitor_every", -1, "train.monitor_every must be >= 0, got -1"),
        ("train", "monitor_every", 2.5, "train.monitor_every must be int"),
        ("train", "sketch_every", -1, "train.sketch_every must be >= 0, got -1"),
        ("train", "sketch_dim", 0, "train.sketch_dim must be positive"),
        ("train", "lr", float("nan"), "train.lr must be a finite number, got nan; write a number such as 0.001"),
        ("train", "lr", float("inf"), "train.lr must be a finite number, got inf"),
        ("train", "grad_clip", float("-inf"), "train.grad_clip must be a finite number, got -inf"),
        ("train", "min_lr_ratio", 2.0, "train.min_lr_ratio must be between 0.0 and 1.0 (the cosine's floor as a"),
        ("data", "download_timeout_s", float("inf"), "data.download_timeout_s must be a finite number"),
        ("analysis", "phase_threshold", float("inf"), "analysis.phase_threshold must be a finite number, got inf"),
        ("analysis", "phase_threshold", 1.5, "analysis.phase_threshold must be between 0.0 and 1.0 (a share of"),
        ("analysis", "alpha", 5.0, "analysis.alpha must be between 0.0 and 1.0 (a significance level"),
        ("analysis", "fractions", [0.2, float("nan")], "1] must be a finite number, got nan"),
        ("features", "max_points", 1, "features.max_points must be at least 4 (fewer points cannot form a loop"),
        ("features", "unit_points", 3, "features.unit_points must be at least 4"),
        ("features", "rep_dim", 1, "features.rep_dim must be at least 2 (a loop needs a plane"),
        ("features", "significance", 1.5, "features.significance must be between 0.0 and 1.0"),
    ],
)
def test_invalid_params_name_the_key(section, key, value, message):
    raw = default_raw()
    raw[section][key] = value
    with pytest.raises(ParamsError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_params(raw)


def test_invalid_rung_override_names_the_rung():
    raw = default_raw()
    raw["ladder"]["small"] = {"hidden": 16, "heads": 3}
    with pytest.raises(ParamsError, match=r"ladder\.small: hidden=16 is not divisible by heads=3"):
        parse_params(raw)
    raw["ladder"]["small"] = {"width": 16}
    with pytest.raises(ParamsError, match=r"unknown param ladder\.small\.width"):
        parse_params(raw)


def test_run_configs_are_one_per_rung_and_seed():
    raw = default_raw()
    raw["train"]["seeds"] = [42, 7]
    params = parse_params(raw)
    a, b = (build_run_config(params, "tiny", seed) for seed in (42, 7))
    assert (a.recipe.seed, b.recipe.seed) == (42, 7)
    assert a.model == b.model and a.recipe == dataclasses.replace(b.recipe, seed=42)
    assert run_name("tiny", 7) == "tiny-7"
    with pytest.raises(ParamsError, match=r"seed 3 is not in train\.seeds=\[42, 7\]"):
        build_run_config(params, "tiny", 3)


def test_variants_override_the_recipe_and_name_their_runs():
    raw = default_raw() | {"variants": {"lr_hi": {"lr": 0.006}, "wd0": {"weight_decay": 0}}}
    raw["train"]["seeds"] = [42, 7]
    params = parse_params(raw)
    assert params.recipe("lr_hi") == dataclasses.replace(params.train, lr=0.006)
    assert params.recipe("wd0").weight_decay == 0.0 and params.recipe("base") == params.train
    names = params.run_names()
    assert len(names) == 5 * 3 * 2 and names[:2] == ["tiny-42", "tiny-7"] and "xl-lr_hi-7" in names
    assert run_name("tiny", 7) == "tiny-7" and run_name("tiny", 7, "lr_hi") == "tiny-lr_hi-7"
    cfg = build_run_config(params, "xl", 7, "lr_hi")
    assert (cfg.name, cfg.variant, cfg.recipe.lr, cfg.recipe.seed) == ("xl-lr_hi-7", "lr_hi", 0.006, 7)
    assert build_run_config(params, "xl", 7).model == cfg.model  # a variant never changes the shape


def test_monitoring_is_off_by_default_and_never_changes_a_runs_config_or_recipe_fingerprint():
    assert load_params(REPO / "params.yaml").train.monitor_every == 0
    raw = default_raw()
    raw["train"]["monitor_every"] = 50
    monitored, plain = parse_params(raw), load_params(REPO / "params.yaml")
    assert monitored.train.monitor_every == 50
    for rung in plain.ladder:
        a, b = build_run_config(monitored, rung, 42), build_run_config(plain, rung, 42)
        assert a.to_dict() == b.to_dict()  # the config file the train stage depends on is the same text
        assert recipe_fingerprint(a, "corpus") == recipe_fingerprint(b, "corpus")  # existing runs are complete


def test_the_trajectory_sketch_is_on_by_default_and_never_changes_a_runs_config_or_recipe_fingerprint():
    plain = load_params(REPO / "params.yaml")
    assert (plain.train.sketch_every, plain.train.sketch_dim) == (10, 64)
    raw = default_raw()
    raw["train"] |= {"sketch_every": 0, "sketch_dim": 8}
    off = parse_params(raw)
    for rung in plain.ladder:
        a, b = build_run_config(off, rung, 42), build_run_config(plain, rung, 42)
        assert a.to_dict() == b.to_dict() and recipe_fingerprint(a, "corpus") == recipe_fingerprint(b, "corpus")


def test_the_default_params_declare_one_base_run_per_rung():
    params = load_params(REPO / "params.yaml")
    assert params.variants == {} and params.run_names() == ["tiny-42", "small-42", "medium-42", "large-42", "xl-42"]


def test_the_analysed_variant_must_be_declared():
    raw = default_raw()
    raw["analysis"]["variant"] = "lr_hi"
    with pytest.raises(ParamsError, match="analysis.variant='lr_hi' is not a declared variant"):
        parse_params(raw)
    assert parse_params(raw | {"variants": {"lr_hi": {"lr": 0.006}}}).analysis.variant == "lr_hi"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_cuda_device_is_a_params_error():
    raw = default_raw()
    raw["train"]["device"] = "cuda"
    with pytest.raises(ParamsError, match="train.device is cuda but no CUDA device is visible; set train.device"):
        parse_params(raw)


def test_a_variant_may_change_the_schedule_shape_and_the_default_recipe_stays_byte_identical():
    raw = default_raw() | {"variants": {"wsd": {"schedule": "wsd", "decay_fraction": 0.25}}}
    params = parse_params(raw)
    assert (params.train.schedule, params.recipe("wsd").schedule, params.recipe("wsd").decay_fraction) == (
        "cosine", "wsd", 0.25,
    )  # fmt: skip
    base, wsd = build_run_config(params, "tiny", 42), build_run_config(params, "tiny", 42, "wsd")
    assert "schedule" not in base.to_dict()["recipe"] and "decay_fraction" not in base.to_dict()["recipe"]
    assert wsd.to_dict()["recipe"]["schedule"] == "wsd" and wsd.recipe.lr_schedule.decay_start == 3750
    # the fingerprint of a cosine recipe is the hash of the keys recipes had before the shapes existed
    old_keys = ("steps", "ckpt_every", "batch_size", "lr", "warmup", "min_lr_ratio", "weight_decay", "grad_clip")
    old_recipe = {k: getattr(base.recipe, k) for k in (*old_keys, "seed", "val_windows")}
    body = json.dumps({"model": base.model.to_dict(), "recipe": old_recipe, "corpus": "c"}, sort_keys=True)
    assert recipe_fingerprint(base, "c") == hashlib.sha256(body.encode()).hexdigest()[:16]
    assert recipe_fingerprint(wsd, "c") != recipe_fingerprint(base, "c")


@pytest.mark.parametrize(
    ("variant", "message"),
    [
        ({"schedule": "linear"}, "variants.v.schedule must be cosine, wsd or constant_decay, got 'linear'"),
        ({"decay_fraction": 0}, "variants.v.decay_fraction must be positive"),
        ({"decay_fraction": 1.5}, "variants.v.decay_fraction must be between 0.0 and 1.0"),
    ],
)
def test_a_bad_schedule_shape_names_the_key(variant, message):
    with pytest.raises(ParamsError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_params(default_raw() | {"variants": {"v": variant}})


def test_a_rung_without_residual_connections_says_so_and_the_others_keep_their_shape():
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["ladder"]["small-noskip"] = {**(raw["ladder"]["small"] or {}), "residual": False}
    params = parse_params(raw)
    assert params.rung_shape("small-noskip") == params.rung_shape("small") | {"residual": False}
    assert "residual" not in params.rung_shape("small")
    raw["ladder"]["small-noskip"]["residual"] = "no"
    with pytest.raises(ParamsError, match="ladder.small-noskip.residual"):
        parse_params(raw)


@pytest.mark.parametrize(
    ("primary", "message"),
    [
        ({"family": "weights_vr", "features": ["a", "b", "c", "d"], "fraction": 0.3, "cv": "rung"}, "at most 3"),
        ({"fraction": 0.3, "cv": "rung"}, "declare a family"),
        ({"family": "weights_np", "fraction": 0.4, "cv": "rung"}, "fraction 0.4 is not in analysis.fractions"),
        ({"family": "weights_np", "fraction": 0.3, "cv": "seed"}, "cv 'seed' needs >= 3 groups"),
        ({"family": "weights_np", "fraction": 0.3, "cv": "rung", "baseline": "x"}, "baseline 'x': 'recipe', 'norm' or"),
        ({"family": "weights_np", "cv": "rung"}, "fraction 0.0 is not in analysis.fractions"),
    ],
)
def test_a_primary_endpoint_the_sweep_does_not_compute_is_a_params_error(primary, message):
    raw = default_raw() | {"variants": RECIPES}
    raw["analysis"]["primary"] = primary
    with pytest.raises(ParamsError, match=message):
        parse_params(raw)


def test_a_primary_endpoint_of_up_to_three_declared_features_loads():
    raw = default_raw() | {"variants": RECIPES}
    raw["analysis"]["primary"] = {"family": "weights_vr", "features": ["vr_tp0"], "fraction": 0.3, "cv": "rung"}
    primary = parse_params(raw).analysis.primary
    assert (primary.family, primary.features, primary.fraction, primary.cv, primary.baseline, primary.level) == (
        "weights_vr", ("vr_tp0",), 0.3, "rung", "recipe", "between"
    )  # fmt: skip


def test_the_coming_sweeps_endpoint_between_cells_over_recipe_and_curvature_loads():
    raw = default_raw() | {"variants": {f"r{i:02d}": {"lr": 0.001 * (i + 1)} for i in range(15)}}
    raw["ladder"] = {name: raw["ladder"][name] for name in ("tiny", "small", "medium")}
    raw["train"]["seeds"] = [1, 2]
    endpoint = {"family": "landscape", "features": ["ls_rand_range"], "fraction": 0.2, "level": "between"}
    raw["analysis"]["primary"] = endpoint | {"cv": "variant", "baseline": "recipe+curvature"}
    raw["analysis"]["fractions"] = [0.2, 0.3, 0.5]
    primary = parse_params(raw).analysis.primary
    assert (primary.level, primary.cv, primary.baseline) == ("between", "variant", "recipe+curvature")


def test_a_loss_unit_other_than_nats_or_bpb_is_one_params_error_naming_the_key():
    raw = default_raw()
    raw["analysis"] = (raw.get("analysis") or {}) | {"loss_unit": "bits"}
    with pytest.raises(ParamsError, match=r"^analysis\.loss_unit must be nats or bpb \(bits per byte\), got 'bits'$"):
        parse_params(raw)
    raw["analysis"]["loss_unit"] = "bpb"
    assert parse_params(raw).analysis.loss_unit == "bpb"


@pytest.mark.parametrize(
    ("tokenizer", "message"),
    [
        (
            {"kind": "bpe", "vocab_size": 256},
            r"^data\.tokenizer\.vocab_size must be between 257 and 65535 \(256 bytes.*got 256$",
        ),
        (
            {"kind": "bpe", "vocab_size": 65_536},
            r"^data\.tokenizer\.vocab_size must be between 257 and 65535 .*got 65536$",
        ),
        (
            {"kind": "wordpiece", "vocab_size": 512},
            r"^data\.tokenizer\.kind must be char or bpe, got 'wordpiece'; e\.g\.",
        ),
        ("sentencepiece", r"^data\.tokenizer\.kind must be char or bpe, got 'sentencepiece'"),
        ({"kind": "bpe", "vocab": 512}, r"data\.tokenizer.*vocab"),
    ],
)
def test_a_bad_tokenizer_is_one_params_error_naming_the_key(tokenizer, message):
    raw = default_raw()
    raw["data"] = raw["data"] | {"tokenizer": tokenizer}
    with pytest.raises(ParamsError, match=message) as caught:
        parse_params(raw)
    assert "\n" not in str(caught.value)
    raw["data"]["tokenizer"] = {"kind": "bpe", "vocab_size": 257}  # the edges are valid
    assert parse_params(raw).data.tokenizer.vocab_size == 257
    raw["data"]["tokenizer"] = {"kind": "bpe", "vocab_size": 65_535}
    assert parse_params(raw).data.tokenizer.vocab_size == 65_535


def test_a_train_shape_key_every_rung_overrides_is_one_line_at_the_config_stage():
    from stages.config import inherited_by_no_run

    assert inherited_by_no_run(parse_params(default_raw())) is None  # xl inherits train's shape
    raw = default_raw()
    raw["ladder"] = {"a": {"hidden": 8, "layers": 1, "heads": 1}, "b": {"hidden": 16, "heads": 2}}
    raw["train"]["hidden"] = 64
    assert inherited_by_no_run(parse_params(raw)) == (
        "config: note: train.hidden = 64, train.heads = 4: no run inherits it (every ladder rung sets its own), "
        "so changing it changes nothing; set ladder.<rung>.hidden instead"
    )  # train.layers is b's, so it is not named


def _config_stage(raw: dict, tmp_path: Path, capsys) -> str:
    """stderr of the real config stage (its ``main`` in ``run_stage``) over params ``raw``; it must exit 1 writing
    no config, before any corpus is read or run trained."""
    from stages.config import main
    from topometrics.errors import run_stage

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    argv = ["--params", str(tmp_path / "params.yaml"), "--corpus", str(tmp_path / "corpus"), "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as stop:
        run_stage(main, [*argv[:-1], str(tmp_path / "config")])
    assert stop.value.code == 1 and not (tmp_path / "config").exists()
    return capsys.readouterr().err


LONG = "r" * 300


@pytest.mark.parametrize(
    ("section", "change", "expected"),
    [
        ("train", {"seeds": [2**63]}, "error: train.seeds: seed 9223372036854775808 is outside 0 to 2**31-1"),
        ("train", {"seeds": [2**64]}, "error: train.seeds: seed 18446744073709551616 is outside 0 to 2**31-1"),
        ("series", {"sources": {"x": {"path": "/p", "seed": 2**40}}}, "error: series.sources.x.seed: seed 1099511"),
        ("ladder", {LONG: {}}, "error: ladder: the name 'rrrrrrrr"),
        ("variants", {LONG: {"lr": 0.01}}, "error: variants: the name 'rrrrrrrr"),
        ("series", {"sources": {LONG: {"path": "/p"}}}, "error: series.sources: the name 'rrrrrrrr"),
        ("ladder", {"tiny/../x": {}}, "error: ladder: the name 'tiny/../x' must be 1 to 64 ASCII letters"),
        ("series", {"sources": {"tiny": {"path": "/p"}}}, "error: series.sources.tiny: a series may not share a rung"),
        ("train", {"device": "x" * 1_000_000}, "error: train.device must be auto, cpu or cuda, got 'xxxx"),
        ("data", {"corpus": ["y" * 1_000_000]}, "error: data.corpus must be str, got ['yyyy"),
    ],
)
def test_seeds_names_and_huge_values_stop_the_config_stage_in_one_short_line_naming_the_key(
    section, change, expected, tmp_path, capsys
):
    """Seeds beyond 32 bits (the warehouse's column; 2**64 overflowed torch), names of 300 characters or with a
    '/', a series named like a rung and a 1 MB string (10 MB reads the same, slower): one line of at most ~300
    characters naming the key."""
    raw = default_raw()
    raw[section] = raw[section] | change
    err = _config_stage(raw, tmp_path, capsys)
    assert err.startswith(expected) and err.count("\n") == 1 and len(err) <= 310, err[:400]


# ---------------------------------------------------------------- params.yaml is the one place a value lives

OPTIONAL_SECTIONS = ("variants",)  # absent: no variants (docs/params.md, *Required keys*)
OPEN_MAPS = ("ladder", "series.sources")  # user-named entries: deleting one drops that rung or series


def required_keys(tree: dict, prefix: str = "") -> list[str]:
    """Every key the repository's params.yaml sets that must be there, read from the file: each section but
    ``variants`` and each key in it, down to the open maps (whose entries are the user's to add or drop)."""
    keys = []
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if name in OPTIONAL_SECTIONS:
            continue
        keys.append(name)
        if isinstance(value, dict) and name not in OPEN_MAPS:
            keys += required_keys(value, f"{name}.")
    return keys


REQUIRED = required_keys(default_raw())


def test_the_required_keys_are_read_from_params_yaml():
    assert {"train.lr", "features.max_points", "series.sources", "compute.cluster"} <= set(REQUIRED)
    assert len(REQUIRED) > 60 and "variants" not in REQUIRED and not any(k.startswith("ladder.") for k in REQUIRED)


@pytest.mark.parametrize("key", REQUIRED)
def test_a_key_missing_from_params_yaml_stops_the_config_stage_in_one_line_naming_it(key, tmp_path, capsys):
    """No code default stands in for a key params.yaml sets: deleting it stops the first stage, before any work,
    with one line naming the key and the fix."""
    raw = default_raw()
    *parents, last = key.split(".")
    section = raw
    for part in parents:
        section = section[part]
    del section[last]
    err = _config_stage(raw, tmp_path, capsys)
    assert err.startswith(f"error: missing param {key}: add it to params.yaml (docs/params.md") and err.count("\n") == 1
    with pytest.raises(ParamsError, match=f"^missing param {key}: "):
        parse_params(raw)


def test_the_params_dataclasses_hold_no_default_for_a_key_params_yaml_sets():
    """dataclasses.fields of each section against the keys the file sets: a default there would be a second
    copy of the value, one DVC does not track."""
    import typing

    from topometrics.params import Params

    def defaulted(cls: type, keys) -> list[str]:
        by_name = {f.name: f for f in dataclasses.fields(cls)}
        return [k for k in keys if by_name[k].default is not dataclasses.MISSING
                or by_name[k].default_factory is not dataclasses.MISSING]  # fmt: skip

    raw, hints = default_raw(), typing.get_type_hints(Params)
    found = list(defaulted(Params, [k for k in raw if k not in OPTIONAL_SECTIONS]))
    for section, values in raw.items():
        if dataclasses.is_dataclass(hints[section]):
            found += [f"{section}.{k}" for k in defaulted(hints[section], values)]
    assert found == []
    assert dataclasses.is_dataclass(hints["train"]) and dataclasses.is_dataclass(hints["series"])


def test_the_package_reads_the_projects_params_yaml_through_a_link_not_a_copy():
    linked = REPO / "topometrics" / "params.yaml"
    assert linked.is_symlink() and linked.resolve() == (REPO / "params.yaml").resolve()
    assert project_params() == load_params(REPO / "params.yaml")
