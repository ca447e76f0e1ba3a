#!/usr/bin/env bash
# The GPU check on a lent device machine, run from the repository root there (the `device` tool's `run`,
# with `carry: [".whl"]` after tools/device_wheels.sh here):
#
#     bash tools/device_check.sh [python -m bench device's options, e.g. --sections train,features]
#
# Installs the wheels in .whl/ (if any) outside the image's environment, puts this checkout first on the path
# (no editable install there), then runs the check with unbuffered output: its JSON and its log go under $OUT
# (the files the tool brings back) or ./device-out. The exit status is the check's (1 when a section failed).
set -euo pipefail
out="${OUT:-device-out}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c 'import sys, torch; print("device check: Python", sys.version.split()[0], "torch", torch.__version__,
"cuda:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")' | tee "$out/device.log"
python3 -m bench device --out "$out/device.json" "$@" 2>&1 | tee -a "$out/device.log"
