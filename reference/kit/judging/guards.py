"""Watching a load from outside: the files it must not write, the error it must raise.

`Seal`: loaders never write a checkpoint file (CKPT-5, ZC-13). A test seals the files it wrote
before it hands them to a loader; `broken()` lists every sealed file whose bytes changed since,
and every file that appeared under a sealed folder (a cache or lock a loader left beside them).

`failure_of`: a load of bad input must end in an error (CKPT-4): not hang, and not return a model.
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reference.kit.failures import SeamViolation

__all__ = ["Seal", "failure_of", "fingerprint", "sealing"]

CHUNK_BYTES = 1024**2


def _data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """The (start, end) ranges of `fd` that hold data (`SEEK_DATA`/`SEEK_HOLE`); a file system
    without holes reports the whole file as one."""
    extents: list[tuple[int, int]] = []
    position = 0
    while position < size:
        try:
            start = os.lseek(fd, position, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole is left
                break
            raise
        end = os.lseek(fd, start, os.SEEK_HOLE)
        extents.append((start, end))
        position = end
    return extents


def fingerprint(path: Path) -> str:
    """What a seal keeps of a file: the hash of its size, where it holds data, and that data.
    A hole reads as zeros, so this is the file's content; but only the data is read, so the
    corpus's 4 GiB sparse index costs nothing, and a write anywhere shows (even of a zero into
    a hole: it turns the hole into data)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        extents = _data_extents(f.fileno(), size)
        digest.update(repr((size, extents)).encode())
        for start, end in extents:
            f.seek(start)
            left = end - start
            while left > 0 and (chunk := f.read(min(CHUNK_BYTES, left))):
                digest.update(chunk)
                left -= len(chunk)
    return digest.hexdigest()


class Seal:
    """The fingerprints of sealed files (`fingerprint`), by path; `roots` lists what was
    sealed, files or folders."""

    def __init__(self) -> None:
        self.hashes: dict[Path, str] = {}
        self.roots: list[Path] = []

    def add(self, *paths: Path) -> None:
        """Seal files, and every file under folders (again after a test's own edit)."""
        self.roots.extend(paths)
        for path in paths:
            files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
            for file in files:
                if file.is_file():
                    self.hashes[file] = fingerprint(file)

    def broken(self) -> list[str]:
        """Sealed files whose bytes changed or that are gone, and files created under a sealed
        folder since; empty when all are intact."""
        changed = [
            f"{path}: {'gone' if not path.is_file() else 'bytes changed'}"
            for path, digest in self.hashes.items()
            if not path.is_file() or fingerprint(path) != digest
        ]
        folders = [root for root in self.roots if root.is_dir()]
        created = sorted(
            {p for root in folders for p in root.rglob("*") if p.is_file()} - set(self.hashes)
        )
        return changed + [f"{path}: created after sealing" for path in created]


def sealing() -> Iterator[Seal]:
    """One test's seal: every checkpoint file the test hands a loader is hashed before the load,
    and after the test something must have been sealed and every sealed file be intact.

    Test modules make it their autouse fixture: `sealed = pytest.fixture(autouse=True)(sealing)`.
    """
    seal = Seal()
    yield seal
    assert seal.roots, "the test sealed no checkpoint"
    assert seal.broken() == []


def failure_of(load: Callable[[], object], *, seconds: float = 120.0) -> BaseException:
    """Run `load`, which must fail, in a thread bounded in time; return what it raised.

    The error comes back without its traceback (and so do the errors it chains), so the frames of
    the failed load no longer keep its locals alive: whatever the error still references, the
    caller holds.

    Raises:
        AssertionError: `load` did not finish within `seconds`, or returned instead of raising.
    """
    outcome: list[BaseException | object] = []

    def run() -> None:
        try:
            outcome.append(load())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the load hung (still running after {seconds:.0f} s)"
    (result,) = outcome
    if isinstance(result, (pytest.skip.Exception, SeamViolation)):
        raise result  # a GPU-tier path (the test skips), or a defect of the test itself
    assert isinstance(result, BaseException), f"the load returned {type(result).__name__}"
    chain: list[BaseException] = [result]
    while chain[-1].__cause__ or chain[-1].__context__:
        following = chain[-1].__cause__ or chain[-1].__context__
        if following is None or following in chain:
            break
        chain.append(following)
    for error in chain:
        error.__traceback__ = None
    return result
