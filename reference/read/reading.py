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

`map_when_cached` is True by default: a tensor already in the page cache when the reader is made
is copied out of the file's map (torch's `copy_`, on the intra-op threads) instead of read with
`preadv`. Warm, 512 MiB, fresh processes side by side, each warmed by a small load first (as the
bench's runs are), medians of 10 (2026-12-07, load average 1.1-1.5), the DiT copy path took
0.163 s so against 0.172 s through the pool's `preadv` shares; the machine's best warm read,
one `copy_` of the file's private map, 0.152 s, and `preadv` on 2 threads 0.160 s. Cold nothing
is cached, so nothing changes. (On 2026-12-02, before the copy path's placement got lighter, it
measured the other way: 0.236 s from the map against 0.206 s through the pool.)

Defaults of the other fields: `workers` is twice the cores, from 2 to 8. The best cold reads of
the two runs used 3 and 4 threads on 2 cores (`preadv` on one thread 1.16 GiB/s, on three 1.61
GiB/s), and 6 or 8 workers read a cold 512 MiB file no faster than 4 (0.33-0.34 s against
0.27 s, side by side, same machine and date). The window only has to keep every worker busy
where the pool stages buffers for a device: `max_tensors` 16 and `max_bytes` 256 MiB.

Staging (`reference.read.staging`: direct DiT loads, VAE streams onto a device): `staging_bytes`
4 MiB and `staging_buffers` 8, a 32 MiB ring. Measured on 2026-12-03 on this 2-vCPU machine
(torch 2.13.0+cpu, no CUDA device), a 256 MiB bench DiT checkpoint read through the ring into
fresh CPU tensors by the synchronous engine (`CpuEngine(in_place=False)`), default workers,
medians of 5, under a load average of 4.3 to 5.9 from other work (noisy): two passes gave, warm
and cold, 4 MiB x 4 0.083 / 0.225 s and 0.124 / 0.269 s; 4 MiB x 8 0.103 / 0.209 s; 2 MiB x 4
0.137 / 0.217 s; 8 MiB x 4 0.157 / 0.244 s; 16 MiB x 2, x 4, x 8 0.180 / 0.282, 0.175-0.193 /
0.270-0.404 and 0.191 / 0.494 s; 64 MiB x 2 and x 4 0.290 / 0.609 and 0.423 / 0.581 s; reading
in place (no ring) 0.066-0.122 / 0.195-0.215 s. More, smaller buffers keep every reader thread
busy; 4 MiB x 8 was the best cold and near the best warm. The copy into device memory (a DMA
on CUDA) is not measured here. (Command: a script timing `StagingReader` over the bench
checkpoint; `uptime` before and after.)
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
    "DEFAULT_STAGING_BUFFERS",
    "DEFAULT_STAGING_BYTES",
    "DIRECT_IO_ALIGNMENT",
    "InOrder",
    "ReadOptions",
    "default_workers",
    "pool_options",
    "prefetch_workers",
]

MIB = 1024 * 1024
DEFAULT_MAX_TENSORS = 16
DEFAULT_MAX_BYTES = 256 * MIB
DEFAULT_STAGING_BYTES = 4 * MIB
DEFAULT_STAGING_BUFFERS = 8
# O_DIRECT reads need the buffer's address, the file offset and the length aligned to this.
DIRECT_IO_ALIGNMENT = 4096


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
            the tensor's bytes touch; never where that cannot be told). True (the default):
            measured faster warm for the copy path (see the module's docstring); False reads
            every tensor the load selects through the pool, warm or cold.
        staging_bytes: the size of each staging buffer of a staging read (direct DiT loads, VAE
            streams onto a device: `reference.read.staging`); a tensor larger than a buffer is
            split across buffers, small ones are packed into one. Onto the CPU the tensors are
            their own buffers, no ring is allocated, and a read of every tensor kept reads the
            files in larger ranges (a whole tensor from the map, or one share per thread).
        staging_buffers: how many staging buffers the ring holds: with `staging_bytes`, the
            bound on the host memory a staging read holds beside its tensors (DG-8). Its
            `workers` reader threads fill them (at least one thread where `workers` is 0).
        o_direct: staging reads open the files with `O_DIRECT` (no page cache), reading
            aligned ranges into aligned buffers; `staging_bytes` must then be a multiple of
            `DIRECT_IO_ALIGNMENT`. A file system that refuses `O_DIRECT` fails the load naming
            the file. Reads straight into host destinations (onto the CPU) stay buffered.

    Raises:
        ArgumentError: naming the field: a count that is not an int (bools refused), `workers`
            below 0, `max_tensors`, `max_bytes`, `staging_bytes` or `staging_buffers` below 1,
            `prefetch`, `map_when_cached` or `o_direct` not a bool, `prefetch` with
            `workers=0`, or `o_direct` with an unaligned `staging_bytes`.
    """

    workers: int = field(default_factory=default_workers)
    max_tensors: int = DEFAULT_MAX_TENSORS
    max_bytes: int = DEFAULT_MAX_BYTES
    prefetch: bool = False
    map_when_cached: bool = True
    staging_bytes: int = DEFAULT_STAGING_BYTES
    staging_buffers: int = DEFAULT_STAGING_BUFFERS
    o_direct: bool = False

    def __post_init__(self) -> None:
        counts = (
            ("workers", 0),
            ("max_tensors", 1),
            ("max_bytes", 1),
            ("staging_bytes", 1),
            ("staging_buffers", 1),
        )
        for name, least in counts:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ArgumentError(f"ReadOptions.{name} must be an int, not {value!r}")
            if value < least:
                raise ArgumentError(f"ReadOptions.{name} must be at least {least}, not {value}")
        for flag in ("prefetch", "map_when_cached", "o_direct"):
            value = getattr(self, flag)
            if not isinstance(value, bool):
                raise ArgumentError(f"ReadOptions.{flag} must be a bool, not {value!r}")
        if self.prefetch and self.workers == 0:
            raise ArgumentError(
                "ReadOptions.prefetch needs threads to populate the map in the background;"
                " give workers of at least 1"
            )
        if self.o_direct and self.staging_bytes % DIRECT_IO_ALIGNMENT:
            raise ArgumentError(
                f"ReadOptions.staging_bytes must be a multiple of {DIRECT_IO_ALIGNMENT} with"
                f" o_direct, not {self.staging_bytes}"
            )

    @property
    def staging_bound(self) -> int:
        """The host bytes a staging read's buffers take at most (DG-8); with `o_direct` each
        buffer holds `DIRECT_IO_ALIGNMENT` more, to align its start."""
        slack = DIRECT_IO_ALIGNMENT if self.o_direct else 0
        return (self.staging_bytes + slack) * self.staging_buffers


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
    `max_bytes`, or one larger tensor) beside the tensor being copied. (Direct DiT loads and
    VAE streams onto a device do not ask: they read through the staging reader,
    `reference.read.staging`, unless `workers` is 0.)
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
