"""`python -m reference ARGV` run inside the test's own interpreter, as a fresh one would run it.

A new interpreter per command costs seconds (torch's import, diffusers' too) and its code is not
measured by coverage, so the command-line tests call `reference.__main__.main` here instead.
Tests that judge the fresh interpreter itself (what it imports, that the module runs at all) still
start a subprocess.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from unittest.mock import patch

import reference
from reference.__main__ import main
from reference.pipeline import MODELS
from reference.platform import SystemPlatform

ROOT = Path(reference.__file__).resolve().parents[1]  # the folder holding the reference package


@dataclass(frozen=True)
class Result:
    """What the command did, shaped like `subprocess.CompletedProcess[str]`."""

    returncode: int
    stdout: str
    stderr: str


def models_modules(argv: Sequence[str]) -> list[str]:
    """The modules that `--models MODULE` or `--models=MODULE` name in `argv`, in order."""
    named = [value for flag, value in itertools.pairwise(argv) if flag == "--models"]
    return named + [arg.split("=", 1)[1] for arg in argv if arg.startswith("--models=")]


@contextlib.contextmanager
def fresh_models(modules: Sequence[str]) -> Iterator[None]:
    """reference.pipeline.MODELS empty, as in a new interpreter, until the command imports models.

    Each of `modules` and each module whose classes are registered now is unimported for the
    while, so importing it (`--models MODULE`, or the demo's own import) runs it again and its
    registrations happen; nothing another test imported is offered. On exit the registry and
    those modules are as they were.
    """
    classes = MODELS.snapshot()
    names = {*modules, *(cls.__module__ for cls in classes.values())} - {"__main__"}
    saved = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    MODELS.restore({})
    try:
        yield
    finally:
        MODELS.restore(classes)
        for name in names:
            sys.modules.pop(name, None)
        for name, module in saved.items():
            _restore(name, module)


def _restore(name: str, module: ModuleType) -> None:
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:  # importing it again rebound the parent package's attribute
        setattr(sys.modules[parent], child, module)


def run_reference(*argv: str, hide_cuda: bool = False) -> Result:
    """Run `python -m reference ARGV` here; its exit code and everything it printed.

    Args:
        argv: the command line after `python -m reference`.
        hide_cuda: the reference's platform sees no CUDA device, as under
            `CUDA_VISIBLE_DEVICES=` (every CUDA fact the reference uses comes from it).

    The registry starts empty (see fresh_models). stdout and stderr are strings, not terminals,
    so no progress bar is drawn.
    """
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        if hide_cuda:
            stack.enter_context(patch.object(SystemPlatform, "cuda_available", lambda _: False))
            stack.enter_context(patch.object(SystemPlatform, "device_count", lambda _: 0))
        stack.enter_context(fresh_models(models_modules(argv)))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's --help and usage errors: an int status
            code = int(exc.code or 0)
    return Result(code, out.getvalue(), err.getvalue())


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
