"""The project's errors, and the one wrapper every stage script runs its ``main`` in.

A user mistake (a wrong param, a corpus too small, a damaged checkpoint, a held warehouse file)
raises a :class:`TopometricsError` whose message says what is wrong, which key or file, and the
fix. :func:`run_stage` prints it as one line, ``error: <message>``, and exits with status 1; so is a
full disk (:class:`DiskFullError`), and Ctrl-C is one line and exit status 130. Any other exception
is a bug in this code and keeps its traceback. ``TOPOMETRICS_TRACEBACK=1`` shows
the traceback of a user mistake too (for reporting a message that does not help).

The shared command line of ``stages/*.py``: ``main(argv)`` parses its arguments with
:func:`stage_parser` (the script's docstring as help, ``--params`` defaulting to params.yaml)
and the script ends with ``run_stage(main)``.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

TRACEBACK_ENV = "TOPOMETRICS_TRACEBACK"


class TopometricsError(Exception):
    """A mistake the user can fix; the message names what is wrong, the key or file, and the fix."""


class DiskFullError(TopometricsError, OSError):
    """A write failed for want of space (or quota); the message names the file and the fix."""


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def disk_full(path: Path | str | None) -> DiskFullError:
    """The one-line error of a write to ``path`` that found its disk full (every write is atomic, so the
    file's previous version, and every finished file, is intact)."""
    where = f"{path}: no space left on its disk" if path else "no space left on the disk being written"
    return DiskFullError(f"{where}; free space there (or point the output elsewhere) and rerun `dvc repro`: "
                         "finished work is kept and only what was being written is redone")  # fmt: skip


def stage_parser(doc: str | None) -> argparse.ArgumentParser:
    """The argument parser of a stage script: its docstring as help, and ``--params``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="params file (default params.yaml)")
    return parser


MAX_LINE = 300  # characters of a one-line error; a longer message (a value echoed whole) keeps its head and tail


def one_line(err: BaseException) -> str:
    """``error: <message>`` on one line (a multi-line message is joined with ' | '), at most about
    :data:`MAX_LINE` characters: the head (what is wrong, which key or file) and the tail (the fix) are kept."""
    text = " | ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__
    if len(text) > MAX_LINE:
        text = f"{text[:180]} [... {len(text) - 260:,} characters ...] {text[-80:]}"
    return f"error: {text}"


def run_stage(main: Callable[[Sequence[str]], object], argv: Sequence[str] | None = None) -> None:
    """Run a stage's ``main(argv)``; a :class:`TopometricsError` becomes one line on stderr and exit 1."""
    try:
        main(sys.argv[1:] if argv is None else list(argv))
    except TopometricsError as err:
        if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
            raise
        print(one_line(err), file=sys.stderr, flush=True)
        sys.exit(1)
    except KeyboardInterrupt:
        print("error: interrupted (Ctrl-C); finished work is kept, rerun `dvc repro` to go on", file=sys.stderr,
              flush=True)  # fmt: skip
        sys.exit(130)
    except OSError as err:  # a write outside topometrics.atomic (a log appended row by row) found the disk full
        if err.errno not in NO_SPACE:
            raise
        print(one_line(disk_full(err.filename)), file=sys.stderr, flush=True)
        sys.exit(1)
