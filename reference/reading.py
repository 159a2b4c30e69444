"""How a load reads its checkpoint files: reader threads, bounds on what is in flight, prefetch.

A load that copies every tensor (the DiT copy path, `load_dit(adopt=False)`; VAE streaming; the
direct path, where every tensor goes to a device) can read through a bounded pool of reader
threads (`reference.pool.PooledReader`): tensors are read in file order by `os.preadv` into fresh
CPU buffers, several at a time, so a cold file is read at the rate of several streams instead of
one. A load that may adopt tensors (zero-copy, ZC-*) needs views of the file's map instead; there
`prefetch` populates the map in the background (`reference.prefetch`).

Which loads use the pool by default: the DiT copy path onto the CPU (`load_dit(adopt=False)`),
and no other. `ReadOptions` with `workers` of 1 or more opts any copying load into the pool,
`workers=0` keeps it on the map readers. The rule: a copying load uses the pool by default if it
is faster cold and no slower warm. On the 2-core machine this was measured on (shared, so
run-to-run spread was 2-4x), it did not hold at first: for a 2 GiB bf16 checkpoint, medians of
three fresh processes, load plus one read of every byte, pages dropped with
`posix_fadvise(DONTNEED)` for cold:
  * DiT copy path: pool 4.0 s cold, 1.35 s warm; map 2.9 s cold, 2.5 s warm;
  * VAE streaming to CPU: pool 4.1 s cold, 3.7 s warm; map 2.6 s cold, 2.1 s warm;
  * peak anonymous memory of VAE streaming: 2111 MiB with the pool, 2110 MiB without (the
    module is 2044 MiB: the pool's buffers become the slots' tensors).
With the pool copying the tensors already cached from the map instead (`map_when_cached`,
then its default), the benchmark (`python -m reference bench`, 512 MiB, medians of 5, seven
runs) found the rule holding for the DiT copy path onto the CPU: cold 0.32-0.43 s through the
pool against 0.36-0.59 s through the map, warm 0.146-0.165 s against 0.154-0.174 s (one run a
tie); so it is the default there (three runs since, with the pool reading kept buffers as
contiguous shares, `reference.pool`: faster cold in all three, warm faster, a tie and 2%
slower). Not for VAE streaming: slower through the pool warm in every one of the seven runs
(0.148-0.170 s against 0.141-0.160 s) and in two of the three since; cold faster in one of
those three, slower in two. The direct path was never measured (no CUDA here).
`pool_options` is the one place that decides.

Cached tensors too go through `preadv` by default (`map_when_cached` False) since contiguous
shares: warm, 512 MiB, fresh processes side by side, medians of 8 in three batches, the DiT
copy path took 0.206, 0.187 and 0.225 s reading every tensor in shares, against 0.236, 0.205
and 0.255 s copying the cached ones from the map (`preadv` on 2 threads: 0.219, 0.174, 0.205 s);
cold, nothing is cached, so nothing changes.

Defaults of the fields: raw `preadv` of the whole cold file read 0.55-0.7 GB/s on one thread,
1.2-1.4 GB/s on two, 1.3-1.6 GB/s on four (8 MiB chunks; eight threads no faster, 2 MiB chunks
slower), so `workers` is twice the cores, from 2 to 8. The window only has to keep every worker
busy: `max_tensors` 16 and `max_bytes` 256 MiB.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

import torch

from reference.errors import ArgumentError

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_TENSORS",
    "ReadOptions",
    "default_workers",
    "pool_options",
    "prefetch_workers",
]

MIB = 1024 * 1024
DEFAULT_MAX_TENSORS = 16
DEFAULT_MAX_BYTES = 256 * MIB


def default_workers() -> int:
    """Reader threads by default: twice the cores this process may run on, from 2 to 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    return max(2, min(8, 2 * cores))


@dataclass(frozen=True, kw_only=True)
class ReadOptions:
    """How a load reads its files; every field is checked at construction.

    Attributes:
        workers: reader threads. 0 reads on the caller's thread from the file's map (no pool,
            no prefetch): the reader the loads used before the pool existed.
        max_tensors: K, tensors in flight at most (read or being read, not yet handed out).
        max_bytes: B, bytes in flight at most; a single tensor larger than B is read alone.
            K and B bound the pool's buffers where they are staging (a load onto a device);
            where every buffer becomes a loaded tensor (the copy path and VAE streaming onto
            the CPU) the buffers are the model itself, and all are read at once, in
            contiguous shares (`reference.pool`).
        prefetch: for loads that read from the file's map (zero-copy), populate each file's
            map in the background as soon as it is mapped, with `workers` threads; the load
            returns without waiting. No effect on loads that read through the pool.
        map_when_cached: for loads through the pool, copy a tensor whose pages are already in
            the page cache from the file's map instead of reading it with `preadv` (judged when
            the reader is made, with `mincore`, by the first page of every MiB of the file that
            the tensor's bytes touch; never where that cannot be told). False (the default)
            reads every tensor the load selects through the pool, warm or cold: measured
            faster warm where the buffers are kept (see the module's docstring); True may
            spare a staging copy where the pool stages for a device (unmeasured).

    Raises:
        ArgumentError: naming the field: a count that is not an int (bools refused), `workers`
            below 0, `max_tensors` or `max_bytes` below 1, `prefetch` or `map_when_cached` not a
            bool, or `prefetch` with `workers=0`.
    """

    workers: int = field(default_factory=default_workers)
    max_tensors: int = DEFAULT_MAX_TENSORS
    max_bytes: int = DEFAULT_MAX_BYTES
    prefetch: bool = False
    map_when_cached: bool = False

    def __post_init__(self) -> None:
        for name, least in (("workers", 0), ("max_tensors", 1), ("max_bytes", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ArgumentError(f"ReadOptions.{name} must be an int, not {value!r}")
            if value < least:
                raise ArgumentError(f"ReadOptions.{name} must be at least {least}, not {value}")
        for flag in ("prefetch", "map_when_cached"):
            value = getattr(self, flag)
            if not isinstance(value, bool):
                raise ArgumentError(f"ReadOptions.{flag} must be a bool, not {value!r}")
        if self.prefetch and self.workers == 0:
            raise ArgumentError(
                "ReadOptions.prefetch needs threads to populate the map in the background;"
                " give workers of at least 1"
            )


def pool_options(
    reading: ReadOptions | None, *, device: torch.device, load: Literal["dit", "vae"]
) -> ReadOptions | None:
    """The options of the reader pool for a load that copies every tensor onto `device`, or
    None where it reads from the file's map instead; `load` is the DiT's (its copy path, or
    direct mode) or the VAE's (streaming).

    By default (`reading` None) only the DiT copy path onto the CPU uses the pool, with
    `ReadOptions()`: the one load measured faster cold and no slower warm through it (see the
    module's docstring). Given options use the pool for every load that copies every tensor,
    on any device, unless `workers` is 0. Onto a device other than the CPU the pool's host
    buffers are copied to the device: host memory then holds the in-flight window (at most
    `max_bytes`, or one larger tensor) beside the tensor being copied.
    """
    if reading is None:
        return ReadOptions() if load == "dit" and device.type == "cpu" else None
    return reading if reading.workers else None


def prefetch_workers(reading: ReadOptions | None) -> int:
    """Background threads that populate a load's file maps (0: no prefetch)."""
    return reading.workers if reading is not None and reading.prefetch else 0
