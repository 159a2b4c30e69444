"""Populating a file's private map in the background, so zero-copy tensors read at disk speed.

A zero-copy load returns views of each file's map without touching a byte; the first forward
then faults the pages in one at a time, at the speed of one reading stream. `Prefetch` has
background threads populate the map by range instead: each takes the next 64 MiB of the map and
asks the kernel to fault it in (`madvise(MADV_POPULATE_READ)`, Linux 5.14 and later), several
ranges at once, so a cold file is read at the rate of several streams while the caller goes on.

On a private file map, a read fault maps the page cache's own page (nothing is copied until a
page is written), so populating costs no anonymous memory. Measured on a 2 GiB file (a shared
2-core machine): alone, four threads populate a cold map at 2.2-2.4 GB/s (one thread faulting
the pages by reading them: 0.5-0.8 GB/s), and a warm one in about 20 ms; `MADV_WILLNEED` was no
faster than reading. Through a load followed at once by one read of every byte, that did not
carry over: cold, 1.8-4.4 s with prefetch against 1.6-2.2 s without (the reader and the
populating threads compete for the same two cores and fault the same pages); warm, 0.25 s with
and without (the warm-cache cost is nothing measurable). That is why it is opt-in.

Where `MADV_POPULATE_READ` is refused (a kernel before 5.14) the threads fall back to one
`MADV_WILLNEED` over what is left (the kernel's own read-ahead). Where there is no `madvise`
(not Linux) nothing is prefetched: `start_prefetch` returns None and the load is unchanged. A
failure (a file truncated under its map: populating would fault) stops the prefetch quietly;
the page is then faulted, and fails, where the caller touches it, as without prefetch.

The threads are daemons holding a reference to the map's storage while they run; they finish
on their own once the last range is done, and the map is freed when its last holder drops it.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import sys
import threading
from collections.abc import Callable, Iterator
from typing import cast

import torch

__all__ = [
    "MADV_POPULATE_READ",
    "MADV_WILLNEED",
    "PREFETCH_THREAD_NAME",
    "RANGE_BYTES",
    "SAMPLE_BYTES",
    "Prefetch",
    "cached_samples",
    "populate",
    "prefetch_supported",
    "residency_supported",
    "start_prefetch",
]

MADV_WILLNEED = 3
MADV_POPULATE_READ = 22
# Measured: 64 MiB ranges populated faster than 16 MiB ones (fewer, longer calls).
RANGE_BYTES = 64 * 1024 * 1024
PREFETCH_THREAD_NAME = "checkpoint-prefetch"

Madvise = Callable[[int, int, int], int]


def _libc_function(name: str, argtypes: list[type]) -> Callable[..., int] | None:
    """The C library's `name` returning an int, with `argtypes`; None off Linux or without it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return cast(Callable[..., int], function)


_MADVISE: Madvise | None = _libc_function(
    "madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
)
_MINCORE = _libc_function("mincore", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p])


# One page in every MiB: a tensor's residency is judged by the samples of the MiBs its bytes
# touch, since `mincore` over every page costs about 20 ns a page (5 ms a GiB, measured here).
SAMPLE_BYTES = 1 << 20


def cached_samples(mapped: torch.Tensor) -> bytes | None:
    """For a uint8 tensor over a whole file map: one byte per `SAMPLE_BYTES` of the file, 1
    where the first page of that MiB is in the page cache now, else 0 (`mincore`, which
    touches no page). None where that cannot be told (not Linux, or `mincore` failed)."""
    if _MINCORE is None:
        return None
    base, vector = mapped.data_ptr(), (ctypes.c_ubyte * 1)()
    samples = bytearray()
    for offset in range(0, mapped.numel(), SAMPLE_BYTES):
        if _MINCORE(base + offset, 1, vector) != 0:
            return None
        samples.append(vector[0] & 1)  # the other bits are reserved
    return bytes(samples)


def residency_supported() -> bool:
    """Whether this system can tell which pages of a map are cached (`cached_samples`)."""
    return _MINCORE is not None


def prefetch_supported() -> bool:
    """Whether this system can prefetch a map at all (Linux with a `madvise`)."""
    return _MADVISE is not None


def populate(address: int, length: int) -> bool:
    """Fault in `length` bytes of a map from `address` (page-aligned down here), now, on this
    thread: `MADV_POPULATE_READ`. Whether it did (False: no `madvise`, a kernel without it, or
    a failure such as a file truncated under the map, which the reader's own checks report)."""
    if _MADVISE is None or length <= 0:
        return False
    aligned = address - address % mmap.PAGESIZE
    return _MADVISE(aligned, length + address - aligned, MADV_POPULATE_READ) == 0


class Prefetch:
    """Background threads populating `mapped` (a uint8 tensor over a whole file map).

    Attributes:
        method: "populate" while `MADV_POPULATE_READ` works, "willneed" once it fell back to
            read-ahead, "stopped" after a failure.
    """

    def __init__(self, mapped: torch.Tensor, *, workers: int, madvise: Madvise) -> None:
        self.method = "populate"
        self._base = mapped.data_ptr()
        self._size = mapped.numel()
        self._madvise = madvise
        self._ranges: Iterator[int] = iter(range(0, self._size, RANGE_BYTES))
        self._lock = threading.Lock()
        count = max(1, min(workers, -(-self._size // RANGE_BYTES)))
        self._threads = [
            threading.Thread(
                target=self._run, args=(mapped,), name=f"{PREFETCH_THREAD_NAME}-{n}", daemon=True
            )
            for n in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def _next(self) -> int | None:
        with self._lock:
            if self.method != "populate":
                return None
            return next(self._ranges, None)

    def _run(self, mapped: torch.Tensor) -> None:
        # `mapped` is held only to keep the map alive while this thread advises on it.
        while (offset := self._next()) is not None:
            length = min(RANGE_BYTES, self._size - offset)
            if self._madvise(self._base + offset, length, MADV_POPULATE_READ) == 0:
                continue
            failed = ctypes.get_errno()
            with self._lock:
                if self.method != "populate":
                    break
                self.method = "willneed" if failed == errno.EINVAL else "stopped"
            if failed == errno.EINVAL:  # no MADV_POPULATE_READ: let the kernel read ahead
                self._madvise(self._base + offset, self._size - offset, MADV_WILLNEED)
            break
        del mapped

    @property
    def done(self) -> bool:
        return not any(thread.is_alive() for thread in self._threads)

    def wait(self, timeout: float | None = None) -> bool:
        """Join the threads (for tests and measurements; a load never waits); whether done."""
        for thread in self._threads:
            thread.join(timeout)
        return self.done


def start_prefetch(mapped: torch.Tensor, *, workers: int) -> Prefetch | None:
    """Start populating `mapped` (a uint8 tensor over a whole private file map) with `workers`
    background threads, and return at once; None where this system cannot prefetch, or there
    is nothing to populate."""
    if _MADVISE is None or workers < 1 or mapped.numel() == 0:
        return None
    return Prefetch(mapped, workers=workers, madvise=_MADVISE)
