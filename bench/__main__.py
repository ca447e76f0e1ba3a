"""Dispatch ``python -m bench NAME [args]`` to ``bench.NAME.main``."""

import importlib
import sys

BENCHMARKS = (
    "train", "np", "features", "curvature", "series", "scale", "monitor", "verify", "power", "sweep", "device", "pair",
)  # fmt: skip


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: python -m bench {{{','.join(BENCHMARKS)}}} [args]", file=sys.stderr)
        return 2
    module = importlib.import_module(f"bench.{argv[0]}")
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
