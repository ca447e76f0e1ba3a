"""Imported first by every stage: this checkout's ``topometrics`` wins over any other on ``sys.path``.

``python stages/NAME.py`` puts ``stages/`` first on ``sys.path``, not the checkout, so without this the
``topometrics`` imported would be whatever the environment's editable install (or ``PYTHONPATH``) points at:
a second clone sharing the venv, or ``dvc exp run --temp/--queue`` running in a copy under
``.dvc/tmp/exps/``, would run another checkout's code while DVC records this one's.
"""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
if sys.path[:1] != [ROOT]:
    sys.path.insert(0, ROOT)
