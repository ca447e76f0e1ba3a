"""Train one run (rung x variant x seed) with checkpoints, resumably and bit-exactly.

The recipe is the paper's (section 3.1): AdamW, linear warm-up then cosine decay,
gradient clipping, a fixed seed, a checkpoint every ``ckpt_every`` steps including
step 0. Step ``s`` means "after ``s`` optimizer updates".

Resumability: after every checkpoint the full training state (weights, AdamW moments,
the data sampler's RNG state, and in its metadata the step, rung, seed and recipe fingerprint)
is written to ``resume.safetensors`` by one rename. A killed run restarts from the last
checkpoint and, because the learning rate is a pure function of the step and no other
randomness exists, ends with weights bit-identical to an uninterrupted run on the same device
and thread count (on CUDA with its deterministic kernels, ``models.model.deterministic_on``; ``python -m bench
device`` trains a run twice there and compares every checkpoint's bytes). Everything is checked before the run
directory is touched, and the directory itself by topometrics.training.run_dir (whose run it is, whether its
checkpoints are whole).

Observers (:class:`Observer`, e.g. a live monitor) watch a run train: they see the weights after
every update and the validation loss of every checkpoint, and nothing they do reaches the run.

Why over 400 lines: one run's whole life (config, fingerprint, setup, resume, loop, checkpoints, summary) in
the order it happens, so that what makes a resumed run bit-identical is checked in one place.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from tqdm import tqdm

from topometrics.atomic import write_text
from topometrics.models.checkpoints import list_checkpoints, save_checkpoint
from topometrics.models.lr_schedule import DEFAULT_DECAY_FRACTION, DEFAULT_SHAPE, Schedule
from topometrics.models.model import GPT, GPTConfig, count_parameters, deterministic_on, pick_device
from topometrics.models.tokens import bits_per_byte
from topometrics.params import BASE_VARIANT, ParamsError, run_name
from topometrics.params_variants import RECIPE_KEYS
from topometrics.training.corpus import CorpusError, check_split_sizes
from topometrics.training.memory import check_step_memory, out_of_memory_named
from topometrics.training.run_dir import (
    claim_run_dir,
    discard_stale,
    load_resume,
    record_outcome,
    resume_info,
    resume_step,
    save_resume,
    truncate_steps_log,
)


@dataclass(frozen=True)
class Recipe:
    steps: int
    ckpt_every: int
    batch_size: int
    lr: float
    warmup: int
    min_lr_ratio: float
    weight_decay: float
    grad_clip: float
    seed: int
    val_windows: int
    schedule: str = DEFAULT_SHAPE  # the LR schedule's shape (lr_schedule.SHAPES)
    decay_fraction: float = DEFAULT_DECAY_FRACTION

    @property
    def lr_schedule(self) -> Schedule:
        """The learning-rate schedule of this recipe."""
        return Schedule.from_recipe(asdict(self))

    def to_dict(self) -> dict:
        """The recipe's fields, the schedule's shape keys left out while they hold their defaults: a default
        recipe's config file and fingerprint are those of the recipes written before the shapes existed."""
        body = asdict(self)
        if self.schedule == DEFAULT_SHAPE and self.decay_fraction == DEFAULT_DECAY_FRACTION:
            del body["schedule"], body["decay_fraction"]
        return body


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's training (rung x variant x seed), written by the config stage."""

    rung: str
    model: GPTConfig
    recipe: Recipe
    variant: str = BASE_VARIANT  # the recipe variant's name (params.yaml `variants`; base = `train`)

    def to_dict(self) -> dict:
        body = {
            "rung": self.rung,
            "variant": self.variant,
            "model": self.model.to_dict(),
            "recipe": self.recipe.to_dict(),
        }
        return body | {"seed": self.recipe.seed, "n_params": count_parameters(GPT(self.model))}

    @property
    def name(self) -> str:
        """The run's name (:func:`topometrics.params.run_name`): its config file and run directory."""
        return run_name(self.rung, self.recipe.seed, self.variant)

    def owner(self, fingerprint: str) -> dict:
        """Whose every checkpoint of this run is, as its sidecar records it (``checkpoints.run_owner``)."""
        return {"rung": self.rung, "variant": self.variant, "seed": self.recipe.seed, "recipe_fingerprint": fingerprint}

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        return cls(d["rung"], GPTConfig(**d["model"]), Recipe(**d["recipe"]), d["variant"])


