"""A training run's directory: whose it is, whether its checkpoints can be trusted, where to resume.

A run directory (``data/runs/<rung>-<seed>``) holds the run's checkpoints and sidecars
(topometrics.models.checkpoints), ``resume.safetensors`` (the training state after the last checkpoint;
its metadata names the step, rung, seed and recipe fingerprint), ``steps.csv``, ``checkpoints.csv``,
``run.json`` (how the run ended), when ``train.sketch_every`` > 0 ``trajectory_sketch.csv`` / ``.json``
(:mod:`topometrics.training.sketch`) and, when ``train.monitor_every`` > 0, ``monitor/`` (the log of a
live monitor, whose files :mod:`topometrics.training.monitor_log` names). Before training touches it:

- :func:`claim_run_dir` refuses a directory whose own records name another rung or seed (its resume
  state, or with none any sidecar), and says whether it holds this run's files made with another
  recipe, which :func:`discard_stale` deletes (the run's own files only) once the new recipe's first
  step has run;
- :func:`resume_step` verifies every checkpoint the run lists and every step file the directory holds
  (sidecar, safetensors header and size, the weights' sha256 against the sidecar's, the sidecar's run,
  recipe and step against this run's and its file name) and says where to continue: the end of a
  complete run, the resume point, or step 0 when a checkpoint is damaged, changed, missing or another
  run's (training is deterministic, so it is recomputed identically).

:func:`save_resume` and :func:`load_resume` write and read the training state itself.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from pathlib import Path

import torch
from safetensors import safe_open

from topometrics.atomic import write_text
from topometrics.models.checkpoints import (
    Checkpoint,
    CheckpointError,
    checkpoint_path,
    load_state,
    run_owner,
    safetensors_problem,
    save_tensors,
    verify_checkpoint,
)
from topometrics.params import BASE_VARIANT, run_name
from topometrics.training.monitor_log import RUN_DIR_FILES

STEPS_HEADER = "step,train_loss,grad_norm,lr\n"
# Files a run directory holds; only these are ever deleted (never the directory itself).
# trajectory_sketch.*: topometrics.training.sketch's files (named here so that the training loop imports no observer)
RUN_FILES = ("step_*", "resume.*", "steps.csv", "checkpoints.csv", "run.json", "summary.json", "*.tmp",
             "trajectory_sketch.*", *RUN_DIR_FILES)  # fmt: skip
_STEP_NAME = re.compile(r"^step_(\d{6,})\.(?:safetensors|json)$")


def resume_info(run_dir: Path) -> dict | None:
    """The metadata of an intact ``resume.safetensors`` (step, rung, seed, recipe fingerprint), else None."""
    path = Path(run_dir) / "resume.safetensors"
    if safetensors_problem(path):
        return None
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    return {k: json.loads(v) for k, v in meta.items()} if "step" in meta else None


def _optimizer_tensors(opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    flat = {}
    for i, state in opt.state_dict()["state"].items():
        for key, value in state.items():
            flat[f"opt.{i}.{key}"] = value if torch.is_tensor(value) else torch.tensor(value)
    return flat


def save_resume(
    run_dir: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator, info: dict
) -> None:
    """Full training state after a checkpoint; weights and the sampler state as tensors, no pickles.

    ``info`` (step, rung, seed, recipe fingerprint) is the same file's metadata, so the state and
    the step it belongs to are replaced by one rename: a kill cannot pair one checkpoint's state
    with another's step (they were two files, and a kill between the renames resumed wrongly).
    """
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    tensors |= _optimizer_tensors(opt) | {"rng.data": gen.get_state()}
    save_tensors(run_dir / "resume.safetensors", tensors, {k: json.dumps(v) for k, v in info.items()})


def load_resume(run_dir: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator) -> dict:
    """Load the state :func:`save_resume` wrote into ``model``, ``opt`` and ``gen``; returns its metadata."""
    tensors = load_state(run_dir / "resume.safetensors")
    info = resume_info(run_dir)
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    state = opt.state_dict()
    for name, value in tensors.items():
        if name.startswith("opt."):
            _, i, key = name.split(".", 2)
            state["state"].setdefault(int(i), {})[key] = value
    opt.load_state_dict(state)
    gen.set_state(tensors["rng.data"])
    return info


def claim_run_dir(run_dir: Path, name: str, fingerprint: str) -> bool:
    """Make ``run_dir`` the directory of run ``name`` (``<rung>[-<variant>]-<seed>``) with this recipe.

    Raises :class:`CheckpointError` (nothing changed) when its records name another run. Returns True
    when it holds the run's files made with another recipe: they are *stale*, but kept until the new
    recipe's first step has run (then :func:`discard_stale`), so a recipe that fails at once (too large
    a batch, say) leaves the finished run byte for byte as it was.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise CheckpointError(f"{_shown(run_dir)} is a file, not the run directory of {name}; move it away")
    run_dir.mkdir(parents=True, exist_ok=True)
    owners = _owners(run_dir)
    foreign = sorted(owner for owner in owners if owner != name)
    resume = resume_info(run_dir)
    # The resume state is written after every checkpoint: when it is this run's, another run's sidecars
    # are files copied in (resume_step names and recomputes them), not a directory under the wrong name.
    if foreign and not (resume and _name(resume) == name):
        raise CheckpointError(
            f"{_shown(run_dir)} holds the checkpoints of run {', '.join(foreign)}, not {name}; train {name} into "
            f"its own directory data/runs/{name} (nothing was changed)"
        )
    return name in owners and owners[name] != fingerprint


