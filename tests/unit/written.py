"""Test inputs written once per process, each use given its own copy.

The selftest tier runs a contract file once per broken loader, all in one process (in-process
`pytest.main`), and each run's fixtures would write their inputs anew: the hub pipelines, written
by diffusers' and transformers' own `save_pretrained`, took seconds a run. A folder written here
is kept untouched for the process; every caller gets a copy, so a loader that writes into its
checkpoint (ZC-13) changes its own copy only.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
from collections.abc import Callable, Hashable
from pathlib import Path

__all__ = ["copy_of_written"]

_PRISTINE: dict[Hashable, Path] = {}
_LOCK = threading.Lock()


def copy_of_written(key: Hashable, folder: Path, write: Callable[[Path], object]) -> Path:
    """`folder` (which must not exist) holding what `write(path)` writes into a new `path`: run
    once per process for each `key`, copied for every call. Returns `folder`."""
    with _LOCK:
        pristine = _PRISTINE.get(key)
        if pristine is None:
            base = Path(tempfile.mkdtemp(prefix="written-"))
            atexit.register(shutil.rmtree, base, True)
            pristine = base / "folder"
            write(pristine)
            _PRISTINE[key] = pristine
    shutil.copytree(pristine, folder)
    return folder
