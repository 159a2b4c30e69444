"""What a call read, seen from the process, whichever loader made it ("How a rule is judged").

"No tensor data read before the refusal" cannot be judged by spying on one loader's reader: a
loader may read with `read()`, `safe_open`, `UntypedStorage.from_file` or its own mmap. Linux
shows every way from outside the loader:
  * bytes read: `rchar` of /proc/self/io counts every `read()`-family syscall of the process;
  * pages touched: the peak resident set (VmHWM, reset through /proc/self/clear_refs) grows by
    every mapped page a loader touches and every buffer it fills, even if freed before return;
  * files opened from Python: the `open` audit event (`sys.addaudithook`).
A checkpoint's tensor data must dwarf the noise (headers, module construction): tests that use
`DataReads` write a few MiB at least and compare against `data_bytes(...)`.
"""

from __future__ import annotations

import gc
import json
import os
import struct
import sys
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

__all__ = [
    "CLEAR_REFS",
    "IO",
    "RESET_PEAK",
    "STATUS",
    "DataReads",
    "data_bytes",
    "evidence_missing",
    "safetensors_files",
]

IO = "/proc/self/io"
STATUS = "/proc/self/status"
CLEAR_REFS = "/proc/self/clear_refs"
RESET_PEAK = "5"  # clear_refs: reset the peak resident set size (VmHWM) to the current one


def evidence_missing() -> str | None:
    """Why this process cannot watch reads (a test skips with it, so its rule is not credited),
    or None when it can."""
    try:
        _rchar()
        _status("VmHWM")
        with open(CLEAR_REFS, "w") as f:
            f.write(RESET_PEAK)
    except (OSError, KeyError, ValueError) as exc:
        return (
            "no evidence of reads can be gathered here: needs Linux's /proc/self/io, VmHWM and"
            f" a writable /proc/self/clear_refs ({exc})"
        )
    return None


def data_bytes(*paths: Path) -> int:
    """Bytes of tensor data in safetensors files (each file less its 8-byte length and header)."""
    total = 0
    for path in paths:
        with path.open("rb") as f:
            (header,) = struct.unpack("<Q", f.read(8))
        total += path.stat().st_size - 8 - header
    return total


def safetensors_files(root: Path) -> list[Path]:
    """The `.safetensors` files of a checkpoint: a file, an index's shards, or a folder's."""
    if root.is_dir():
        return sorted(root.rglob("*.safetensors"))
    if root.name.endswith(".index.json"):
        shards = set(json.loads(root.read_text())["weight_map"].values())
        return sorted(root.parent / shard for shard in shards)
    return [root]


def _rchar() -> int:
    with open(IO) as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise KeyError("rchar")


def _status(key: str) -> int:
    with open(STATUS) as f:
        for line in f:
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


class _Opens:
    """The process's one audit hook (hooks cannot be removed): paths opened while watched."""

    installed = False
    watching: ClassVar[list[list[str]]] = []

    @classmethod
    def hook(cls, event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and cls.watching and isinstance(args[0], (str, bytes, os.PathLike)):
            for seen in cls.watching:
                seen.append(os.fsdecode(args[0]))

    @classmethod
    def watch(cls, seen: list[str]) -> None:
        if not cls.installed:
            sys.addaudithook(cls.hook)
            cls.installed = True
        cls.watching.append(seen)


class DataReads:
    """Watches one call: bytes read, peak memory growth, files opened from Python.

    Use as a context manager; read the attributes after it exits. Not thread-safe: one at a time.

    Attributes:
        bytes_read: growth of the process's `rchar` (every read syscall, any file).
        peak_growth: peak resident bytes above the resident bytes at entry.
        opened: every path opened through Python's `open`/`os.open` meanwhile.
    """

    def __init__(self) -> None:
        self.bytes_read = 0
        self.peak_growth = 0
        self.opened: list[str] = []
        self._collecting = False

    def __enter__(self) -> DataReads:
        # No cyclic collection while watched: garbage an earlier call left (a module in a
        # reference cycle) freed during the call would lower the resident set, and the pages
        # the call touches would then not raise the peak above where it started.
        self._collecting = gc.isenabled()
        gc.disable()
        try:
            reason = evidence_missing()  # also resets the peak
            if reason is not None:
                raise RuntimeError(reason)
        except BaseException:
            self._restore_gc()
            raise
        _Opens.watch(self.opened)
        self._rchar = _rchar()
        self._rss = _status("VmRSS")
        return self

    def _restore_gc(self) -> None:
        if self._collecting:
            gc.enable()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.peak_growth = _status("VmHWM") - self._rss
        self.bytes_read = _rchar() - self._rchar
        _Opens.watching.remove(self.opened)
        self._restore_gc()

    def opened_any(self, paths: list[Path]) -> list[str]:
        """Those of `paths` opened from Python while watched."""
        wanted = {os.path.realpath(p) for p in paths}
        return sorted({p for p in self.opened if os.path.realpath(p) in wanted})

    def assert_no_data_read(self, data: int, *, what: str = "tensor data") -> None:
        """Neither read syscalls nor touched pages come near `data` bytes: a quarter of it is
        far above headers and bookkeeping, far below reading any sizeable part of the data."""
        bound = data // 4
        assert self.bytes_read < bound, (
            f"{self.bytes_read} bytes were read (bound {bound}): {what} was read"
        )
        assert self.peak_growth < bound, (
            f"resident memory peaked {self.peak_growth} bytes higher (bound {bound}):"
            f" {what} was touched"
        )
