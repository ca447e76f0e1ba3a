"""External checkpoint series: tiny GPT-NeoX models built here, read back through local folders, a
local Hugging Face cache (offline, in a subprocess running the stage) and bare safetensors files.
Every series goes through series_shards, the stage's path, and its shards are read back."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, GPTNeoXConfig, GPTNeoXForCausalLM, PreTrainedTokenizerFast

from tests.repo_params import features_params, series_params
from topometrics import vocabulary
from topometrics.features import checkpoint, forward
from topometrics.features.run_shards import read_tables
from topometrics.models.tokens import encode
from topometrics.params import parse_params, project_params
from topometrics.params_sources import SeriesSource
from topometrics.series.checkpoint import causal_lm_on_batch
from topometrics.series.source_shards import grouped_lines, series_shards, summary_line
from topometrics.training.corpus import offline_text

REPO = Path(__file__).resolve().parents[2]
PARAMS = features_params(max_points=20, rep_points=60, rep_dim=5, rep_batch=2, betti_scales=4, workers=1)
SEQ_LEN = 16
TEXT = offline_text()[:60_000]
ENTRIES = {"step0": 0, "step_000010": 10, "checkpoint-20": 20}  # folder name -> step
# Written out independently of topometrics.series.checkpoint.NEOX_LINEAR: our part -> NeoX module.
MAPPING = [
    ("attn.qkv", "attention.query_key_value"),
    ("attn.out", "attention.dense"),
    ("mlp.in", "mlp.dense_h_to_4h"),
    ("mlp.out", "mlp.dense_4h_to_h"),
]


def tiny_neox(seed: int) -> GPTNeoXForCausalLM:
    cfg = GPTNeoXConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=300
    )
    model = GPTNeoXForCausalLM(cfg)
    gen = torch.Generator().manual_seed(seed)  # explicit generator: no global random state
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


def save_tokenizer(folder: Path) -> None:
    """A byte-level BPE tokenizer with 300 ids, trained here on local text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([TEXT[:20_000]], trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)


@pytest.fixture(scope="module")
def local_series(tmp_path_factory):
    """A folder of three save_pretrained checkpoints plus the tokenizer; and the models in memory."""
    root = tmp_path_factory.mktemp("series")
    save_tokenizer(root)
    models_by_step = {}
    for seed, (name, step) in enumerate(ENTRIES.items()):
        models_by_step[step] = tiny_neox(seed)
        models_by_step[step].save_pretrained(root / name, safe_serialization=True)
    return root, models_by_step


@dataclass
class Series:
    """One source's series_shards run, read back."""

    status: list[dict]  # its status checkpoints
    features: pd.DataFrame  # the features and distances (*_prev) rows of its shards
    diagrams: pd.DataFrame
    losses: pd.DataFrame  # the checkpoints table's rows


def one_series(out: Path, name: str, source: SeriesSource) -> Series:
    """series_shards of one source into ``out`` (a fresh folder: nothing reused), and its shards read back."""
    result = series_shards(series_params(sources={name: source}, seq_len=SEQ_LEN), PARAMS, TEXT, out)
    (status,) = result.status["series"]
    return Series(status["checkpoints"], *read_tables(out), result.losses)


@pytest.fixture(scope="module")
def local_result(local_series, tmp_path_factory):
    root, _ = local_series
    return one_series(tmp_path_factory.mktemp("local-shards"), "tiny", SeriesSource(path=str(root)))


def values(frame: pd.DataFrame, step: int) -> dict[tuple[str, str], float]:
    frame = frame[frame["step"] == step]
    return {(r.layer, r.feature): r.value for r in frame.itertuples()}


def in_memory_weights(model: GPTNeoXForCausalLM) -> dict[str, np.ndarray]:
    state = model.state_dict()
    return {
        f"block{i}.{part}": state[f"gpt_neox.layers.{i}.{module}.weight"].numpy()
        for i in range(model.config.num_hidden_layers)
        for part, module in MAPPING
    }


# ---------------------------------------------------------------------------
# Features equal the direct computation on the in-memory models
# ---------------------------------------------------------------------------


def test_streamed_weight_features_equal_weight_features_on_the_in_memory_weights(local_series, local_result):
    _, models_by_step = local_series
    for step, model in models_by_step.items():
        direct = checkpoint.weight_features(in_memory_weights(model), PARAMS)
        got = values(local_result.features, step)
        assert len(direct.rows) > 8 * 10  # every layer and the aggregates
        for layer, name, value, _ in direct.rows:
            assert got[(layer, name)] == pytest.approx(value, rel=1e-12, abs=1e-12, nan_ok=True), (step, layer, name)


def test_representation_features_equal_the_in_memory_model_on_the_same_tokens(local_series, local_result):
    root, models_by_step = local_series
    ids = AutoTokenizer.from_pretrained(root)(TEXT, add_special_tokens=False)["input_ids"]

    x, y = forward.validation_batch(np.asarray(ids), SEQ_LEN, PARAMS.rep_batch)
    for step, model in models_by_step.items():
        states, grads, loss = causal_lm_on_batch(model, x, y)[:3]
        assert list(grads) == list(in_memory_weights(model))
        with torch.no_grad():
            out = model(input_ids=x, output_hidden_states=True)
        # the states are the last block's output before the final layer norm (our convention)
        final = model.gpt_neox.final_layer_norm(torch.from_numpy(states).float())
        torch.testing.assert_close(final, out.hidden_states[-1].reshape(-1, 32), rtol=1e-5, atol=1e-5)
        assert loss == pytest.approx(float(torch.nn.functional.cross_entropy(out.logits.reshape(-1, 300), y.ravel())))
        expected = checkpoint.representation_features(states, PARAMS)
        got = values(local_result.features, step)
        for layer, name, value, _ in expected.rows:
            assert got[(layer, name)] == pytest.approx(value, rel=1e-9, abs=1e-12, nan_ok=True), (step, name)
        for name, value in grads.items():
            assert got[(name, "grad_norm")] == pytest.approx(value, rel=1e-6)


