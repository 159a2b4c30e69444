"""How a load reads its checkpoint files: reader threads, bounds on what is in flight, prefetch.

A load that copies every tensor (the DiT copy path, `DiTOptions(adopt=False)`; VAE streaming; the
direct path, where every tensor goes to a device) can read through a bounded pool of reader
threads (`reference.read.pool.PooledReader`): tensors are read in file order by `os.preadv` into
fresh CPU buffers, several at a time, so a cold file is read at the rate of several streams instead
of one. A load that may adopt tensors (zero-copy, ZC-*) needs views of the file's map instead; there
`prefetch` populates the map in the background (`reference.read.prefetch`).

Which loads use the pool: `pool_options` is the one place that decides. Without options
(`reading=None`) only the DiT copy path onto the CPU does, with `ReadOptions()`; VAE streaming
and the direct path read from the file's map. Given options with `workers` of 1 or more put any
copying load, on any device, through the pool; `workers=0` keeps it on the map.

The rule for a default: a copying load reads through the pool by default if it is faster cold
and no slower warm. Two runs of `python -m reference bench --json ...` on 2026-12-02 (512 MiB,
medians of 5 fresh processes, a 2-vCPU machine, torch 2.13.0+cpu; docs/bench.md), pool against
map:
  * DiT copy path onto the CPU: cold 0.470 / 0.500 s and 0.450 / 0.507 s, warm 0.230 / 0.268 s
    and 0.291 / 0.296 s. Faster in both states, so the pool is its default.
  * VAE streaming onto the CPU: cold 0.457 / 0.436 s and 0.484 / 0.504 s, warm 0.257 / 0.254 s
    and 0.242 / 0.274 s. Slower in both states in the first run, so it keeps the map. Its peak
    anonymous memory is the same either way (514.6 / 514.7 MiB for a 515.4 MiB VAE): the
    pool's buffers become the slots' tensors.
  * The direct path is not measured (no CUDA device on that machine).

`map_when_cached` is False by default: the pool reads every tensor it selects with `preadv`,
cached or not. Warm, 512 MiB, fresh processes side by side, medians of 8 in three batches (same
machine and date), the DiT copy path took 0.206, 0.187 and 0.225 s so, against 0.236, 0.205 and
0.255 s copying the cached tensors from the map (`preadv` on 2 threads alone: 0.219, 0.174 and
0.205 s); cold nothing is cached, so nothing changes.

Defaults of the other fields: `workers` is twice the cores, from 2 to 8. The best cold reads of
the two runs used 3 and 4 threads on 2 cores (`preadv` on one thread 1.16 GiB/s, on three 1.61
GiB/s), and 6 or 8 workers read a cold 512 MiB file no faster than 4 (0.33-0.34 s against
0.27 s, side by side, same machine and date). The window only has to keep every worker busy
where the pool stages buffers for a device: `max_tensors` 16 and `max_bytes` 256 MiB.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch

from reference.errors import ArgumentError
from reference.read.checkpoint import TensorReader

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_TENSORS",
    "InOrder",
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
            contiguous shares (`reference.read.pool`).
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


class InOrder:
    """Each tensor `reader` holds, in the reader's order, read onto `device`; while one is in
    hand `current` names it (None before the first and after the last), so a failure downstream
    can name the tensor's file. `waited` is the seconds spent in the reader (the load's read
    step), apart from what the caller does with each tensor."""

    def __init__(self, reader: TensorReader, *, device: torch.device) -> None:
        self.reader = reader
        self.device = device
        self.current: str | None = None
        self.waited = 0.0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        clock = time.perf_counter
        began = clock()
        for name in self.reader:
            self.current = name
            tensor = self.reader.read(name, device=self.device)
            self.waited += clock() - began
            yield name, tensor
            del tensor
            began = clock()
        self.waited += clock() - began
        self.current = None
