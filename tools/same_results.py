"""Does a code change keep the results? Reproduce a tiny pipeline from two checkouts and compare them.

    python tools/same_results.py make CHECKOUT OUT     # tiny project from CHECKOUT's pipeline, dvc repro, dump
    python tools/same_results.py compare OUT_A OUT_B   # every table and view equal, every checkpoint identical

``make`` copies the checkout's ``dvc.yaml``, ``stages/`` and ``topometrics/`` into ``OUT/project`` (run
with ``PYTHONPATH`` pointing there, so the copy is the code that runs), with a tiny ladder (2 rungs x
2 seeds, 40 steps) and a local run-folder series of a random Llama (4 checkpoints with a losses file),
runs ``dvc repro`` and dumps every warehouse table and view to ``OUT/tables/<name>.parquet`` and the
sha256 of every file under ``data/runs`` to ``OUT/runs.json``.

``compare`` exits 0 when every table and view is equal (``assert_frame_equal(check_exact=True)``; the
Spearman columns DuckDB computes with parallel aggregates within 1e-12, as they move between two runs
of the same code), every checkpoint file is byte-identical, and every resume state holds the same
tensors and metadata (its header's key order varies run to run). ``meta`` (code version, SQL hashes,
params paths), ``runs.code_version`` (the temporary project's own commit) and ``runs.tokens_per_s`` (training
throughput: a timing) are not compared.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pandas as pd
import torch
import yaml
from pandas.testing import assert_frame_equal
from safetensors import safe_open
from safetensors.torch import save_file

TINY = {
    "data": {"corpus": "wikitext-2-raw-v1", "urls": [], "val_windows": 8, "seq_len": 32},
    "train": {"steps": 40, "ckpt_every": 10, "batch_size": 8, "warmup": 2, "threads": 1, "hidden": 8, "heads": 2,
              "seeds": [42, 7]},
    "features": {"rep_points": 64, "rep_batch": 4, "max_points": 32, "workers": 1},
    "analysis": {"bootstrap": 50},
}  # fmt: skip
LADDER = {"a": {"hidden": 8, "layers": 1, "heads": 1}, "b": {}}
PARALLEL_AGGREGATES = ("feature_loss_spearman", "partial_spearman", "tests")  # last bits may move run to run


def make(checkout: Path, out: Path) -> None:
    project = out / "project"
    shutil.rmtree(out, ignore_errors=True)
    copy_pipeline(checkout, project)
    folder = llama_run_folder(out / "llama-run")
    params = yaml.safe_load((checkout / "params.yaml").read_text())
    params |= {section: params[section] | values for section, values in TINY.items()}
    params["ladder"] = LADDER
    params["series"]["sources"] = {"llama-local": {"path": str(folder), "losses": str(folder / "losses.csv")}}
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = project_env(project)
    identity = ["-c", "user.email=same-results@topometrics.invalid", "-c", "user.name=same-results"]
    commit = ["git", *identity, "commit", "-qm", "tiny"]
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], commit, ["dvc", "repro"]):
        proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
        with (out / "repro.log").open("a") as log:
            log.write(proc.stdout + proc.stderr)
        if proc.returncode:
            sys.exit(f"error: {' '.join(cmd)} failed in {project}; see {out / 'repro.log'}")
    dump(project, out)


def project_env(project: Path) -> dict[str, str]:
    """The environment a copied project's pipeline runs in: its own code first on ``PYTHONPATH`` (not an
    editable install's), this interpreter's ``dvc`` on ``PATH``, no analytics, the hub offline."""
    env = dict(os.environ, PYTHONPATH=str(project), DVC_NO_ANALYTICS="1", HF_HUB_OFFLINE="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


def start_repro(project: Path, log: Path, message: str) -> subprocess.Popen:
    """``git init``, a first commit named ``message`` and ``dvc repro`` in ``project`` (:func:`project_env`),
    started in the background with its output in ``log``; the caller waits for it."""
    ident = "-c user.email=compare@topometrics.invalid -c user.name=compare"
    script = f"git init -q && git add -A && git {ident} commit -qm {message} && dvc repro"
    with log.open("w") as out:  # the child holds its own copy of the descriptor
        return subprocess.Popen(script, shell=True, cwd=project, env=project_env(project),  # noqa: S602 (fixed)
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def copy_pipeline(checkout: Path, project: Path) -> None:
    """The files a project needs to run ``checkout``'s pipeline (its code, stages, dvc.yaml and DVC config)."""
    project.mkdir(parents=True)
    for name in ("dvc.yaml", "stages", "topometrics", ".dvc/config", ".dvc/plots", ".dvcignore", ".gitignore"):
        src = checkout / name
        if src.is_dir():
            shutil.copytree(src, project / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            (project / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, project / name)


def llama_run_folder(folder: Path) -> Path:
    """A run folder of a tiny random Llama: config.json, run-<step>.safetensors, losses.csv (seeded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True)
    torch.manual_seed(0)
    shape = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}
    model = LlamaForCausalLM(LlamaConfig(**shape, vocab_size=64))
    model.config.save_pretrained(folder)
    gen = torch.Generator().manual_seed(0)
    for step in (0, 100, 200, 300):
        state = {k: torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items() if k != "lm_head.weight"}
        save_file(state, str(folder / f"run-{step}.safetensors"))
    (folder / "losses.csv").write_text("step,loss,eval_loss\n0,4.1,4.2\n100,3.0,3.3\n200,2.9,3.1\n300,2.8,3.0\n")
    return folder


def dump(project: Path, out: Path) -> None:
    (out / "tables").mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(project / "data" / "warehouse.duckdb"), read_only=True)
    names = sorted(con.execute("select table_name, table_type from information_schema.tables").fetchall())
    for name, _ in names:
        con.execute(f'select * from "{name}"').df().to_parquet(out / "tables" / f"{name}.parquet")
    (out / "tables.json").write_text(json.dumps(names, indent=1))
    runs = project / "data" / "runs"
    files = (p for p in sorted(runs.rglob("*")) if p.is_file())  # run directories hold folders too
    hashes = {str(p.relative_to(project)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    (out / "runs.json").write_text(json.dumps(hashes, indent=1))
    print(f"{len(names)} tables and views, {len(hashes)} run files -> {out}")


def compare(a: Path, b: Path) -> bool:
    names_a, names_b = (json.loads((d / "tables.json").read_text()) for d in (a, b))
    same = names_a == names_b
    if not same:
        print(f"DIFFER tables and views: {names_a} vs {names_b}")
    for name, kind in (n for n in names_a if n in names_b):
        same &= compare_table(a, b, name, kind)
    return compare_runs(a, b) and same


def compare_table(a: Path, b: Path, name: str, kind: str) -> bool:
    fa, fb = (pd.read_parquet(d / "tables" / f"{name}.parquet") for d in (a, b))
    if name == "meta":
        differ = sorted(set(map(tuple, fa.values.tolist())) ^ set(map(tuple, fb.values.tolist())))
        print(f"meta: {len({row[0] for row in differ})} keys differ (not compared): {sorted({r[0] for r in differ})}")
        return True
    if name == "runs":  # the temporary project's own commit, and a throughput (wall-clock): not results
        fa, fb = fa.drop(columns=["code_version", "tokens_per_s"]), fb.drop(columns=["code_version", "tokens_per_s"])
    fa, fb = (f.sort_values(list(f.columns), na_position="first").reset_index(drop=True) for f in (fa, fb))
    exact = name not in PARALLEL_AGGREGATES
    try:
        assert_frame_equal(fa, fb, check_exact=exact, rtol=0 if exact else 1e-12, atol=0 if exact else 1e-12)
    except AssertionError as err:
        print(f"DIFFER {kind} {name}: {' '.join(str(err).split())[:300]}")
        return False
    print(f"equal  {kind} {name} {fa.shape}" + ("" if exact else " (within 1e-12)"))
    return True


def compare_runs(a: Path, b: Path) -> bool:
    ra, rb = (json.loads((d / "runs.json").read_text()) for d in (a, b))
    checkpoints = [k for k in ra if k.endswith(".safetensors") and "/resume." not in k]
    identical = [k for k in checkpoints if ra[k] == rb.get(k)]
    resumes = [k for k in ra if "/resume." in k]
    whole = [k for k in resumes if k in rb and same_tensors(a / "project" / k, b / "project" / k)]
    others = sorted(k for k in ra if k not in checkpoints + resumes and ra[k] != rb.get(k))  # summaries: timings
    print(f"checkpoints byte-identical: {len(identical)}/{len(checkpoints)}; resume states equal: {len(whole)}/"
          f"{len(resumes)}; other run files that differ: {others}")  # fmt: skip
    return len(identical) == len(checkpoints) == len(set(rb) & set(checkpoints)) and len(whole) == len(resumes)


def same_tensors(path_a: Path, path_b: Path) -> bool:
    with safe_open(str(path_a), "pt") as fa, safe_open(str(path_b), "pt") as fb:
        if fa.metadata() != fb.metadata() or sorted(fa.keys()) != sorted(fb.keys()):
            return False
        return all(torch.equal(fa.get_tensor(k), fb.get_tensor(k)) for k in fa.keys())  # noqa: SIM118 (safe_open is not iterable)


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("make", "compare"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    if argv[0] == "make":
        make(Path(argv[1]).resolve(), Path(argv[2]).resolve())
        return 0
    return 0 if compare(Path(argv[1]), Path(argv[2])) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
