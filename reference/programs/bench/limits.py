"""The machine's read limits: the fastest ways to get a checkpoint file's bytes into fresh memory.

Each limit reads the whole DiT checkpoint file into fresh `torch.empty` memory, which the read
itself faults in, as a loader's copy path pays it:

    readinto    one `readinto` on one thread (the benchmark's original limit)
    preadv_N    N threads, each `os.preadv` of its contiguous share, `PREADV_CHUNK` bytes a call
    map_copy_N  N threads, each `copy_` of its share of a private map of the file
                (`torch.UntypedStorage.from_file(shared=False)`)

N runs from 1 to twice the CPU count (`thread_counts`).

The chunk: 8, 16, 32 and 64 MiB per `preadv` call were measured at 512 MiB (2 vCPUs, 1-4
threads, cold and warm, fresh processes); the differences were within the run-to-run noise
(cold 0.6-2.9 GiB/s on this virtual disk, warm 2.2-2.6 GiB/s on one thread), so the chunk is
16 MiB: large enough that a call's fixed cost is nothing, small enough that a thread's last call
is short.

`map_copy_N` shares torch's intra-op threads out among its N workers (at least one each), so N
workers never run N full thread pools on the same cores. Measured at 512 MiB, warm, fresh
processes: one worker ran at 2.3 GiB/s with 1 and with 2 intra-op threads while other work kept
the second core busy (4.0-4.2 GiB/s with 2 threads in a quieter minute); 2 and 4 workers of one
thread each, 1.8-2.3 GiB/s. The bound is faulting in the fresh buffer: the same copy into
already-faulted memory ran at 12-14 GiB/s.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

import torch

__all__ = [
    "PREADV_CHUNK",
    "map_copy",
    "preadv",
    "readinto",
    "shares",
    "thread_counts",
]

PREADV_CHUNK = 16 << 20


def thread_counts() -> range:
    """N for the threaded limits: 1 to twice the CPU count."""
    return range(1, 2 * (os.cpu_count() or 1) + 1)


def shares(size: int, threads: int) -> list[tuple[int, int]]:
    """At most `threads` contiguous (start, end) ranges covering `size` bytes in order, as even
    as whole bytes allow (the last one shortest); one empty range for an empty file."""
    step = max(1, -(-size // threads))
    return [(start, min(size, start + step)) for start in range(0, size, step)] or [(0, 0)]


def _writable(buffer: torch.Tensor) -> memoryview:
    return memoryview((ctypes.c_char * buffer.nbytes).from_address(buffer.data_ptr())).cast("B")


def _on_threads(threads: int, work: Callable[[tuple[int, int]], None], size: int) -> None:
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(work, shares(size, threads)))  # list(): a worker's error is raised here


def readinto(path: Path) -> torch.Tensor:
    """One `readinto` of the file into a fresh buffer."""
    size = path.stat().st_size
    buffer = torch.empty(size, dtype=torch.uint8)
    view = _writable(buffer)
    done = 0
    with path.open("rb", buffering=0) as f:
        while done < size:  # one read() returns at most about 2 GiB
            done += f.readinto(view[done:]) or 0
    return buffer


def preadv(path: Path, threads: int) -> torch.Tensor:
    """The file read into one fresh buffer by `threads` threads, each `os.preadv` of its share."""
    size = path.stat().st_size
    buffer = torch.empty(size, dtype=torch.uint8)
    view = _writable(buffer)
    fd = os.open(path, os.O_RDONLY)

    def work(share: tuple[int, int]) -> None:
        done, end = share
        while done < end:
            read = os.preadv(fd, [view[done : min(end, done + PREADV_CHUNK)]], done)
            if read == 0:
                raise RuntimeError(f"{path} ended at byte {done} of {size} while it was read")
            done += read

    try:
        _on_threads(threads, work, size)
    finally:
        os.close(fd)
    return buffer


def map_copy(path: Path, threads: int) -> torch.Tensor:
    """The file copied out of a private memory map into one fresh buffer by `threads` threads,
    torch's intra-op threads shared out among them (at least one each)."""
    size = path.stat().st_size
    storage = torch.UntypedStorage.from_file(str(path), shared=False, nbytes=size)
    mapped = torch.empty(0, dtype=torch.uint8).set_(cast(torch.UntypedStorage, storage))
    buffer = torch.empty(size, dtype=torch.uint8)

    def work(share: tuple[int, int]) -> None:
        start, end = share
        buffer[start:end].copy_(mapped[start:end])

    intra_op = torch.get_num_threads()
    torch.set_num_threads(max(1, intra_op // threads))
    try:
        _on_threads(threads, work, size)
    finally:
        torch.set_num_threads(intra_op)
    return buffer
