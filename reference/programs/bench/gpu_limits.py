"""The machine's file-to-device limits: the fastest plain way to get checkpoint files onto a device.

    staged      files -> pinned staging -> device: N reader threads, each `os.preadv` of its
                share of every file, `CHUNK` bytes a call, into one of its `STAGES` pinned host
                buffers, each buffer copied to the device on the thread's own stream while the
                thread reads into the other
    staged, direct_io
                the same from files opened with O_DIRECT (no page cache: what the disk gives)
    host_to_device
                the bytes already in one pinned host buffer, one copy to the device: the
                copy engine alone

N runs over `thread_ladder()`: 1, 2, 4, ... up to twice the cores. The staging buffers are
made before the clock starts (`Stages`), as a loader's standing staging area would be; the
device buffer is allocated inside it, as a loader allocates its parameters.

On the CPU (the tests) the same code runs with pageable buffers and synchronous copies: pinned
memory and streams need CUDA.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "ALIGN",
    "CHUNK",
    "STAGES",
    "Piece",
    "Stages",
    "direct_io_refused",
    "host_to_device",
    "pieces",
    "read_pinned",
    "staged",
    "thread_ladder",
]

CHUNK = 16 << 20
"""Bytes per read call and per staging buffer (16 MiB: see `reference.programs.bench.limits`)."""
STAGES = 2
"""Staging buffers per reader thread: one is read into while the other is copied out."""
ALIGN = 4096
"""O_DIRECT wants buffer addresses, file offsets and lengths in multiples of the block size;
4096 covers the block sizes of common disks."""


def thread_ladder(cores: int | None = None) -> tuple[int, ...]:
    """Reader thread counts: the powers of two below twice the cores, and twice the cores."""
    top = 2 * (cores or os.cpu_count() or 1)
    return tuple(sorted({1 << i for i in range(top.bit_length()) if 1 << i < top} | {top}))


@dataclass(frozen=True)
class Piece:
    """A contiguous range of one file and where it lands in the device buffer."""

    file: int  # index into the files
    start: int
    end: int
    dest: int  # offset in the device buffer


def pieces(sizes: Sequence[int], threads: int) -> list[list[Piece]]:
    """Each thread's pieces: every file cut into `threads` contiguous shares whose starts are
    multiples of `ALIGN`, share i of every file going to thread i. The device buffer holds the
    files back to back."""
    out: list[list[Piece]] = [[] for _ in range(threads)]
    base = 0
    for index, size in enumerate(sizes):
        step = -(-max(1, -(-size // threads)) // ALIGN) * ALIGN
        for share, start in enumerate(range(0, size, step)):
            out[share].append(Piece(index, start, min(size, start + step), base + start))
        base += size
    return out


def _aligned(nbytes: int, *, pin: bool) -> torch.Tensor:
    """A host buffer of `nbytes` whose address is a multiple of `ALIGN`."""
    raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8, pin_memory=pin)
    skip = -raw.data_ptr() % ALIGN
    return raw[skip : skip + nbytes]


def _writable(buffer: torch.Tensor) -> memoryview:
    return memoryview((ctypes.c_char * buffer.nbytes).from_address(buffer.data_ptr())).cast("B")


@dataclass(frozen=True)
class Stages:
    """The staging area of `threads` reader threads: `STAGES` aligned buffers of `CHUNK` bytes
    each, pinned where the device is CUDA."""

    buffers: tuple[tuple[torch.Tensor, ...], ...]

    @classmethod
    def make(cls, threads: int, device: torch.device) -> Stages:
        pin = device.type == "cuda"
        return cls(
            tuple(tuple(_aligned(CHUNK, pin=pin) for _ in range(STAGES)) for _ in range(threads))
        )


def direct_io_refused(path: Path) -> str | None:
    """Why `path` cannot be read with O_DIRECT here (no flag, or a file system that refuses
    it, such as tmpfs), or None."""
    flag = getattr(os, "O_DIRECT", None)
    if flag is None:
        return "O_DIRECT is not available on this platform"
    try:
        fd = os.open(path, os.O_RDONLY | flag)
    except OSError as exc:
        return f"the file system refuses O_DIRECT on {path.parent} ({exc.strerror})"
    os.close(fd)
    return None


def _read_share(
    fds: Sequence[int],
    sizes: Sequence[int],
    share: Sequence[Piece],
    stages: Sequence[torch.Tensor],
    dest: torch.Tensor,
    *,
    direct_io: bool,
) -> None:
    cuda = dest.device.type == "cuda"
    stream = torch.cuda.Stream(dest.device) if cuda else None  # type: ignore[no-untyped-call]
    events: list[torch.cuda.Event | None] = [None] * len(stages)
    turn = 0
    for piece in share:
        at = piece.start
        while at < piece.end:
            slot = turn % len(stages)
            turn += 1
            event = events[slot]
            if event is not None:
                event.synchronize()  # the copy out of this buffer is done: it may be refilled
            want = min(CHUNK, piece.end - at)
            # O_DIRECT reads whole blocks: the last one of a file runs past its end (a short read)
            asked = -(-want // ALIGN) * ALIGN if direct_io else want
            view = _writable(stages[slot])[:asked]
            got = os.preadv(fds[piece.file], [view], at)
            if got < want:
                raise RuntimeError(
                    f"file {piece.file} ended at byte {at + got} of {sizes[piece.file]}"
                )
            target = dest[piece.dest + at - piece.start :][:want]
            if stream is None:
                target.copy_(stages[slot][:want])
            else:
                with torch.cuda.stream(stream):
                    target.copy_(stages[slot][:want], non_blocking=True)
                    copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
                    copied.record(stream)
                events[slot] = copied
            at += want
    if stream is not None:
        stream.synchronize()


def staged(
    files: Sequence[Path],
    stages: Stages,
    device: torch.device,
    *,
    direct_io: bool = False,
) -> torch.Tensor:
    """Every byte of `files`, back to back, in one fresh uint8 buffer on `device`, read by as
    many threads as `stages` has (see the module's docstring); returns when the last copy is
    done."""
    sizes = [path.stat().st_size for path in files]
    dest = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
    flags = os.O_RDONLY | (getattr(os, "O_DIRECT", 0) if direct_io else 0)
    fds = [os.open(path, flags) for path in files]
    try:
        shares = pieces(sizes, len(stages.buffers))
        with ThreadPoolExecutor(max_workers=len(shares)) as pool:
            done = [
                pool.submit(_read_share, fds, sizes, share, buffers, dest, direct_io=direct_io)
                for share, buffers in zip(shares, stages.buffers, strict=True)
            ]
            for future in done:
                future.result()  # a reader's error is raised here
    finally:
        for fd in fds:
            os.close(fd)
    return dest


def read_pinned(files: Sequence[Path], device: torch.device) -> torch.Tensor:
    """Every byte of `files`, back to back, in one host buffer, pinned where `device` is CUDA
    (the untimed setup of `host_to_device`)."""
    sizes = [path.stat().st_size for path in files]
    host = torch.empty(sum(sizes), dtype=torch.uint8, pin_memory=device.type == "cuda")
    view = _writable(host)
    at = 0
    for path in files:
        with path.open("rb", buffering=0) as f:
            end = at + path.stat().st_size
            while at < end:
                at += f.readinto(view[at:end]) or 0
    return host


def host_to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """One copy of `host` into a fresh buffer on `device`; returns when it is done."""
    dest = torch.empty(host.nbytes, dtype=torch.uint8, device=device)
    dest.copy_(host, non_blocking=device.type == "cuda")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return dest
