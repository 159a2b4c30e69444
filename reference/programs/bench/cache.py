"""The page-cache state a benchmark run starts from: warm (every page cached) or cold (none).

A cold start drops a file's pages with `os.fsync` then `os.posix_fadvise(POSIX_FADV_DONTNEED)`,
which needs no privileges. The kernel keeps any page some process maps, so this only works for
files nothing maps: every benchmark run is a fresh process that has not mapped them yet. Whether
it worked is checked, not assumed: `cached_fraction` asks `mincore` which pages of a shared
read-only map of the file are resident (Linux reports page-cache residency for files the caller
owns or may write, which holds for the checkpoints the benchmark wrote itself).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "CACHES",
    "COLD_LIMIT",
    "WARM_BUFFER",
    "cached_fraction",
    "cannot_drop",
    "drop",
    "make_cold",
    "make_warm",
    "start_state",
]

CACHES = ("warm", "cold")
COLD_LIMIT = 0.01
"""A run counts as cold when at most this fraction of its files' pages is cached at the start."""
WARM_BUFFER = 16 << 20


def cannot_drop() -> str | None:
    """Why this platform cannot drop a file's pages from the page cache, or None."""
    if not hasattr(os, "posix_fadvise"):
        return "os.posix_fadvise is not available here"
    if ctypes.util.find_library("c") is None:
        return "no C library to call mincore with (coldness cannot be checked)"
    return None


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def _cached_pages(libc: ctypes.CDLL, path: Path) -> tuple[int, int]:
    """(cached pages, pages) of one file."""
    size = path.stat().st_size
    if size == 0:
        return 0, 0
    page = mmap.PAGESIZE
    pages = (size + page - 1) // page
    fd = os.open(path, os.O_RDONLY)
    try:
        # A map of the file's own (no Python mmap object: ctypes cannot take the address of a
        # read-only one); mapping touches no page, so it does not change what it measures.
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address is None or address == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            vector = (ctypes.c_ubyte * pages)()
            if libc.mincore(ctypes.c_void_p(address), size, vector) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
        finally:
            libc.munmap(ctypes.c_void_p(address), size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in bytes(vector)), pages


def cached_fraction(paths: Sequence[Path]) -> float:
    """The fraction of the files' pages in the page cache now (1.0 for no bytes at all)."""
    libc = _libc()
    counts = [_cached_pages(libc, path) for path in paths]
    pages = sum(total for _, total in counts)
    return 1.0 if pages == 0 else sum(cached for cached, _ in counts) / pages


def drop(paths: Sequence[Path]) -> None:
    """Ask the kernel to evict the files' pages (written back first, so none stays dirty)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def make_cold(paths: Sequence[Path]) -> str | None:
    """Drop the files' pages; returns why the run cannot start cold, or None when at most
    `COLD_LIMIT` of their pages stayed cached."""
    reason = cannot_drop()
    if reason is not None:
        return reason
    drop(paths)
    fraction = cached_fraction(paths)
    if fraction > COLD_LIMIT:
        return (
            f"the page cache kept {fraction:.0%} of the checkpoint's pages after"
            " POSIX_FADV_DONTNEED (a file system whose files live in memory, such as tmpfs,"
            " or a process maps the file)"
        )
    return None


def make_warm(paths: Sequence[Path]) -> None:
    """Read the files once through the page cache."""
    buffer = bytearray(WARM_BUFFER)
    for path in paths:
        with path.open("rb", buffering=0) as f:
            while f.readinto(buffer):
                pass


def start_state(files: Sequence[Path], cache: str) -> dict[str, object]:
    """Put `files` into the page-cache state `cache` names ("warm": read once; "cold": pages
    dropped), right before a run's clock starts; {"cached": fraction}, or {"skipped": why} when
    a cold start was asked for and the pages could not be dropped."""
    if cache == "cold":
        reason = make_cold(files)
        if reason is not None:
            return {"skipped": reason}
    else:
        make_warm(files)
    return {"cached": cached_fraction(files)}