def test_a_series_batch_bpb_is_its_summed_cross_entropy_over_the_bytes_of_its_own_tokens(local_series, local_result):
    from tests.models.helpers import gpt2_byte_symbols

    root, models_by_step = local_series
    tokenizer = AutoTokenizer.from_pretrained(root)
    ids = np.asarray(tokenizer(TEXT, add_special_tokens=False)["input_ids"])

    x, y = forward.validation_batch(ids, SEQ_LEN, PARAMS.rep_batch)
    symbols = gpt2_byte_symbols()  # the byte-level tokens' bytes, independently of the tokenizer's decoder
    n_bytes = sum(len(bytes(symbols[c] for c in tokenizer.convert_ids_to_tokens(int(i)))) for i in y.ravel())
    for step, model in models_by_step.items():
        with torch.no_grad():
            logits = model(input_ids=x).logits
        nats = float(torch.nn.functional.cross_entropy(logits.reshape(-1, 300), y.ravel(), reduction="sum"))
        got = values(local_result.features, step)[("all", "batch_bpb")]
        assert got == pytest.approx(nats / np.log(2) / n_bytes, rel=1e-5), step


def test_local_folder_steps_come_from_names_and_distances_from_the_previous_checkpoint(local_result):
    assert [s["step"] for s in local_result.status] == [0, 10, 20]
    assert all(s["status"] == "computed" for s in local_result.status)
    frame = local_result.features
    first = frame[(frame["step"] == 0) & (frame["feature"] == "vr_w1_prev")]
    assert first["value"].isna().all() and (first["reason"] == "first checkpoint: no previous diagram").all()
    later = frame[(frame["step"] > 0) & frame["feature"].isin(["vr_w1_prev", "rep_bneck_prev"])]
    assert later["value"].notna().all() and (later["value"] > 0).all()
    assert set(frame.columns) == {*checkpoint.FEATURE_COLUMNS, "series", "revision"}
    assert (frame["rung"] == "tiny").all()
    diagrams = local_result.diagrams
    assert set(diagrams["source"]) == {"weights", "representation"}
    assert np.isfinite(diagrams["death"]).all()


def test_bare_safetensors_files_with_sidecar_steps_and_the_series_config(local_series, local_result, tmp_path):
    root, models_by_step = local_series
    bare = tmp_path / "bare"
    bare.mkdir()
    for step, model in models_by_step.items():
        save_file(model.state_dict(), str(bare / f"weights-{chr(97 + step // 10)}.safetensors"))
        (bare / f"weights-{chr(97 + step // 10)}.json").write_text(json.dumps({"step": step}))
    result = one_series(tmp_path / "shards", "bare", SeriesSource(path=str(bare)))
    # no config.json yet: weight features only, model rows NULL with the reason
    assert [s["step"] for s in result.status] == [0, 10, 20]
    frame = result.features
    rep = frame[frame["feature"] == "rep_tp0"]
    assert rep["value"].isna().all() and rep["reason"].str.contains("config.json").all()
    # every forward-pass family (loss surface, curvature, gradient clouds) is NULL with that reason, none missing
    forward = frame[frame["feature"].str.match(r"^(ls_|hess_|gt_)")]
    assert {"ls_hess_saddles", "hess_eig1", "hess_trace", "gt_tp0", "gt_net_tp0", "gt_noise_scale"} <= set(
        forward["feature"]
    )
    assert forward["value"].isna().all() and forward["reason"].str.contains("config.json").all()
    assert values(result.features, 10)[("all", "np_norm")] == values(local_result.features, 10)[("all", "np_norm")]
    # with the series' config.json and tokenizer beside the files, everything equals the folder run
    shutil.copy(root / "step0" / "config.json", bare)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(root / name, bare)
    # a new folder: the shards' fingerprint is of the weight files, so the first run's would be reused
    result = one_series(tmp_path / "shards-with-config", "bare", SeriesSource(path=str(bare)))
    for step in ENTRIES.values():
        got, want = values(result.features, step), values(local_result.features, step)
        assert got.keys() == want.keys()
        bad = [k for k in want if not (got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-12) or np.isnan(want[k]))]
        assert not bad, [(k, got[k], want[k]) for k in bad]


# ---------------------------------------------------------------------------
# Corrupt files, divergence, offline
# ---------------------------------------------------------------------------


def test_truncated_and_corrupt_files_are_skipped_naming_the_file_and_the_others_kept(local_series, tmp_path):
    root, _ = local_series
    shutil.copytree(root, tmp_path / "s")
    truncated = tmp_path / "s" / "step_000010" / "model.safetensors"
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    garbage = tmp_path / "s" / "checkpoint-20" / "model.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!" + garbage.read_bytes()[24:])
    result = one_series(tmp_path / "shards", "tiny", SeriesSource(path=str(tmp_path / "s")))
    status = {s["step"]: s for s in result.status}
    assert status[0]["status"] == "computed"
    for step, path in ((10, truncated), (20, garbage)):
        assert status[step]["status"] == "skipped"
        assert status[step]["reason"].startswith(f"{path}: not a readable safetensors file")
    assert set(result.features["step"]) == {0}


