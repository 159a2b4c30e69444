"""Files that a naive open or read blocks on or reads forever (CKPT-4's "never a hang"), named
like a checkpoint file and put where a loader looks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["BLOCKING", "make_blocking_file"]

BLOCKING = {"named-pipe": "a named pipe", "device-file": "a link to /dev/zero"}
"""The kinds `make_blocking_file` makes, and what each is."""


def make_blocking_file(kind: str, path: Path) -> Path:
    """At `path`, a file a naive open or read blocks on (`named-pipe`) or reads forever
    (`device-file`); the test is skipped where the platform has no such file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "named-pipe":
        if not hasattr(os, "mkfifo"):
            pytest.skip("named pipes are POSIX only")
        os.mkfifo(path)
    else:
        if not Path("/dev/zero").exists():
            pytest.skip("no /dev/zero here")
        path.symlink_to("/dev/zero")
    return path
