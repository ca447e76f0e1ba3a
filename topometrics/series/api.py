"""One call: the per-checkpoint feature rows of a model or a folder of checkpoints, as the warehouse holds them.

:func:`features_of` runs :func:`topometrics.series.checkpoint.series_checkpoint_features`, the series stage's
per-checkpoint path, on each checkpoint and returns :func:`topometrics.features.checkpoint.features_frame`'s
long rows (``rung, seed, step, layer, feature, value, reason``). It runs with one torch and one BLAS thread,
as the stage's jobs do (:func:`topometrics.execution.compute.map_jobs`), so its values are the stage's to the
last bit (float32 sums in another thread's order are not). A model in memory is written once to a
temporary folder with ``save_pretrained`` (safetensors) and read back like any checkpoint, so it takes the
same path too. The distances to the previous checkpoint (``*_prev``) and the trajectory's dimension need
a whole series: the ``series`` stage computes them (``series.sources``, docs/series.md).
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import pandas as pd

from topometrics.errors import TopometricsError
from topometrics.execution.compute import one_thread
from topometrics.features.checkpoint import FEATURE_COLUMNS, features_frame
from topometrics.params import FeaturesParams, project_params
from topometrics.series.checkpoint import series_checkpoint_features
from topometrics.series.run_folders import RunCheckpoint, scan_run_folder, step_from_name

ACCEPTS = (
    "a transformers causal LM (e.g. AutoModelForCausalLM.from_pretrained(...)), a folder it was saved to "
    "(config.json + *.safetensors), or a folder of checkpoints (checkpoint-<step>/ folders, <name>-<step>.safetensors)"
)


def features_of(
    model_or_folder,
    families: tuple[str, ...] | list[str] | None = None,
    tokenizer=None,
    text: str | None = None,
    params: FeaturesParams | None = None,
    seq_len: int | None = None,
    name: str = "model",
    seed: int = 0,
) -> pd.DataFrame:
    """The feature rows of every checkpoint of ``model_or_folder`` (one for a model), in step order.

    Parameters
    ----------
    model_or_folder : transformers model, str or Path
        See :data:`ACCEPTS`. A model's step is 0; a folder's from its name (``checkpoint-500``), else 0.
    families : feature families to compute (``topometrics.vocabulary``; default all those of ``params``);
        the others are NULL with the reason, as in the warehouse.
    tokenizer : the model's tokenizer, when its folder has none (the forward pass tokenises ``text`` with it).
    text : validation text for the forward-pass families (representation, gradients, loss surface);
        None: weight features only (those rows are absent).
    params, seq_len : a params.yaml's ``features`` and ``series.seq_len`` (tokens per window), e.g.
        ``p = load_params("params.yaml")`` then ``params=p.features, seq_len=p.series.seq_len``; None: the
        project's own (:func:`topometrics.params.project_params`).
    name, seed : the ``rung`` and ``seed`` columns.

    Raises :class:`topometrics.errors.TopometricsError` (one line saying what it accepts) for anything else.
    """
    if params is None or seq_len is None:
        project = project_params()
        params, seq_len = params or project.features, seq_len or project.series.seq_len
    if families is not None:
        params = replace(params, families=tuple(families))
        params.check()
    with tempfile.TemporaryDirectory(prefix="features_of-") as tmp, one_thread():
        checkpoints = _checkpoints(model_or_folder, Path(tmp))
        if tokenizer is not None:
            tokenizer.save_pretrained(Path(tmp) / "tokenizer")
            checkpoints = [replace(c, tokenizer_dir=Path(tmp) / "tokenizer") for c in checkpoints]
        frames = [
            features_frame(series_checkpoint_features(ckpt, text, params, seq_len, index=i)[0], name, seed, ckpt.step)
            for i, ckpt in enumerate(checkpoints)
        ]
    return pd.concat(frames, ignore_index=True)[FEATURE_COLUMNS]


def _checkpoints(model_or_folder, tmp: Path) -> list[RunCheckpoint]:
    """The checkpoints to measure: a model saved into ``tmp``, a saved model's folder, or a run folder's."""
    if hasattr(model_or_folder, "save_pretrained") and hasattr(model_or_folder, "config"):
        model_or_folder.save_pretrained(tmp / "model", safe_serialization=True)
        return [_one(tmp / "model", step=0)]
    if not isinstance(model_or_folder, str | Path):
        raise TopometricsError(f"features_of: got a {type(model_or_folder).__name__}; it accepts {ACCEPTS}")
    folder = Path(model_or_folder)
    if not folder.is_dir():
        raise TopometricsError(f"features_of: {folder} is not a folder; it accepts {ACCEPTS}")
    if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
        return [_one(folder, step=step_from_name(folder.name) or 0)]
    run = scan_run_folder(folder)
    if not run.checkpoints:
        why = "; ".join(s["reason"] for s in run.skipped[:2])
        raise TopometricsError(f"features_of: no checkpoint in {folder} ({why}); it accepts {ACCEPTS}")
    return run.checkpoints


def _one(folder: Path, step: int) -> RunCheckpoint:
    tokenizer = folder if any((folder / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")) else None
    return RunCheckpoint(step, folder.name, tuple(sorted(folder.glob("*.safetensors"))), folder, tokenizer)