def test_a_folder_of_pickle_weights_is_skipped_with_the_reason_and_how_to_convert(local_series, tmp_path):
    root, _ = local_series
    shutil.copytree(root, tmp_path / "s")
    (tmp_path / "s" / "step_000030").mkdir()
    (tmp_path / "s" / "step_000030" / "pytorch_model.bin").write_bytes(b"a pickle that is never opened")
    result = one_series(tmp_path / "shards", "tiny", SeriesSource(path=str(tmp_path / "s")))
    status = {s["revision"]: s for s in result.status}
    assert status["step_000030"]["status"] == "skipped" and status["step_000030"]["step"] == 30
    reason = status["step_000030"]["reason"]
    weights = tmp_path / "s" / "step_000030" / "pytorch_model.bin"
    assert reason.startswith(f"{weights}: pickle weights are never opened; convert it once, where you trust the file")
    assert f"torch.load('{weights}', map_location='cpu', weights_only=True)" in reason
    assert reason.endswith(f"'{weights.parent / 'model.safetensors'}')\"")
    assert status["step_000010"]["status"] == "computed"
    only = tmp_path / "only"
    only.mkdir()
    (only / "pytorch_model.bin").write_bytes(b"")
    result = one_series(tmp_path / "shards-only", "only", SeriesSource(path=str(only)))
    found = [(s["status"], s["reason"].split(":")[0]) for s in result.status]
    assert found == [("skipped", str(only / "pytorch_model.bin"))]


def test_a_diverged_checkpoint_gives_nulls_with_the_reason(local_series, tmp_path):
    model = tiny_neox(7)
    with torch.no_grad():
        model.gpt_neox.layers[1].mlp.dense_4h_to_h.weight[0, 0] = float("nan")
    model.save_pretrained(tmp_path / "run" / "step5", safe_serialization=True)
    with pytest.warns(RuntimeWarning, match="diverged"):
        result = one_series(tmp_path / "shards", "d", SeriesSource(path=str(tmp_path / "run")))
    frame = result.features
    frame = frame[~frame["feature"].str.endswith("_prev") & ~frame["feature"].str.startswith("traj_")]  # distances
    assert frame["value"].isna().all() and frame["reason"].str.startswith("diverged").all()
    assert {"np_norm", "rep_tp0", "grad_norm"} <= set(frame["feature"])


