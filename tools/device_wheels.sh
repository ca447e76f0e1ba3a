#!/usr/bin/env bash
# Run here, before a GPU check: downloads into .whl/ (git-ignored) the wheels of the packages that
# `python -m bench device` imports and the lent machine's image lacks, at requirements.lock's versions, built
# for that machine's Python 3.12 on x86-64. tools/device_check.sh installs them there.
#
# Which packages: the top-level modules a `python -m bench device --tiny --device cpu` imported in every one of
# its processes (recorded by an import hook), less the image's packages (the device tool's KINDS.md): ripser
# and ruptures. dask/distributed and dvclive are imported only when present (a Dask worker's print, the live
# relay); DuckDB and Altair only by the analysis and the report, which the check does not run.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t pins < <(grep -E '^(ripser|ruptures)==' requirements.lock)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
  manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl "${pins[@]}"
echo "device wheels: $(ls .whl/*.whl | wc -l) in .whl/ ($(du -ch .whl/*.whl | tail -1 | cut -f1)): ${pins[*]}"
