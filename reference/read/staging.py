"""The staging reader: files -> a bounded ring of host buffers -> a copy engine -> the device.

For the loads that put every tensor on a device (a direct DiT load, a VAE streamed onto a
device), `StagingReader` reads the files with `os.preadv` on `workers` threads into a ring of
`staging_buffers` host buffers of `staging_bytes` each (`ReadOptions`), and hands each filled
buffer to a copy engine (`reference.read.engine`), which copies it into the tensors' device
memory asynchronously. Each tensor is allocated once on the device, in its file's dtype, as one
fresh tensor the caller may keep as the slot's own (DG-5); a tensor larger than a buffer is split
across buffers, consecutive small ones are packed into one. A buffer is filled again only after
every copy out of it completed (`_drain`): refilling it sooner would let a late copy read the
next bytes. So host memory holds the ring beside the tensors, never the state dict (DG-8).

Where the engine stages in place (`CpuEngine` onto the CPU), the destination is host memory and
its own staging buffer: the threads read straight into it and no ring is allocated; from the
disk, where every tensor is kept, each thread reads one contiguous share of the bytes (several
sequential streams, as the copy path's pool reads). There, with
`ReadOptions.map_when_cached` (the default), a fill whose bytes are all in the page cache when
the reader is made is copied into its tensors out of the file's map (torch's `copy_`) instead of
read with `preadv`: warm, the faster of the two, as for the copy path (`reference.read.reading`).

Device memory: tensors the caller keeps as they are (`kept`: adopted, or kept as the slot's
tensor) are the model's own bytes and are read ahead freely; any other tensor is transient (the
caller converts or copies it), so the reader allocates the next transient only once the caller
has moved past the previous one, and never packs two transients into one buffer: the device
then holds the model plus one transient tensor in its file dtype at most (DG-5, PREC-5).

Errors never stay on a thread: the first read error (naming the file and tensor) or copy error
(`ComponentLoadError` naming the component and tensor), and a `KeyboardInterrupt` met on a
thread, stop the reader; the caller's next `read` closes it (threads joined, pending copies
waited for, every staging buffer released, descriptors closed) and raises that error.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import threading
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from reference.errors import ArgumentError, ComponentLoadError
from reference.files import checkpoint_error
from reference.read.checkpoint import Checkpoint, TensorReader, truncation
from reference.read.engine import CopyEngine, CopyEvent
from reference.read.header import TensorInfo
from reference.read.pool import read_range
from reference.read.prefetch import SAMPLE_BYTES, cached_samples
from reference.read.reading import DIRECT_IO_ALIGNMENT, ReadOptions

__all__ = ["STAGING_THREAD_NAME", "Fill", "Segment", "StagingReader", "plan_fills"]

STAGING_THREAD_NAME = "checkpoint-stager"


@dataclass(frozen=True)
class Segment:
    """`length` bytes of tensor `name` from its byte `at`, at byte `offset` of a fill."""

    name: str
    at: int
    length: int
    offset: int


@dataclass(frozen=True)
class Fill:
    """One buffer's worth: the file range from `start` that `segments` need (`length` bytes),
    read from the file of `info` (the range's first tensor, named by a read error)."""

    info: TensorInfo
    start: int
    length: int
    segments: tuple[Segment, ...]


@dataclass
class _Open:
    info: TensorInfo
    start: int
    end: int
    transient: str | None
    segments: list[Segment] = field(default_factory=list)


def plan_fills(
    tensors: list[TensorInfo],
    *,
    buffer_bytes: int,
    transient: Collection[str] = frozenset(),
    align: int = 1,
) -> tuple[Fill, ...]:
    """The fills that read `tensors` (in this order) through buffers of `buffer_bytes`: each a
    contiguous range of one file, at most `buffer_bytes` long, starting at a multiple of
    `align`. A fill never holds segments of two `transient` tensors."""
    fills: list[Fill] = []
    current: _Open | None = None
    for info in tensors:
        position = info.start
        while position < info.end:
            own = info.name if info.name in transient else None
            if current is not None and (
                current.info.file != info.file
                or position != current.end
                or current.end - current.start >= buffer_bytes
                or (own is not None and current.transient not in (None, own))
            ):
                fills.append(_closed(current))
                current = None
            if current is None:
                start = position - position % align
                current = _Open(info, start, position, own)
            current.transient = current.transient or own
            take = min(info.end - position, current.start + buffer_bytes - current.end)
            current.segments.append(
                Segment(info.name, position - info.start, take, position - current.start)
            )
            current.end = position + take
            position += take
    if current is not None:
        fills.append(_closed(current))
    return tuple(fills)


def _closed(current: _Open) -> Fill:
    return Fill(current.info, current.start, current.end - current.start, tuple(current.segments))


class _Stopped(Exception):
    """The reader stopped (closed, or failed elsewhere) while a thread waited (never leaves)."""


@dataclass
class _Tensor:
    """One tensor's progress: its destination bytes, segments not yet handed to the engine
    (or read in place), and the copies to wait for."""

    info: TensorInfo
    index: int
    kept: bool
    left: int = 0
    data: torch.Tensor | None = None
    events: list[CopyEvent] = field(default_factory=list)


@dataclass
class _Buffer:
    """A staging buffer of the ring, with the copies out of it not yet waited for."""

    index: int
    memory: torch.Tensor  # what the engine gave (released as is)
    area: torch.Tensor  # its aligned part, filled from the files
    events: list[tuple[str, CopyEvent]] = field(default_factory=list)


class StagingReader(TensorReader):
    """A `TensorReader` for loads that put every tensor on `device` through `engine`.

    Tensors are read in the reader's order (`iter(reader)`, each file front to back); `read`
    hands each out as a fresh tensor on `device` with the dtype and shape of its header (all
    names are in `fresh_names`), once all its copies completed. Names are read in that order:
    a read moves past every earlier name.

    Args:
        checkpoint: the validated checkpoint; each file is checked before its first byte is
            read, as `TensorReader` checks it, and read through that descriptor.
        engine: the copy engine (`reference.read.engine`).
        device: where the tensors go.
        options: `staging_bytes`, `staging_buffers`, `workers` (at least one thread),
            `o_direct` (`ReadOptions`).
        kept: the names the caller keeps as they are read; every other tensor is transient
            (see the module's docstring). None: all of them.
        component: named by a copy's error.
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        *,
        engine: CopyEngine,
        device: torch.device,
        options: ReadOptions,
        kept: Collection[str] | None = None,
        component: str = "the component",
    ) -> None:
        super().__init__(checkpoint)
        self.engine = engine
        self.device = device
        self.options = options
        self.component = component
        self.in_place = engine.stages_in_place(device)
        self.direct_io = options.o_direct and not self.in_place
        order = list(super().__iter__())
        # Each file's page-cache samples, taken once, where fills may be copied from the map.
        self._samples: dict[Path, bytes | None] = {}
        if self.in_place and options.map_when_cached:
            firsts = {checkpoint.tensors[name].file: checkpoint.tensors[name] for name in order}
            try:
                for file, info in firsts.items():
                    self._samples[file] = cached_samples(self._map(info))  # identity checked
            except BaseException:
                TensorReader.close(self)  # the maps made so far (a file that changed raises)
                raise
        self.fresh_names = frozenset(order)
        keep = set(order) if kept is None else set(kept)
        self._tensors = {
            name: _Tensor(checkpoint.tensors[name], n, name in keep) for n, name in enumerate(order)
        }
        # In place there is no ring to bound: where every file is cached, a fill is a whole
        # tensor (or several small ones), so each `copy_` is as large as the tensors allow.
        cached = bool(self._samples) and all(
            samples and 0 not in samples for samples in self._samples.values()
        )
        fill_bytes = max(options.staging_bytes, checkpoint.largest_tensor_bytes if cached else 0)
        kept_all = all(state.kept for state in self._tensors.values())
        if self.in_place and kept_all and not cached:
            # Read from the disk with no ring to bound and no transient to wait for: one
            # contiguous share of the bytes per thread, as the pool reads the copy path's
            # (several sequential streams; measured at 512 MiB on 2 cores, cold, 8 fresh
            # processes each: 0.223 s against 0.264 s in 4 MiB fills taken in turn, and
            # 0.225 s for `preadv` on 4 threads).
            total = sum(checkpoint.tensors[name].nbytes for name in order)
            fill_bytes = max(fill_bytes, -(-total // max(1, options.workers)))
        self.fills = plan_fills(
            [checkpoint.tensors[name] for name in order],
            buffer_bytes=fill_bytes,
            transient={name for name in order if name not in keep},
            align=DIRECT_IO_ALIGNMENT if self.direct_io else 1,
        )
        for fill in self.fills:
            for segment in fill.segments:
                self._tensors[segment.name].left += 1
        # Every file cached, every tensor kept: the caller's thread copies each tensor out of
        # the map as it asks for it, as the copy path does (torch's `copy_` takes the intra-op
        # threads itself; reader threads beside it would only oversubscribe the cores).
        self._on_caller = cached and kept_all
        self._cond = threading.Condition()
        self._next = 0  # the first fill no thread took yet
        self._position = -1  # the index of the name the caller read last
        self._live: int | None = None  # the index of the last transient allocated
        self._error: BaseException | None = None
        self._stopped = False
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._buffers: list[_Buffer] = []
        self._free: deque[_Buffer] = deque()
        self._busy: deque[_Buffer] = deque()  # in the order their copies were started
        self._fds: dict[Path, int] = {}

    # --- the caller's side ----------------------------------------------------------------------
    def read(self, name: str, *, device: torch.device) -> torch.Tensor:
        """One tensor on the reader's device, once every copy into it completed.

        Raises:
            KeyError: for a name the checkpoint does not hold.
            ArgumentError: `device` is not the reader's, or the reader was closed.
            CheckpointError: a file changed, was truncated or cannot be read (file, tensor).
            ComponentLoadError: a copy failed (component, tensor, file, device).
        """
        state = self._tensors[name]
        if device.type != self.device.type:
            raise ArgumentError(
                f"{self.component}: the staging reader reads onto {self.device}, not {device}"
            )
        try:
            self._start()
            with self._cond:
                self._position = state.index
                self._cond.notify_all()
            while state.left and self._on_caller:
                fill = self._take()  # never waits: no tensor is transient
                if fill is None:
                    break
                self._read_in_place(fill)
            with self._cond:
                while state.left and self._error is None:
                    self._cond.wait()
                error = self._error
            if error is not None:
                raise error
            for event in state.events:
                self._wait(state.info, event)
            data = state.data
            if data is None and state.info.nbytes:
                raise ArgumentError(
                    f"{self.component}: tensor {name!r} was read already; the staging reader"
                    " hands each tensor out once"
                )
            if data is None:
                data = torch.empty(0, dtype=torch.uint8, device=self.device)
            state.data, state.events = None, []
        except BaseException:
            self.close()
            raise
        self._progress(state.info.nbytes)
        return data.view(state.info.dtype).view(state.info.shape)

    def _start(self) -> None:
        if self._closed:
            if self._error is not None:
                raise self._error
            raise ArgumentError(f"{self.component}: the staging reader was closed")
        if self._threads or not self.fills or self._on_caller:
            return
        count = max(1, min(self.options.workers, len(self.fills)))
        for n in range(count):
            thread = threading.Thread(
                target=self._work, name=f"{STAGING_THREAD_NAME}-{n}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _wait(self, info: TensorInfo, event: CopyEvent) -> None:
        """Wait for one copy into `info`'s tensor; a failed copy becomes the component's error."""
        try:
            event.wait()
        except Exception as exc:
            raise self._copy_error(info, exc) from exc

    def _copy_error(self, info: TensorInfo, exc: BaseException) -> ComponentLoadError:
        cause = RuntimeError(
            f"copying tensor {info.name!r} of {info.file.name} onto {self.device} failed ({exc})"
        )
        return ComponentLoadError(self.component, cause)

    def close(self) -> None:
        """Stop the threads and join them, wait for every copy started, release every staging
        buffer and close the descriptors; tensors already handed out are the caller's."""
        with self._cond:
            self._stopped = True
            self._closed = True
            self._cond.notify_all()
        threads, self._threads = self._threads, []
        for thread in threads:
            thread.join()
        buffers, self._buffers = self._buffers, []
        self._free.clear()
        self._busy.clear()
        for buffer in buffers:
            for _, event in buffer.events:
                # Its error was reported already, or the load failed before it.
                with contextlib.suppress(Exception):
                    event.wait()
            buffer.events.clear()
            self.engine.release(buffer.memory)
        for state in self._tensors.values():
            state.data, state.events = None, []
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)
        super().close()

    def __del__(self) -> None:
        held = ("_threads", "_buffers", "_maps")  # maps: made when the reader is (map_when_cached)
        if any(getattr(self, name, None) for name in held):
            self.close()

    # --- the threads' side ----------------------------------------------------------------------
    def _work(self) -> None:
        try:
            while True:
                fill = self._take()
                if fill is None:
                    return
                if self.in_place:
                    self._read_in_place(fill)
                else:
                    self._stage(fill)
        except _Stopped:
            return
        except BaseException as exc:
            with self._cond:
                if self._error is None:
                    self._error = exc
                self._stopped = True
                self._cond.notify_all()

    def _take(self) -> Fill | None:
        """The next fill, its tensors' destinations allocated; None once all are taken or the
        reader stopped. Waits while it would allocate a transient before the caller moved past
        the previous one."""
        with self._cond:
            while True:
                if self._stopped or self._next >= len(self.fills):
                    return None
                fill = self.fills[self._next]
                new = [self._tensors[s.name] for s in fill.segments if s.at == 0 and s.length]
                transient = any(not state.kept for state in new)
                if not transient or self._live is None or self._live < self._position:
                    break
                self._cond.wait()
            self._next += 1
            for state in new:
                state.data = self._destination(state)
                if not state.kept:
                    self._live = state.index
            return fill

    def _destination(self, state: _Tensor) -> torch.Tensor:
        """The tensor's bytes on the device. A transient one in host memory is an anonymous
        map of its own: dropped, it goes back to the system at once, where a heap block would
        stay behind as a hole the next transient may not fit (measured: up to one more tensor
        of host memory on a direct load onto the CPU)."""
        nbytes = state.info.nbytes
        if state.kept or self.device.type != "cpu":
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        # Private: a shared anonymous map is shared memory (/dev/zero), not the process's own.
        area = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        return torch.frombuffer(area, dtype=torch.uint8)

    def _descriptor(self, info: TensorInfo) -> int:
        with self._cond:
            fd = self._fds.get(info.file)
            if fd is None:
                fd = self._open(info)  # identity and size checked
                self._fds[info.file] = fd
                if self.direct_io:
                    self._set_direct(fd, info)
                return fd
        problem = truncation(info, os.fstat(fd).st_size)
        if problem is not None:
            raise checkpoint_error(info.file, info.name, problem)
        return fd

    @staticmethod
    def _set_direct(fd: int, info: TensorInfo) -> None:
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
        except OSError as exc:
            raise checkpoint_error(
                info.file,
                info.name,
                f"file cannot be read with O_DIRECT ({exc.strerror or exc}); give ReadOptions"
                " o_direct=False for this file system",
            ) from None

    def _read_in_place(self, fill: Fill) -> None:
        mapped = self._mapped_if_cached(fill)
        fd = None if mapped is not None else self._descriptor(fill.info)
        for segment in fill.segments:
            state = self._tensors[segment.name]
            assert state.data is not None
            if mapped is not None:
                start = state.info.start + segment.at
                target = state.data[segment.at : segment.at + segment.length]
                target.copy_(mapped[start : start + segment.length])
            else:
                assert fd is not None
                read_range(fd, state.data, segment.at, segment.length, state.info)
            with self._cond:
                state.left -= 1
                self._cond.notify_all()

    def _cached(self, fill: Fill) -> bool:
        samples = self._samples.get(fill.info.file)
        if not samples or not fill.length:
            return False
        first, last = fill.start // SAMPLE_BYTES, (fill.start + fill.length - 1) // SAMPLE_BYTES
        return 0 not in samples[first : last + 1]

    def _mapped_if_cached(self, fill: Fill) -> torch.Tensor | None:
        """The map of `fill`'s file where every MiB its range touches was cached when the reader
        was made (checked again against the file's size, as every read of a map is), else
        None."""
        if not self._cached(fill):
            return None
        return self._map(fill.info)  # mapped when the reader was made; the size checked now

    def _stage(self, fill: Fill) -> None:
        buffer = self._acquire()
        try:
            self._fill(buffer, fill)
            for segment in fill.segments:
                state = self._tensors[segment.name]
                assert state.data is not None
                source = buffer.area[segment.offset : segment.offset + segment.length]
                target = state.data[segment.at : segment.at + segment.length]
                stream = buffer.index % self.engine.streams
                try:
                    event = self.engine.copy(source, target, stream=stream)
                except Exception as exc:
                    raise self._copy_error(state.info, exc) from exc
                buffer.events.append((segment.name, event))
                with self._cond:
                    state.events.append(event)
        finally:
            with self._cond:
                self._busy.append(buffer)
                self._cond.notify_all()
        with self._cond:
            for segment in fill.segments:
                self._tensors[segment.name].left -= 1
            self._cond.notify_all()

    def _acquire(self) -> _Buffer:
        """A buffer to fill: a free one, a new one while the ring has room, or else the one
        whose copies started first, once they completed."""
        with self._cond:
            while True:
                if self._stopped:
                    raise _Stopped
                if self._free:
                    return self._free.popleft()
                if len(self._buffers) < self.options.staging_buffers:
                    buffer = self._allocate(len(self._buffers))
                    self._buffers.append(buffer)
                    return buffer
                if self._busy:
                    buffer = self._busy.popleft()
                    break
                self._cond.wait()
        self._drain(buffer)
        return buffer

    def _allocate(self, index: int) -> _Buffer:
        size = self.options.staging_bytes
        if not self.direct_io:
            memory = self.engine.staging(size)
            return _Buffer(index, memory, memory)
        memory = self.engine.staging(size + DIRECT_IO_ALIGNMENT)
        skip = -memory.data_ptr() % DIRECT_IO_ALIGNMENT
        return _Buffer(index, memory, memory[skip : skip + size])

    def _drain(self, buffer: _Buffer) -> None:
        """Wait for every copy out of `buffer`: only then may it be filled again."""
        for name, event in buffer.events:
            self._wait(self.checkpoint.tensors[name], event)
        buffer.events.clear()

    def _fill(self, buffer: _Buffer, fill: Fill) -> None:
        fd = self._descriptor(fill.info)
        if self.direct_io:
            self._read_direct(fd, buffer.area, fill)
            return
        span = replace(fill.info, start=fill.start, end=fill.start + fill.length)
        read_range(fd, buffer.area, 0, fill.length, span)

    @staticmethod
    def _read_direct(fd: int, area: torch.Tensor, fill: Fill) -> None:
        """Read `fill` with O_DIRECT: whole aligned blocks from its aligned start; the file's
        last block may come back short."""
        length = -(-fill.length // DIRECT_IO_ALIGNMENT) * DIRECT_IO_ALIGNMENT
        done = 0
        while done < fill.length:
            view = (ctypes.c_char * (length - done)).from_address(area.data_ptr() + done)
            try:
                count = os.preadv(fd, [memoryview(view).cast("B")], fill.start + done)
            except OSError as exc:
                raise checkpoint_error(
                    fill.info.file, fill.info.name, f"file cannot be read ({exc.strerror or exc})"
                ) from None
            if count == 0:
                raise checkpoint_error(
                    fill.info.file,
                    fill.info.name,
                    f"file ended at byte {fill.start + done} while the tensors were read; it was"
                    " truncated since its header was read. Re-open the checkpoint",
                )
            done += count
