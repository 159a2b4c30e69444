"""`python -m reference ARGV` run inside the test's own interpreter, as a fresh one would run it.

A new interpreter per command costs seconds (torch's import, diffusers' too) and its code is not
measured by coverage, so the command-line tests call `reference.__main__.main` here instead.
Tests that judge the fresh interpreter itself (what it imports, that the module runs at all) still
start a subprocess.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from unittest.mock import patch

import reference
from fakes.corpus_models import while_building
from reference.__main__ import main
from reference.request.platform import SystemPlatform

ROOT = Path(reference.__file__).resolve().parents[1]  # the folder holding the reference package


@dataclass(frozen=True)
class Result:
    """What the command did, shaped like `subprocess.CompletedProcess[str]`."""

    returncode: int
    stdout: str
    stderr: str


def run_reference(*argv: str, hide_cuda: bool = False) -> Result:
    """Run `python -m reference ARGV` here; its exit code and everything it printed.

    Args:
        argv: the command line after `python -m reference`.
        hide_cuda: the reference's platform sees no CUDA device, as under
            `CUDA_VISIBLE_DEVICES=` (every CUDA fact the reference uses comes from it).

    The command builds its model registry from `--models` itself (no registry is global), so a
    run here sees what a new interpreter would. stdout and stderr are strings, not terminals, so
    no progress bar is drawn.
    """
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        if hide_cuda:
            stack.enter_context(patch.object(SystemPlatform, "cuda_available", lambda _: False))
            stack.enter_context(patch.object(SystemPlatform, "device_count", lambda _: 0))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's --help and usage errors: an int status
            code = int(exc.code or 0)
    return Result(code, out.getvalue(), err.getvalue())


def run_reference_with_a_shard_swapped_for_a_pipe(*argv: str, shard: Path) -> Result:
    """`run_reference(*argv, hide_cuda=True)`, with `shard` replaced by a named pipe the first
    time a corpus model is built (after the command checked the headers): another process
    swapping a file between the check and the read. Module-level, for an isolated attempt."""
    swapped: list[bool] = []

    def swap() -> None:
        if not swapped:
            swapped.append(True)
            shard.unlink()
            os.mkfifo(shard)

    with while_building(swap):
        return run_reference(*argv, hide_cuda=True)


def run_reference_fresh(*argv: str, pythonpath: str = "") -> subprocess.CompletedProcess[str]:
    """Run `python -m reference ARGV` in a new interpreter: offline, CUDA hidden.

    For tests that judge the fresh interpreter itself (what it imports, that the module runs,
    what reaches stderr when it fails); `pythonpath` adds a folder of `--models` modules.
    """
    path = os.pathsep.join(p for p in (str(ROOT), pythonpath, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [sys.executable, "-m", "reference", *argv],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
