"""`python -m reference conform`: run the installed contract tests against a loader, no clone.

    python -m reference conform --loader=my_pkg:MyAdapter --conformance-report=r.json [PYTEST ARGS]

The contract tests are installed as `reference.kit.suite` (a clone holds them in tests/unit).
This runs pytest over them with the suite's plugin, contract tests only (`-m "not internal"`),
and pytest's own configuration files ignored, so the run is the same from any directory.
Every argument is pytest's: the plugin's options (`--loader`, `--conformance-report`,
`--expectations`, `--runtime-device`) and any other (`-k`, `-x`, `-n 4` with pytest-xdist). A
later `-m` replaces the default selection. Nothing is written into the installed package (no
cache folder, no bytecode) nor into the caller's folder: hypothesis keeps its example database
in a temporary folder removed afterwards; only the files the caller names (a report) appear.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from reference.extras import install_hint
from reference.kit.errors import KitError

__all__ = [
    "HYPOTHESIS_STORAGE",
    "PLUGIN",
    "SUITE",
    "SuiteNotInstalledError",
    "conform_command",
    "nothing_left_behind",
    "pytest_arguments",
    "suite_folder",
]

SUITE = "reference.kit.suite"
PLUGIN = "reference.kit.plugin"


class SuiteNotInstalledError(KitError, RuntimeError):
    """The contract tests are not importable as `reference.kit.suite`."""


def suite_folder() -> Path:
    """The folder of the installed contract tests.

    Raises:
        SuiteNotInstalledError: `reference` runs from a source tree that was not installed.
    """
    spec = importlib.util.find_spec(SUITE)
    if spec is None or not spec.submodule_search_locations:
        raise SuiteNotInstalledError(
            f"the contract tests ({SUITE}) are not installed with this copy of reference. From a"
            " clone, run them where they live: python -m pytest tests/unit --loader=SPEC; or"
            " install the package from the clone (pip install '.[test]') or from its built wheel"
            " (pip install 'dist/diffusion_loader_conformance-0.1.0-py3-none-any.whl[test]')"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def pytest_arguments(folder: Path, argv: Sequence[str]) -> list[str]:
    """The command line `conform` hands pytest: the suite, its plugin, then the caller's."""
    return [
        str(folder),
        "-p",
        PLUGIN,
        "-p",
        "no:cacheprovider",
        # The caller's pytest.ini or pyproject.toml configures their tests, not these.
        "-c",
        os.devnull,
        f"--rootdir={folder}",
        "--strict-markers",
        "-m",
        "not internal",
        *argv,
    ]


HYPOTHESIS_STORAGE = "HYPOTHESIS_STORAGE_DIRECTORY"


@contextlib.contextmanager
def nothing_left_behind() -> Iterator[None]:
    """While the suite runs: no bytecode beside the installed tests, and hypothesis's example
    database (by default `.hypothesis/` in the working folder) in a temporary folder."""
    saved_flag, saved_storage = sys.dont_write_bytecode, os.environ.get(HYPOTHESIS_STORAGE)
    sys.dont_write_bytecode = True
    with tempfile.TemporaryDirectory(prefix="conform-hypothesis-") as storage:
        os.environ[HYPOTHESIS_STORAGE] = storage  # xdist workers inherit it
        try:
            yield
        finally:
            sys.dont_write_bytecode = saved_flag
            if saved_storage is None:
                os.environ.pop(HYPOTHESIS_STORAGE, None)
            else:
                os.environ[HYPOTHESIS_STORAGE] = saved_storage


def conform_command(argv: Sequence[str]) -> int:
    """Run the contract tests against the loader `argv` selects.

    Args:
        argv: pytest's arguments; `--loader=SPEC` selects the loader (else $LOADER_UNDER_TEST;
            with neither, pytest stops with a usage error: no loader is judged by default).

    Returns:
        pytest's exit code: 0 when every contract test passed or was expected to fail.
    """
    if list(argv) in (["-h"], ["--help"]):
        print((__doc__ or "").strip())
        return 0
    try:
        folder = suite_folder()
    except SuiteNotInstalledError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        import pytest  # the test extra; imported here so the loader's commands do not need it
    except ImportError:
        print(
            f"error: conform runs pytest, which is not installed: {install_hint('test')}",
            file=sys.stderr,
        )
        return 2

    with nothing_left_behind():
        return int(pytest.main(pytest_arguments(folder, argv)))
