"""Random recipe variants for a sweep whose between-cell test needs many recipes, not many seeds.

    python tools/sample_recipes.py [--n 15] [--seed 2026] [--steps 1000] [--yaml]

Prints ``-S +variants.rNN={...}`` overrides for ``dvc exp run $(python tools/sample_recipes.py)`` (each one
shell word: no spaces, no glob characters; the shell does not brace-expand a substitution's output), or with
``--yaml`` the same variants as a ``variants:`` block for params.yaml.
Each recipe is drawn independently (``numpy.random.default_rng(seed)``):

- peak learning rate log-uniform over [LR_RANGE] (12x: the verdict's recipe baseline must meet rates it has
  not seen, and sharpness follows the step size);
- weight decay log-uniform over [WD_RANGE];
- warm-up uniform over [WARMUP_SHARE] of the steps;
- schedule kind uniform among cosine, wsd and constant_decay, the last two with a decay tail uniform over
  [DECAY_RANGE] of the steps;
- batch size uniform among BATCH_SIZES.

The same seed gives the same variants on every machine (the draws are rounded to 4 significant digits, so
the printed values are the recipes).
"""

from __future__ import annotations

import argparse
import math

import numpy as np

LR_RANGE = (0.001, 0.012)
WD_RANGE = (0.001, 0.1)
WARMUP_SHARE = (0.02, 0.15)
DECAY_RANGE = (0.1, 0.3)
SHAPES = ("cosine", "wsd", "constant_decay")
BATCH_SIZES = (32, 48, 64, 96)


def _round(x: float) -> float:
    """``x`` to 4 significant digits."""
    return float(f"{x:.4g}")


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return _round(math.exp(rng.uniform(math.log(low), math.log(high))))


def sample_recipes(n: int, seed: int, steps: int) -> dict[str, dict]:
    """``n`` recipe variants ``r01 .. rNN`` -> recipe overrides (keys of ``params_variants.RECIPE_KEYS``)."""
    rng = np.random.default_rng(seed)
    recipes = {}
    for i in range(1, n + 1):
        recipe = {
            "lr": _log_uniform(rng, *LR_RANGE),
            "weight_decay": _log_uniform(rng, *WD_RANGE),
            "warmup": int(round(rng.uniform(*WARMUP_SHARE) * steps)),
            "schedule": SHAPES[int(rng.integers(len(SHAPES)))],
            "batch_size": BATCH_SIZES[int(rng.integers(len(BATCH_SIZES)))],
        }
        decay_fraction = _round(rng.uniform(*DECAY_RANGE))  # drawn for every recipe: one stream whatever the shape
        if recipe["schedule"] != "cosine":
            recipe["decay_fraction"] = decay_fraction
        recipes[f"r{i:02d}"] = recipe
    return recipes


def overrides(recipes: dict[str, dict]) -> list[str]:
    """One ``+variants.NAME={k:v,...}`` override per recipe, without spaces (one shell word each)."""
    return [
        "+variants.{}={{{}}}".format(name, ",".join(f"{k}:{v}" for k, v in r.items())) for name, r in recipes.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=15)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--yaml", action="store_true", help="print a variants: block instead of -S overrides")
    args = parser.parse_args()
    recipes = sample_recipes(args.n, args.seed, args.steps)
    if args.yaml:
        print("variants:")
        for name, recipe in recipes.items():
            print(f"  {name}: {{{', '.join(f'{k}: {v}' for k, v in recipe.items())}}}")
    else:
        print(" ".join(f"-S {o}" for o in overrides(recipes)))


if __name__ == "__main__":
    main()