def populate_hf_cache(hub: Path, repo_id: str, revisions: dict[str, Path], extra: list[Path]) -> None:
    """Lay out a Hugging Face hub cache: blobs named by sha256, snapshots of symlinks, refs."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    for revision, folder in revisions.items():
        commit = hashlib.sha1(str(folder).encode()).hexdigest()
        (repo / "refs" / revision).write_text(commit)
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        for file in [*folder.iterdir(), *extra]:
            blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
            shutil.copy(file, blob)
            if not (snapshot / file.name).exists():
                (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))


def test_stage_reads_hub_revisions_from_a_local_cache_offline(local_series, local_result, tmp_path):
    root, _ = local_series
    tokenizer_files = [root / "tokenizer.json", root / "tokenizer_config.json"]
    revisions = {"step0": root / "step0", "step20": root / "checkpoint-20"}
    revisions["step40"] = revisions["step20"]  # a branch serving the same files as another
    populate_hf_cache(tmp_path / "hf" / "hub", "acme/tiny-neox", revisions, tokenizer_files)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["features"].update(max_points=20, rep_points=60, rep_dim=5, rep_batch=2, betti_scales=4, workers=1)
    wanted = ["step0", "step20", "step30", "step40"]  # step30 is not cached
    # named unlike params.yaml's rungs (a series named like a rung is refused: its rows would mix into the rung's)
    params["series"] = {"seq_len": SEQ_LEN, "sources": {"neox": {"model": "acme/tiny-neox", "revisions": wanted}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "data" / "corpus").mkdir(parents=True)
    encode(TEXT).tofile(tmp_path / "data" / "corpus" / "val.u8")
    env = os.environ | {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    cmd = [sys.executable, str(REPO / "stages" / "series.py"), "--corpus", "data/corpus", "--out", "data/series"]
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "series neox: 3 computed, 0 reused, 1 skipped" in run.stdout
    status = json.loads((tmp_path / "data" / "series" / "status.json").read_text())["series"][0]
    by_revision = {c["revision"]: c for c in status["checkpoints"]}
    assert by_revision["step30"]["status"] == "skipped"
    assert "LocalEntryNotFoundError" in by_revision["step30"]["reason"]
    assert by_revision["step40"]["duplicate_of"] == "step20" and by_revision["step20"]["duplicate_of"] is None
    shards = tmp_path / "data" / "series"
    frame = pd.concat([pd.read_parquet(p) for p in sorted(shards.glob("rung=neox/**/features.parquet"))])
    assert set(frame["series"]) == {"acme/tiny-neox"} and set(frame["step"]) == {0, 20, 40}
    got = {(r.step, r.layer, r.feature): r.value for r in frame.itertuples()}
    for step in (0, 20):  # distances differ at 20: its previous checkpoint here is 0, there 10
        for (layer, name), value in values(local_result.features, step).items():
            if not name.endswith("_prev") and not name.startswith("traj_"):  # both in the distances table
                assert got[(step, layer, name)] == pytest.approx(value, rel=1e-9, abs=1e-12, nan_ok=True)
    assert sum(len(pd.read_parquet(p)) for p in shards.glob("rung=neox/**/diagrams.parquet")) > 0
    distances = pd.concat([pd.read_parquet(p) for p in sorted(shards.glob("rung=neox/**/distances.parquet"))])
    assert set(distances["step"]) == {0, 20, 40} and set(distances["revision"]) == {"step0", "step20", "step40"}
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "series neox: 0 computed, 3 reused, 1 skipped" in again.stdout  # current shards are not recomputed


# ---------------------------------------------------------------------------
# Pieces: names, dtypes, params
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# Any decoder family, run folders, live logs, bad input
# ---------------------------------------------------------------------------

FAMILIES = {
    "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64},
    "llama": {"num_key_value_heads": 2},
    "mistral": {"num_key_value_heads": 2},
    "qwen2": {"num_key_value_heads": 2},
    "olmo2": {},
    "phi": {},
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_streams_to_the_in_memory_features_with_its_forward_pass(local_series, tmp_path, family):
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.models.helpers import module_weights

    root, _ = local_series
    common = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
    config = AutoConfig.for_model(family, vocab_size=300, **(common if family != "gpt2" else {}), **FAMILIES[family])
    model = AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(tmp_path / "run" / "checkpoint-7")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(root / name, tmp_path / "run")
    result = one_series(tmp_path / "shards", family, SeriesSource(path=str(tmp_path / "run")))
    assert [c["status"] for c in result.status] == ["computed"]
    got = values(result.features, 7)
    for layer, name, value, _ in checkpoint.weight_features(module_weights(model), PARAMS).rows:
        assert got[(layer, name)] == value or np.isnan(value) and np.isnan(got[(layer, name)]), (layer, name)
    forward_rows = {k: v for k, v in got.items() if k[1] in ("grad_norm", "batch_loss", "rep_tp0")}
    assert len(forward_rows) == len(module_weights(model)) + 3 and all(np.isfinite(list(forward_rows.values())))
    losses = result.losses  # a Trainer folder without trainer_state.json: NULL with the reason
    assert losses["val_loss"].isna().all() and losses["reason"].iloc[0].startswith("no trainer_state.json")


def test_run_folder_losses_and_a_live_log_reach_the_checkpoints_table(local_series, tmp_path):
    from topometrics.features.monitor import TopologyMonitor

    root, models_by_step = local_series
    run = tmp_path / "run"
    shutil.copytree(root, run)
    (run / "losses.jsonl").write_text('{"step": 0, "loss": 5.5, "eval_loss": 5.6}\n{"step": 10, "loss": 4.5}\n')
    (run / "step_30.pt").write_bytes(b"a pickle is never opened")
    with TopologyMonitor(tmp_path / "live", every=10, params=PARAMS, log=lambda _: None) as monitor:
        for step, model in models_by_step.items():
            monitor.step(model, step, loss=float(step))
    sources = {
        "folder": SeriesSource(path=str(run), losses=str(run / "losses.jsonl")),
        "live": SeriesSource(log=str(tmp_path / "live"), seed=3),
        "nothing": SeriesSource(log=str(tmp_path / "absent")),
    }
    params = parse_params(yaml.safe_load((REPO / "params.yaml").read_text())).series
    result = series_shards(replace(params, sources=sources, seq_len=SEQ_LEN), PARAMS, TEXT, tmp_path / "shards")
    checkpoints, (features, _) = result.losses, read_tables(tmp_path / "shards")
    by_name = {s["name"]: s for s in result.status["series"]}
    assert (by_name["folder"]["computed"], by_name["folder"]["skipped"]) == (3, 1)
    pickle = next(c for c in by_name["folder"]["checkpoints"] if c["revision"] == "step_30.pt")
    assert "pickle weights are never opened" in pickle["reason"] and "weights_only=True" in pickle["reason"]
    assert (by_name["live"]["computed"], by_name["nothing"]["skipped"]) == (3, 1)
    rows = checkpoints.set_index(["rung", "step"])
    assert rows.loc[("folder", 0), "val_loss"] == 5.6 and np.isnan(rows.loc[("folder", 10), "val_loss"])
    assert rows.loc[("folder", 20), "reason"] == "the losses file has no row for step 20"
    assert rows.loc[("live", 10), "train_loss"] == 10.0 and set(checkpoints[checkpoints.rung == "live"].seed) == {3}
    live = result.logged[result.logged["rung"] == "live"]  # a monitor log's rows are read, not shards
    folder = features[(features["rung"] == "folder") & (features["step"] == 10)]
    shared = live[live["step"] == 10].merge(folder, on=["layer", "feature"])  # same weights, same values
    assert len(shared) > 50 and (shared["value_x"] == shared["value_y"]).all()


def test_unknown_architecture_and_a_layers_option_that_maps_it(tmp_path):
    gen = torch.Generator().manual_seed(0)
    state = {f"enc.blk.{b}.{m}.weight": torch.randn(8, 6, generator=gen) for b in range(2) for m in ("wa", "wb")}
    (tmp_path / "run").mkdir()
    save_file(state, str(tmp_path / "run" / "step_5.safetensors"))
    result = one_series(tmp_path / "shards", "u", SeriesSource(path=str(tmp_path / "run")))
    (skip,) = result.status
    assert skip["status"] == "skipped" and "unknown architecture" in skip["reason"]
    assert "enc.blk.{i}.wa.weight (8, 6)" in skip["reason"] and "layers: {attn.qkv:" in skip["reason"]
    layers = {"attn.qkv": r"enc\.blk\.(\d+)\.wa\.weight", "attn.out": r"enc\.blk\.(\d+)\.wb\.weight"}
    result = one_series(tmp_path / "shards-mapped", "u", SeriesSource(path=str(tmp_path / "run"), layers=layers))
    got = values(result.features, 5)
    want = checkpoint.weight_features({f"block{b}.attn.{p}": state[f"enc.blk.{b}.{m}.weight"].numpy()
                                 for b in range(2) for p, m in (("qkv", "wa"), ("out", "wb"))}, PARAMS)  # fmt: skip
    assert all(got[(la, n)] == v or np.isnan(v) and np.isnan(got[(la, n)]) for la, n, v, _ in want.rows)
    assert got[("all", "rep_tp0")] != got[("all", "rep_tp0")]  # no config.json: NULL forward rows
    result = one_series(tmp_path / "shards-bad", "u",
                        SeriesSource(path=str(tmp_path / "run"), layers=layers | {"attn.q": r"x\.(\d+)"}))  # fmt: skip
    assert "layers.attn.q ('x\\\\.(\\\\d+)') matches no 2-D tensor" in result.status[0]["reason"]


def test_a_folder_with_an_unknown_layer_name_is_one_line_with_the_count_and_the_layers_fix(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    for step in (10, 20, 30):
        save_file(
            {f"blocks.{i}.attn.mystery.weight": torch.randn(8, 8) for i in (0, 1)}, folder / f"step_{step}.safetensors"
        )
    lines = []
    params = series_params(sources={"mine": SeriesSource(path=str(folder))}, seq_len=SEQ_LEN)
    result = series_shards(params, PARAMS, TEXT, tmp_path / "out", progress=lines.append)
    skipped = [line for line in lines if " skipped" in line]
    assert len(skipped) == 1 and skipped[0].startswith(
        f"mine: 3 skipped: {folder / '<checkpoint>'}: unknown architecture"
    )
    (status,) = result.status["series"]
    line = summary_line(status)
    assert line.startswith("series mine: 0 computed, 0 reused, 3 skipped (see status.json; map the layers with")
    assert line.endswith("`layers:` option (docs/series.md, Any decoder))") and "hub or cache" not in line  # no hub


def test_grouped_lines_and_the_advice_for_a_hub_series():
    reason = "not cached and not downloadable (LocalEntryNotFoundError: no snapshot)"
    records = [{"revision": f"step{s}", "step": s, "status": "skipped", "reason": reason} for s in (0, 1000)]
    records += [{"revision": "step5000", "step": 5000, "status": "computed", "reason": None}]
    records += [{"revision": "step9000", "step": 9000, "status": "reused", "reason": None}]
    assert grouped_lines("pythia", records) == ["pythia: 2 skipped: " + reason, "pythia: 1 computed"]
    series = {"name": "pythia", "model": "EleutherAI/pythia-14m", "computed": 2, "skipped": 2}
    assert summary_line(series | {"checkpoints": records}, reused=1) == (
        "series pythia: 1 computed, 1 reused, 2 skipped (see status.json; rerun `dvc repro` when the hub or cache "
        "has them)"
    )
    line = summary_line(series | {"skipped": 0, "checkpoints": []}, 1)
    assert line == "series pythia: 1 computed, 1 reused, 0 skipped"


def test_one_hostile_source_never_stops_the_others_and_each_bad_file_is_a_skip_with_its_reason(local_series, tmp_path):
    """A FIFO, a sparse file claiming 8 GiB, a trainer state without a step, a losses file with a step that is
    no number, a config.json claiming ten million layers, one claiming a far larger model than its weights and a
    monitor log with a damaged Parquet file, each in its own source beside a good one: the stage finishes
    promptly, every bad file is named, and the good source's checkpoints are all computed."""
    import threading

    from tests.series.helpers import sparse_safetensors

    root, _ = local_series
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    os.mkfifo(hostile / "step_9.safetensors")
    sparse_safetensors(hostile / "step_7.safetensors", (65536, 32768))
    (hostile / "final").mkdir()
    shutil.copy(root / "step0" / "model.safetensors", hostile / "final" / "model.safetensors")
    (hostile / "final" / "trainer_state.json").write_text('{"global_step": Infinity}')
    layers, wide = tmp_path / "layers", tmp_path / "wide"
    for folder, change in ((layers, {"num_hidden_layers": 10**7}), (wide, {"intermediate_size": 10**6})):
        shutil.copytree(root / "step0", folder / "step_000000")
        config = json.loads((folder / "step_000000" / "config.json").read_text()) | change
        (folder / "step_000000" / "config.json").write_text(json.dumps(config))
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (root / name).exists():
                shutil.copy(root / name, folder / name)
    (tmp_path / "losses.csv").write_text("step,val_loss\n0,4.0\nten,3.0\n")
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "features-000010.parquet").write_bytes(b"PAR1 not really PAR1")
    sources = {
        "good": SeriesSource(path=str(root)),
        "hostile": SeriesSource(path=str(hostile)),
        "layers": SeriesSource(path=str(layers)),
        "wide": SeriesSource(path=str(wide)),
        "csv": SeriesSource(path=str(root), losses=str(tmp_path / "losses.csv")),
        "log": SeriesSource(log=str(tmp_path / "log")),
    }
    done = []
    stage = threading.Thread(target=lambda: done.append(series_shards(
        series_params(sources=sources, seq_len=SEQ_LEN), PARAMS, TEXT, tmp_path / "shards")), daemon=True)  # fmt: skip
    stage.start()
    stage.join(600)
    assert done, "the series stage did not finish"
    by_name = {s["name"]: s for s in done[0].status["series"]}
    assert (by_name["good"]["computed"], by_name["good"]["skipped"]) == (3, 0)
    reasons = {c["revision"]: c["reason"] for c in by_name["hostile"]["checkpoints"]}
    assert by_name["hostile"]["computed"] == 0 and len(reasons) == 3
    assert reasons["step_9.safetensors"].endswith("not a regular file (a FIFO, socket or device; it could block the "
                                                  "stage forever): never read")  # fmt: skip
    assert "sparse file" in reasons["step_7.safetensors"] or "GiB free" in reasons["step_7.safetensors"]
    assert reasons["final"].endswith("trainer_state.json: global_step inf is not a step (an integer from 0 to 2**31-1)")
    (layer_skip,) = by_name["layers"]["checkpoints"]
    assert layer_skip["status"] == "skipped" and "num_hidden_layers=10000000 is not a" in layer_skip["reason"]
    assert by_name["wide"]["computed"] == 1  # weight features from the file; the forward pass refused, with why
    features, _ = read_tables(tmp_path / "shards")
    rep = features[(features["rung"] == "wide") & (features["feature"] == "rep_tp0")]
    assert rep["value"].isna().all() and rep["reason"].str.contains("config.json describes").all()
    (csv_skip,) = by_name["csv"]["checkpoints"]
    assert csv_skip["reason"].endswith("losses.csv: step 'ten' (row 2) is not an integer from 0 to 2**31-1; fix that "
                                       "row of the losses file")  # fmt: skip
    (log_skip,) = by_name["log"]["checkpoints"]
    assert log_skip["status"] == "skipped" and log_skip["reason"].startswith(f"{tmp_path / 'log'}: ")