def recipe_fingerprint(cfg: RunConfig, corpus_sha256: str, tokenizer: str | None = None) -> str:
    """Hash of model shape, recipe, corpus and tokenizer (the sha256 of a BPE's ``tokenizer.json``; None for
    characters, which leaves the hash of a character run as it always was): what a checkpoint must match
    to be resumed."""
    body = {"model": cfg.model.to_dict(), "recipe": cfg.recipe.to_dict(), "corpus": corpus_sha256}
    body |= {"tokenizer": tokenizer} if tokenizer else {}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def sample_batch(
    data: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of ``data`` (n,) -> inputs and next-token targets, both (batch, seq_len) int64."""
    starts = torch.randint(data.numel() - seq_len - 1, (batch_size,), generator=gen)
    offsets = starts[:, None] + torch.arange(seq_len + 1)
    window = data[offsets].long()
    return window[:, :-1], window[:, 1:]


def validation_windows(val: np.ndarray, n_windows: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed held-out set: ``n_windows`` windows evenly spaced over the validation split."""
    span = val.size - seq_len - 1
    if span < 1:
        raise CorpusError(
            f"the validation split has {val.size:,} tokens, fewer than data.seq_len + 2 = {seq_len + 2:,}; "
            "point data.corpus at more text or lower data.seq_len, then run `dvc repro`"
        )
    starts = np.linspace(0, span, num=min(n_windows, span + 1)).astype(np.int64)
    window = torch.from_numpy(val[starts[:, None] + np.arange(seq_len + 1)].astype(np.int64))
    return window[:, :-1], window[:, 1:]


@torch.no_grad()
def evaluate(model: GPT, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> float:
    """Mean next-token cross-entropy (nats) over the fixed validation windows."""
    model.eval()
    total = 0.0
    for i in range(0, x.size(0), batch_size):
        xb, yb = x[i : i + batch_size], y[i : i + batch_size]
        total += model.loss(xb, yb).item() * xb.size(0)
    model.train()
    return total / x.size(0)


def make_optimizer(model: GPT, r: Recipe) -> torch.optim.AdamW:
    """AdamW over all parameters, with the fused kernel (one pass over all tensors; ~5x
    faster than the default per-tensor loop on CPU, the same update up to rounding)."""
    return torch.optim.AdamW(model.parameters(), lr=r.lr, weight_decay=r.weight_decay, fused=True)


def forward_backward(
    model: GPT, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, grad_clip: float
) -> tuple[float, float]:
    """Loss, gradients and clipping for one batch; returns (loss, grad norm before clipping).
    The caller runs ``opt.step()`` unless the loss is not finite."""
    loss = model.loss(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    clip = grad_clip if grad_clip > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    return loss.item(), grad_norm.item()


# ---------------------------------------------------------------- the loop


class Observer(Protocol):
    """What watches a run train (a live monitor, say): called by the training loop, which ignores what
    it does. It must not change the model nor draw from torch's random generators, so a run's files are
    the same, byte for byte, with or without it."""

    def on_step(self, model: GPT, step: int, loss: float | None) -> None:
        """The weights after ``step``'s update (what a checkpoint at ``step`` holds) and that batch's loss
        (nats); also at step 0 (the initial weights, the first batch's loss) and at the step a run resumes
        from (the resumed weights, loss None: a kill may have cut what the observer made of it short)."""

    def on_checkpoint(self, step: int, val_loss: float) -> None:
        """The checkpoint of ``step`` is written; its validation loss (nats)."""


@dataclass
class Run:
    """A run being trained: the model, optimizer, sampler and fixed validation windows on its device."""

    cfg: RunConfig
    run_dir: Path
    fingerprint: str  # recipe_fingerprint(cfg, corpus): what a checkpoint must match to be resumed
    device: torch.device
    model: GPT
    opt: torch.optim.AdamW
    data: torch.Tensor  # (n,) training token ids
    data_gen: torch.Generator  # the batch sampler's generator (seed + 1)
    val_x: torch.Tensor  # (windows, context) fixed validation inputs
    val_y: torch.Tensor  # ... and their targets
    observers: Sequence[Observer] = ()
    stale: bool = False  # the run directory holds this run's files of another recipe (discarded after step 0)
    tokenizer: str | None = None  # sha256 of the BPE's tokenizer.json (None: characters)
    val_bytes: float | None = None  # UTF-8 bytes the scored validation targets stand for (None: unknown)

    def observe_step(self, step: int, loss: float | None) -> None:
        """Every observer's :meth:`Observer.on_step` with the model's weights now."""
        for observer in self.observers:
            observer.on_step(self.model, step, loss)

    def val_units(self, val_loss: float) -> dict:
        """The sidecar's ``val_tokens`` (targets scored), ``val_bytes`` (their UTF-8 bytes) and ``val_bpb``."""
        if self.val_bytes is None:
            return {}
        tokens = int(self.val_y.numel())
        return {
            "val_tokens": tokens,
            "val_bytes": self.val_bytes,
            "val_bpb": bits_per_byte(val_loss, tokens, self.val_bytes),
        }

    def checkpoint(self, step: int, train_loss: float) -> float:
        """Evaluate, save the checkpoint and the resume state; returns the validation loss."""
        r = self.cfg.recipe
        val_loss = evaluate(self.model, self.val_x, self.val_y, r.batch_size)
        meta = {"step": step, "rung": self.cfg.rung, "variant": self.cfg.variant, "seed": r.seed}
        meta |= {"config": self.cfg.model.to_dict()}
        meta |= {"recipe_fingerprint": self.fingerprint, "val_loss": val_loss, "train_loss": train_loss}
        meta |= self.val_units(val_loss) | ({"tokenizer": self.tokenizer} if self.tokenizer else {})
        save_checkpoint(self.run_dir, self.model, meta)
        info = {"step": step, "rung": self.cfg.rung, "variant": self.cfg.variant, "seed": r.seed}
        info |= {"recipe_fingerprint": self.fingerprint} | ({"tokenizer": self.tokenizer} if self.tokenizer else {})
        save_resume(self.run_dir, self.model, self.opt, self.data_gen, info)
        for observer in self.observers:
            observer.on_checkpoint(step, val_loss)
        return val_loss


def train_run(
    cfg: RunConfig,
    train_ids: np.ndarray,
    val_ids: np.ndarray,
    run_dir: Path,
    corpus_sha256: str,
    device: str = "auto",
    log=print,
    progress_bar: bool | None = None,
    observers: Sequence[Observer] = (),
    tokenizer: str | None = None,
    token_bytes: np.ndarray | None = None,
) -> dict:
    """Train (or resume) one run, writing checkpoints and logs into ``run_dir``.

    ``progress_bar``: a progress bar on stderr (None: when it is a terminal); without one, a ``log`` line
    per checkpoint. Concurrent runs pass False, so their lines interleave instead of their bars.
    ``observers``: each sees every step's weights and every checkpoint's validation loss (:class:`Observer`).
    ``tokenizer``: the sha256 of the BPE the ids come from (None: characters), in the fingerprint and every
    checkpoint's sidecar; ``token_bytes``: (vocab,) UTF-8 bytes per id, for the sidecars' bits per byte.

    Returns a summary: final val/train loss, steps run, tokens/s, status
    ('complete' or 'diverged' with the step and reason).
    """
    run, start = setup_run(cfg, train_ids, val_ids, Path(run_dir), corpus_sha256, device, log, tokenizer)
    run.observers = observers
    run.val_bytes = None if token_bytes is None else float(np.asarray(token_bytes)[run.val_y.cpu().numpy()].sum())
    with out_of_memory_named(cfg.recipe.batch_size, cfg.name, cfg.variant):
        resume_run(run, start, log)
        t0 = time.perf_counter()
        status, reason, tokens = training_loop(run, start, log, progress_bar)
    summary = run_summary(run, f"{status}: {reason}" if reason else status, tokens, time.perf_counter() - t0)
    record_outcome(run.run_dir, status, reason, summary["final_step"])
    return summary


def setup_run(
    cfg: RunConfig,
    train_ids: np.ndarray,
    val_ids: np.ndarray,
    run_dir: Path,
    corpus_sha256: str,
    device: str,
    log=print,
    tokenizer: str | None = None,
) -> tuple[Run, int]:
    """The freshly initialised run and the last step already done (see topometrics.training.run_dir).

    The device, the corpus and the memory a step needs are checked before the run directory is
    touched; a directory of another recipe starts at step 0 and is discarded only after the new
    recipe's first step has run (:func:`resume_run`).
    """
    r = cfg.recipe
    dev = pick_device(device)
    deterministic_on(dev)
    check_split_sizes("the prepared corpus (data.corpus)", int(train_ids.size), int(val_ids.size), cfg.model.context)
    check_step_memory(cfg.model, cfg.recipe.batch_size, cfg.name, cfg.variant, dev)
    fingerprint = recipe_fingerprint(cfg, corpus_sha256, tokenizer)
    stale = claim_run_dir(run_dir, cfg.name, fingerprint)
    start = 0 if stale else resume_step(run_dir, cfg.name, r.steps, r.ckpt_every, cfg.owner(fingerprint), log)
    model = GPT(cfg.model)
    model.init_weights(torch.Generator().manual_seed(r.seed))
    model.to(dev).train()
    val_x, val_y = validation_windows(val_ids, r.val_windows, cfg.model.context)
    data_gen = torch.Generator().manual_seed(r.seed + 1)
    run = Run(cfg, run_dir, fingerprint, dev, model, make_optimizer(model, r), torch.from_numpy(train_ids), data_gen,
              val_x.to(dev), val_y.to(dev), stale=stale, tokenizer=tokenizer)  # fmt: skip
    return run, start


def resume_run(run: Run, start: int, log) -> None:
    """Load the resume state at ``start`` (or write the step-0 checkpoint of a new run).

    Resume points are checkpoints; the per-step log keeps only the rows up to that step. A
    complete run needs no state: its checkpoints were verified.
    """
    r = run.cfg.recipe
    if start == r.steps:
        log(f"[{run.cfg.name}] complete: all {r.steps // r.ckpt_every + 1} checkpoints whole ({run.run_dir})")
    elif start > 0:
        load_resume(run.run_dir, run.model, run.opt, run.data_gen)
        log(f"[{run.cfg.name}] resuming from step {start} ({run.run_dir})")
        run.observe_step(start, None)  # observed again: a kill may have cut what an observer made of it short
    elif not run.stale and resume_info(run.run_dir) is not None:  # killed before its first checkpoint after step 0
        log(f"[{run.cfg.name}] resuming from step 0 ({run.run_dir})")
    if start == 0:
        probe = torch.Generator().manual_seed(r.seed + 1)  # the first batch, without advancing the sampler
        x0, y0 = (t.to(run.device) for t in sample_batch(run.data, r.batch_size, run.cfg.model.context, probe))
        with torch.no_grad():
            loss0 = run.model.loss(x0, y0).item()
        if run.stale:  # the new recipe's first step runs before the old run's files go
            run.model.loss(x0, y0).backward()  # the backward pass too (its memory); gradients dropped, no update
            run.model.zero_grad(set_to_none=True)
            discard_stale(run.run_dir, run.cfg.name, log)
    truncate_steps_log(run.run_dir / "steps.csv", start)
    if start == 0:
        run.observe_step(0, loss0)
        run.checkpoint(0, loss0)


def training_loop(run: Run, start: int, log, progress_bar: bool | None = None) -> tuple[str, str, int]:
    """Steps ``start + 1 .. steps`` with a checkpoint every ``ckpt_every``; returns (status, reason, tokens).

    A non-finite loss stops before its update: status ``diverged`` with the reason, earlier checkpoints kept.
    """
    r, model, opt, schedule = run.cfg.recipe, run.model, run.opt, run.cfg.recipe.lr_schedule
    status, reason, tokens, loss_sum, t0 = "complete", "", 0, 0.0, time.perf_counter()  # loss_sum: per checkpoint
    disable = None if progress_bar is None else not progress_bar  # None: a bar only on a terminal
    bar = tqdm(total=r.steps, initial=start, desc=run.cfg.name, unit="step", disable=disable, file=sys.stderr)
    with (run.run_dir / "steps.csv").open("a") as steps_file:
        for step in range(start + 1, r.steps + 1):
            lr = schedule.at(step)
            for group in opt.param_groups:
                group["lr"] = lr
            x, y = (t.to(run.device) for t in sample_batch(run.data, r.batch_size, run.cfg.model.context, run.data_gen))
            loss_value, grad_norm = forward_backward(model, opt, x, y, r.grad_clip)
            if not math.isfinite(loss_value):
                kept = (step - 1) - (step - 1) % r.ckpt_every
                status, reason = "diverged", f"loss is {loss_value} at step {step}; kept checkpoints up to step {kept}"
                break
            opt.step()
            run.observe_step(step, loss_value)  # after the update: the weights a checkpoint at this step holds
            loss_sum += loss_value
            tokens += x.numel()
            steps_file.write(f"{step},{loss_value:.6f},{grad_norm:.6f},{lr:.8g}\n")
            if step % r.ckpt_every == 0:
                steps_file.flush()
                val_loss = run.checkpoint(step, loss_sum / r.ckpt_every)
                loss_sum = 0.0
                rate = tokens / (time.perf_counter() - t0)
                bar.set_postfix(loss=f"{loss_value:.3f}", val=f"{val_loss:.3f}", tok_s=f"{rate:,.0f}")
                if bar.disable:
                    losses = f"loss {loss_value:.4f} val {val_loss:.4f}"
                    log(f"[{run.cfg.name}] step {step}/{r.steps} {losses} {rate:,.0f} tok/s")
            bar.update(1)
    bar.close()
    return status, reason, tokens


def run_summary(run: Run, status: str, tokens: int, elapsed: float) -> dict:
    """The metrics of a run from its checkpoints on disk: final losses, tokens/s, status."""
    ckpts = list_checkpoints(run.run_dir)
    last = ckpts[-1].meta if ckpts else {}
    return {
        "rung": run.cfg.rung,
        "variant": run.cfg.variant,
        "seed": run.cfg.recipe.seed,
        "status": status,
        "n_params": count_parameters(run.model),
        "checkpoints": len(ckpts),
        "final_step": last.get("step"),
        "final_val_loss": last.get("val_loss"),
        "final_train_loss": last.get("train_loss"),
        "tokens_per_s": tokens / elapsed if elapsed > 0 and tokens else None,
        "device": str(run.device),
    }


def write_checkpoint_table(run_dir: Path, path: Path) -> None:
    """A CSV (step, val_loss, train_loss, val_bpb) from the sidecars, for plots and the warehouse (val_bpb:
    bits per UTF-8 byte, empty where a sidecar has none)."""
    rows = [
        f"{c.step},{c.meta['val_loss']:.6f},{c.meta['train_loss']:.6f},{_bpb(c.meta)}\n"
        for c in list_checkpoints(run_dir)
    ]
    write_text(path, "step,val_loss,train_loss,val_bpb\n" + "".join(rows))


def _bpb(meta: dict) -> str:
    return f"{meta['val_bpb']:.6f}" if meta.get("val_bpb") is not None else ""


def load_run_config(path: Path) -> RunConfig:
    """A run's config file as written by the config stage."""
    try:
        return RunConfig.from_dict(json.loads(Path(path).read_text()))
    except FileNotFoundError as err:
        raise ParamsError(f"{path} not found; run `dvc repro config` first") from err
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        why = f"{type(err).__name__}: {err}"
        raise ParamsError(f"{path} is not a run config ({why}); regenerate it: dvc repro config") from err


def build_run_config(params, rung: str, seed: int, variant: str = BASE_VARIANT, vocab_size: int = 128) -> RunConfig:
    """Merge ``train`` (with ``variants.<variant>``'s overrides) and ``ladder.<rung>``
    (topometrics.params.Params) into the config of one run; ``vocab_size`` is the prepared corpus's
    (:func:`topometrics.models.tokens.vocab_size`: 128 for characters).

    ``seed`` must be one of ``train.seeds``: there is one run per rung x variant x seed.
    """
    t = params.recipe(variant)
    if seed not in t.seeds:
        raise ParamsError(f"seed {seed} is not in train.seeds={list(t.seeds)}; add it there")
    model = GPTConfig(vocab_size=vocab_size, context=params.data.seq_len, **params.rung_shape(rung))
    recipe = Recipe(**{k: getattr(t, k) for k in RECIPE_KEYS}, seed=seed, val_windows=params.data.val_windows)
    return RunConfig(rung, model, recipe, variant)