def _shown(path: Path) -> str:
    """``path`` as the user named it: relative to the working directory when it lies under it (the run queue
    hands its jobs absolute paths, so a Dask worker elsewhere finds them), else whole."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def discard_stale(run_dir: Path, name: str, log=print) -> None:
    """Delete the run's own files made with another recipe (:data:`RUN_FILES`: never another file, nor the folder)."""
    log(f"[{name}] the recipe changed (model shape, recipe or corpus): discarding the old checkpoints")
    for pattern in RUN_FILES:
        for path in Path(run_dir).glob(pattern):
            path.unlink()


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of the checkpoint files (weights or sidecar) the run directory holds, by their names, sorted."""
    return sorted({int(m.group(1)) for p in Path(run_dir).glob("step_*") if (m := _STEP_NAME.match(p.name))})


def checked_steps(run_dir: Path, steps: int, ckpt_every: int) -> list[int]:
    """The checkpoint steps of a run of ``steps`` steps, and any other step file its directory holds (a run
    never writes one: another run's checkpoint copied in), all of which must pass :func:`verify_checkpoint`."""
    return sorted(set(range(0, steps + 1, ckpt_every)) | set(checkpoint_steps(run_dir)))


def resume_step(run_dir: Path, name: str, steps: int, ckpt_every: int, owner: dict, log=print) -> int:
    """The last step done, after checking every checkpoint the run directory lists against the run's ``owner``
    (:func:`topometrics.models.checkpoints.run_owner`: rung, variant, seed, recipe fingerprint).

    ``steps`` when the run is complete and all its checkpoints are whole (its resume state is not
    needed); the resume point when it and every checkpoint up to it are whole; 0 for a new run, or
    when a checkpoint or the resume state is damaged, missing or another run's: the bad files are
    named, deleted (a checkpoint's weights and sidecar both), and recomputed from step 0, the nearest
    intact resume point.
    """
    run_dir = Path(run_dir)
    present, checked = checkpoint_steps(run_dir), checked_steps(run_dir, steps, ckpt_every)
    problem = functools.cache(functools.partial(verify_checkpoint, run_dir, owner=owner))  # each file hashed once
    if present and present[-1] == steps and not any(problem(s) for s in checked):
        return steps
    info = resume_info(run_dir)
    usable = info is not None and run_owner(info) == owner
    last = int(info["step"]) if usable else max(present, default=-1)
    # past the resume point a scheduled checkpoint is rewritten anyway; one off the schedule never is
    bad = {s: p for s in checked if (s <= last or s % ckpt_every or s > steps) and (p := problem(s))}
    if not bad and (usable or last < 0):
        return max(last, 0)
    named = list(bad.values())
    if not usable:
        named.append(f"resume.safetensors: {safetensors_problem(run_dir / 'resume.safetensors') or 'not this run'}")
        (run_dir / "resume.safetensors").unlink(missing_ok=True)
    log(f"[{name}] damaged or missing: {'; '.join(named)}; recomputing from step 0, the nearest intact resume point")
    for step in bad:
        checkpoint_path(run_dir, step).unlink(missing_ok=True)
        checkpoint_path(run_dir, step).with_suffix(".json").unlink(missing_ok=True)
    return 0


def directory_owner(run_dir: Path, ckpts: list[Checkpoint]) -> dict:
    """Whose checkpoints ``ckpts`` (those of ``run_dir``) should be
    (:func:`topometrics.models.checkpoints.run_owner`): the run its resume state names, written after every
    checkpoint; without one, the run most sidecars describe (a tie: the later checkpoint's)."""
    if info := resume_info(run_dir):
        return run_owner(info)
    counts = Counter(json.dumps(run_owner(c.meta), sort_keys=True) for c in ckpts)
    return json.loads(max(reversed(list(counts)), key=counts.__getitem__))


def truncate_steps_log(path: Path, last_step: int) -> None:
    """Keep the per-step log up to ``last_step``: rows after the last checkpoint are recomputed.

    Only whole rows count: a kill can leave a half-written last line.
    """
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    kept = []
    for line in lines[1:]:
        fields = line.rstrip("\n").split(",")
        if line.endswith("\n") and len(fields) == 4 and fields[0].isdigit() and int(fields[0]) <= last_step:
            kept.append(line)
    write_text(path, STEPS_HEADER + "".join(kept))


def record_outcome(run_dir: Path, status: str, reason: str, final_step: int | None) -> None:
    """``run.json``: how the run ended (``complete`` or ``diverged``) and why, for the warehouse."""
    record = {"status": status, "reason": reason, "final_step": final_step}
    write_text(Path(run_dir) / "run.json", json.dumps(record, indent=1, sort_keys=True))


def trained_tokenizers(run_dir: Path) -> set[str]:
    """The tokenizers the run directory's checkpoints were trained on, as its sidecars and resume state say:
    a BPE's ``tokenizer.json`` sha256, ``char`` for records without one (none for a directory without records)."""
    records = []
    for path in Path(run_dir).glob("step_*.json"):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue  # damaged: resume_step names it
    records += [info] if (info := resume_info(run_dir)) else []
    return {m.get("tokenizer", "char") for m in records if isinstance(m, dict) and "step" in m}


def _owners(run_dir: Path) -> dict[str, str | None]:
    """Run name -> recipe fingerprint, as the directory's own sidecars and resume state say."""
    records = []
    for path in run_dir.glob("step_*.json"):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue  # damaged: resume_step names it
    records.append(resume_info(run_dir) or {})
    return {
        _name(m): m.get("recipe_fingerprint") for m in records if isinstance(m, dict) and "rung" in m and "seed" in m
    }


def _name(record: dict) -> str:
    """The run name a sidecar or resume state (with ``rung`` and ``seed``) gives."""
    return run_name(str(record["rung"]), int(record["seed"]), record.get("variant", BASE_VARIANT))