def test_a_series_trajectory_dimension_is_from_its_checkpoints_through_the_per_checkpoint_path(local_series, tmp_path):
    from topometrics.dynamics.phdim import trailing_dimension
    from topometrics.dynamics.trajectory import SERIES_SKETCH, checkpoint_iterates

    root, _ = local_series
    start, end = tiny_neox(100), tiny_neox(101)
    models = {10 * i: tiny_neox(100) for i in range(10)}  # ten checkpoints on a segment: sizes 8, 9, 10 fit
    with torch.no_grad():
        for i, model in enumerate(models.values()):
            for p, a, b in zip(model.parameters(), start.parameters(), end.parameters(), strict=True):
                p.copy_(a + (b - a) * (i / 9) ** 2)  # unevenly spaced, so subsamples differ
    for step, model in models.items():
        model.save_pretrained(tmp_path / "run" / f"checkpoint-{step}", safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(root / name, tmp_path / "run")
    params = replace(PARAMS, families=("np", "trajectory"), phdim_window=1000, phdim_sizes=(8, 9, 10))
    series = series_params(sources={"tiny": SeriesSource(path=str(tmp_path / "run"))}, seq_len=SEQ_LEN)
    series_shards(series, params, TEXT, tmp_path / "shards")
    features, _ = read_tables(tmp_path / "shards")
    rows = features[features["feature"].str.startswith("traj_")].set_index(["step", "feature"])
    assert len(rows) == 20 and (rows.loc[(90, "traj_phdim"), "reason"] == SERIES_SKETCH)
    # independently: every checkpoint's linear weights from the in-memory models, projected and fitted
    expected = checkpoint_iterates(models, [in_memory_weights(m).values() for m in models.values()], params.seed)
    est = trailing_dimension(expected.steps, expected.points, 90, 1000, (8, 9, 10), 1.0, params.seed)
    got = rows.loc[(90, "traj_ckpt_phdim")]
    assert est.dimension == pytest.approx(1.0, abs=0.3) and pd.isna(got["reason"])  # a segment: about 1
    assert got["value"] == pytest.approx(est.dimension, rel=1e-9)
    early = rows.loc[(50, "traj_ckpt_phdim")]  # six checkpoints in (-950, 50]: too few, NULL with the reason
    assert np.isnan(early["value"]) and "6 points allow" in early["reason"]


# ---------------------------------------------------------------------------
# One call: topometrics.features_of
# ---------------------------------------------------------------------------


def test_features_of_a_folder_or_a_model_are_the_series_stages_rows(local_series, local_result):
    import topometrics

    root, models_by_step = local_series
    keys = ["rung", "seed", "step", "layer", "feature"]
    got = topometrics.features_of(root, text=TEXT, params=PARAMS, seq_len=SEQ_LEN, name="tiny")
    stored = local_result.features  # the stage's shards, the rows the warehouse loads
    both = stored.merge(got, on=keys, how="outer", suffixes=("_stage", "_call"), indicator=True)
    only_stage = both[both["_merge"] == "left_only"]
    assert set(only_stage["feature"].map(lambda f: vocabulary.lookup(f).family.name)) <= {"distance", "trajectory"}
    assert (both["_merge"] != "right_only").all() and len(got) == len(both) - len(only_stage)
    common = both[both["_merge"] == "both"]
    stage, call = common["value_stage"], common["value_call"]
    same = (stage == call) | (stage.isna() & call.isna())
    assert same.all() and (common["reason_stage"].fillna("") == common["reason_call"].fillna("")).all()
    # a model in memory, with its tokenizer passed: the same rows as its saved folder at step 0
    model = topometrics.features_of(models_by_step[0], tokenizer=AutoTokenizer.from_pretrained(root), text=TEXT,
                                    params=PARAMS, seq_len=SEQ_LEN, name="tiny")  # fmt: skip
    pd.testing.assert_frame_equal(model, got[got["step"] == 0].reset_index(drop=True))
    weights_only = topometrics.features_of(root / "step0", params=PARAMS, seq_len=SEQ_LEN, families=["np", "vr"])
    assert {"grad_norm", "rep_tp0"}.isdisjoint(weights_only["feature"]) and weights_only["value"].notna().any()
    off = weights_only[weights_only["feature"] == "w_fro"]
    assert set(off["reason"]) == {"family switched off (features.families)"}
    # no params: the project's params.yaml as installed with the package, the same values as passing them
    project = project_params()
    one_call = topometrics.features_of(root / "step0", families=["np", "vr"])
    passed = topometrics.features_of(root / "step0", params=project.features, seq_len=project.series.seq_len,
                                     families=["np", "vr"])  # fmt: skip
    pd.testing.assert_frame_equal(one_call, passed)


def run_series_stage(tmp_path: Path, sources: dict) -> tuple[subprocess.CompletedProcess, dict]:
    """``stages/series.py`` in ``tmp_path`` over ``sources`` (params.yaml's series.sources); its run and status."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["features"].update(max_points=20, rep_points=60, rep_dim=5, rep_batch=2, betti_scales=4, workers=1)
    params["series"] = {"seq_len": SEQ_LEN, "sources": sources}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "data" / "corpus").mkdir(parents=True, exist_ok=True)
    encode(TEXT).tofile(tmp_path / "data" / "corpus" / "val.u8")
    cmd = [sys.executable, str(REPO / "stages" / "series.py"), "--corpus", "data/corpus", "--out", "data/series"]
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    status = tmp_path / "data" / "series" / "status.json"
    return run, json.loads(status.read_text()) if status.is_file() else {}


def test_an_entry_that_cannot_be_stated_and_signed_step_names_are_skipped_and_the_stage_writes_its_status(
    local_series, tmp_path
):
    """One entry the system refuses to stat (a link whose target name is too long: ENAMETOOLONG even for root, as
    /proc/1/cwd is EACCES for a user), a source folder that cannot be listed, and step names that are no plain
    non-negative integer (``checkpoint--5``, ``step_-1``): each a skip with its reason; ``checkpoint-1`` keeps step 1,
    the good source is computed, status.json is written."""
    root, _ = local_series
    good, bad = tmp_path / "good", tmp_path / "bad"
    for folder in (good, bad):
        folder.mkdir()
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (root / name).exists():
                shutil.copy(root / name, folder / name)
    shutil.copytree(root / "step0", good / "step0")
    shutil.copytree(root / "step0", bad / "checkpoint-1")
    shutil.copytree(root / "step0", bad / "checkpoint--5")
    shutil.copy(root / "step0" / "config.json", bad / "config.json")
    shutil.copy(root / "step_000010" / "model.safetensors", bad / "step_-1.safetensors")
    (bad / "unreadable").symlink_to("x" * 300)  # stat: [Errno 36] File name too long
    (tmp_path / "nowhere").symlink_to("y" * 300)
    sources = {"good": {"path": str(good)}, "bad": {"path": str(bad)}, "gone": {"path": str(tmp_path / "nowhere")}}
    run, status = run_series_stage(tmp_path, sources)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    by_name = {s["name"]: s for s in status["series"]}
    assert (by_name["good"]["computed"], by_name["good"]["skipped"]) == (1, 0)
    checkpoints = {c["revision"]: c for c in by_name["bad"]["checkpoints"]}
    assert (checkpoints["checkpoint-1"]["status"], checkpoints["checkpoint-1"]["step"]) == ("computed", 1)
    assert checkpoints["unreadable"]["reason"] == (
        f"{bad / 'unreadable'}: cannot be read (File name too long); make it readable or move it out of the series "
        "folder"
    )
    for name in ("checkpoint--5", "step_-1.safetensors"):
        assert checkpoints[name]["status"] == "skipped" and checkpoints[name]["step"] is None
        assert checkpoints[name]["reason"] == (
            f"{bad / name}: a step name ends in a plain non-negative integer (step_1, checkpoint-5); rename it"
        )
    (gone,) = by_name["gone"]["checkpoints"]
    assert gone["status"] == "skipped" and "cannot be read (File name too long)" in gone["reason"]
    assert "series good: 1 computed, 0 reused, 0 skipped" in run.stdout


def test_a_tokenizer_wrong_for_its_model_costs_only_the_families_that_need_it_naming_the_file_and_the_fix(
    local_series, tmp_path
):
    """tokenizer.json truncated, without its 'added_tokens', or giving ids beyond the model's embedding (another
    model's): the checkpoint is computed, its weight families have values, and the forward-pass families are NULL
    with a reason naming the file and the fix (the stage, its status and shards)."""
    root, _ = local_series
    tokenizer = json.loads((root / "tokenizer.json").read_text())
    shifted = tokenizer | {"model": tokenizer["model"] | {"vocab": {t: i + 1000 for t, i in tokenizer["model"]["vocab"]
                                                                     .items()}}}  # fmt: skip
    broken = {
        "truncated": (root / "tokenizer.json").read_text()[:2000],
        "keys": json.dumps({k: v for k, v in tokenizer.items() if k != "added_tokens"}),
        "beyond": json.dumps(shifted),
    }
    for name, text in broken.items():
        shutil.copytree(root / "step0", tmp_path / name / "step0")
        shutil.copy(root / "tokenizer_config.json", tmp_path / name / "tokenizer_config.json")
        (tmp_path / name / "tokenizer.json").write_text(text)
    shutil.copytree(root / "step0", tmp_path / "unknown" / "step0")  # and a model_type transformers does not know
    config = json.loads((root / "step0" / "config.json").read_text()) | {"model_type": "no-such-model"}
    (tmp_path / "unknown" / "step0" / "config.json").write_text(json.dumps(config))
    sources = {name: {"path": str(tmp_path / name)} for name in [*broken, "unknown"]}
    run, status = run_series_stage(tmp_path, sources)
    assert run.returncode == 0, run.stderr
    by_name = {s["name"]: s for s in status["series"]}
    assert {(n, by_name[n]["computed"], by_name[n]["skipped"]) for n in broken} == {(n, 1, 0) for n in broken}
    (unknown,) = by_name["unknown"]["checkpoints"]
    assert unknown["status"] == "skipped" and "model_type 'no-such-model'" in unknown["reason"]
    assert "`layers:` option" in unknown["reason"] and len(unknown["reason"]) < 400
    assert max(len(line) for line in run.stdout.splitlines()) < 500  # not every transformers model type
    features, _ = read_tables(tmp_path / "data" / "series")
    for name in broken:
        rows = features[(features["rung"] == name) & (features["layer"] == "all")].set_index("feature")
        assert np.isfinite(rows.loc["np_norm", "value"])  # a weight family, computed from the file
        reason = rows.loc["rep_tp0", "reason"]
        assert pd.isna(rows.loc["rep_tp0", "value"]) and reason.startswith(str(tmp_path / name / "tokenizer.json"))
        assert reason.endswith("give the series the tokenizer files the model was trained with") and len(reason) < 300
    assert "is beyond the model's 300 embeddings" in features[features["rung"] == "beyond"]["reason"].dropna().iloc[0]


def test_a_series_shape_is_its_config_and_the_tensors_its_files_hold_and_reaches_the_rungs_table(
    local_series, tmp_path
):
    from safetensors import safe_open

    from topometrics.analysis import warehouse
    from topometrics.atomic import write_parquet

    root, _ = local_series
    out = tmp_path / "shards"
    result = series_shards(
        series_params(sources={"neox": SeriesSource(path=str(root))}, seq_len=SEQ_LEN), PARAMS, TEXT, out
    )
    with safe_open(root / "step0" / "model.safetensors", "pt") as f:  # counted independently: every stored tensor
        names = f.keys()  # safe_open is no mapping: it lists its tensors only through keys()
        held = sum(int(np.prod(f.get_slice(name).get_shape())) for name in names)
    # tiny_neox's config: hidden 32, 2 layers, 4 heads, 300 ids; GPTNeoXConfig's default context is 2048
    expected = {"rung": "neox", "kind": "series", "n_params": held, "hidden": 32, "layers": 2, "heads": 4,
                "vocab_size": 300, "context": 2048}  # fmt: skip
    assert result.shapes.to_dict("records") == [expected]
    assert all("shape" not in c for c in result.status["series"][0]["checkpoints"])  # the rungs table's, not status
    write_parquet(out / "rungs.parquet", result.shapes)
    (tmp_path / "config").mkdir()
    inputs = warehouse.discover_inputs(warehouse.Sources(tmp_path / "config", tmp_path / "runs", None, [out]))
    settings = parse_params(yaml.safe_load((REPO / "params.yaml").read_text())).analysis.settings()
    target = warehouse.build_warehouse(tmp_path / "w.duckdb", inputs, settings, {})
    import duckdb

    with duckdb.connect(str(target), read_only=True) as con:
        row = con.execute("SELECT * FROM rungs").df().to_dict("records")
    assert row == [expected]


def test_a_series_without_a_config_has_its_tensor_count_and_a_null_shape(local_series, tmp_path):
    root, _ = local_series
    folder = tmp_path / "plain"
    folder.mkdir()
    shutil.copy(root / "step0" / "model.safetensors", folder / "step_0.safetensors")
    layers = {part: rf"gpt_neox\.layers\.(\d+)\.{module}\.weight" for part, module in MAPPING}
    source = SeriesSource(path=str(folder), layers=layers)
    result = series_shards(series_params(sources={"plain": source}, seq_len=SEQ_LEN), PARAMS, TEXT, tmp_path / "s")
    (row,) = result.shapes.to_dict("records")
    assert row["n_params"] > 0 and all(pd.isna(row[c]) for c in ("hidden", "layers", "heads", "vocab_size", "context"))
