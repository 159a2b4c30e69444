"""A bounded pool of reader threads, for loads that copy every tensor (`PooledReader`).

One stream reads a cold file slower than several (`reference.read.reading` has the figures). The
pool reads tensors in file order with `os.preadv` into fresh CPU buffers, several at once.
Where its buffers are staging (a load onto a device), every tensor is split into chunks of
`CHUNK_BYTES` and the chunks of the tensors in flight are shared among the workers, so one huge
tensor is read in parallel too; at most `max_tensors` tensors and `max_bytes` bytes are in
flight (read or being read, not yet handed out; a tensor larger than `max_bytes` is read alone),
so the reader holds at most that window beside what its caller keeps.

Where the caller keeps every buffer it is handed as a loaded tensor (`buffers_kept`: a load onto
the CPU that pools only such tensors), the buffers are the model's memory, not the reader's, and
a window would bound nothing; there every tensor read ahead is read at once, as `workers`
contiguous shares of their bytes in file order, one sequential stream per worker: the way the
machine's best cold read reads a file (`reference.programs.bench.limits.preadv`). Measured on
2026-12-02 at 512 MiB on a 2-vCPU machine, cold, fresh processes side by side (medians of 6 to 12):
the same 8 MiB chunks read as 4 contiguous shares took 0.28 s, as long as `preadv` on 4 threads
(0.28 s), against 0.35-0.39 s handed to the workers one by one and 0.31-0.33 s in runs of
64 MiB; the DiT copy path through this reader took 0.28 s against 0.29 s for `preadv_4` and
0.28 s for `preadv_3`.

Never for tensors that will be adopted: zero-copy needs views of the file's map (ZC-*); the
pool's buffers are fresh allocations, which is what the copy path promises.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable, Collection
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import torch

from reference.errors import ArgumentError
from reference.files import checkpoint_error
from reference.read.checkpoint import Checkpoint, TensorReader, truncation
from reference.read.header import TensorInfo
from reference.read.prefetch import SAMPLE_BYTES, cached_samples, populate, prefetch_supported
from reference.read.reading import ReadOptions

__all__ = ["CHUNK_BYTES", "READER_THREAD_NAME", "PooledReader", "read_range"]

# Measured: 8 MiB chunks read a cold file faster than 2 or 4 MiB ones, and as fast as 16 MiB.
CHUNK_BYTES = 8 * 1024 * 1024
READER_THREAD_NAME = "checkpoint-reader"
_PREADV = getattr(os, "preadv", None)


class _Stopped(Exception):
    """A chunk skipped because another chunk failed first (never leaves this module)."""


class _Failure:
    """The first error any chunk of one reader met; once set, or once the reader is closed,
    chunks not started are skipped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        self.closed = False

    @property
    def stopped(self) -> bool:
        return self.closed or self.error is not None

    def set(self, error: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = error


def read_range(fd: int, buffer: torch.Tensor, start: int, length: int, info: TensorInfo) -> None:
    """Read `length` bytes of `info`'s tensor, from its byte `start` on, into the same bytes of
    `buffer` (a uint8 CPU tensor of `info.nbytes`), through `fd`, the file's checked descriptor.

    Raises:
        CheckpointError: naming the file and the tensor: the file ended early (it was truncated
            after its size was checked) or cannot be read.
    """
    address = buffer.data_ptr() + start
    offset = info.start + start
    done = 0
    while done < length:
        try:
            if _PREADV is not None:
                view = (ctypes.c_char * (length - done)).from_address(address + done)
                count = _PREADV(fd, [memoryview(view).cast("B")], offset + done)
            else:  # no preadv here (not Linux): positional reads into a bytes object
                data = os.pread(fd, length - done, offset + done)
                ctypes.memmove(address + done, data, len(data))
                count = len(data)
        except OSError as exc:
            raise checkpoint_error(
                info.file, info.name, f"file cannot be read ({exc.strerror or exc})"
            ) from None
        if count == 0:
            problem = truncation(info, os.fstat(fd).st_size) or (
                f"file ended at byte {offset + done} while the tensor was read; it was truncated"
                " since its header was read. Re-open the checkpoint"
            )
            raise checkpoint_error(info.file, info.name, problem)
        done += count


def _chunk(
    fd: int, buffer: torch.Tensor, *, start: int, length: int, info: TensorInfo, failure: _Failure
) -> None:
    if failure.stopped:
        raise _Stopped
    try:
        read_range(fd, buffer, start, length, info)
    except BaseException as exc:
        failure.set(exc)
        raise


def _populate(mapped: torch.Tensor, *, start: int, length: int, failure: _Failure) -> None:
    if failure.stopped:
        raise _Stopped
    # A failure here is not reported: the read that follows checks the file and reports it.
    populate(mapped.data_ptr() + start, length)


@dataclass(frozen=True)
class _Piece:
    """One chunk of a share: `read` (a chunk job, its leading arguments bound) of `length`
    bytes from `start`, then `done` completed."""

    read: Callable[..., None]
    start: int
    length: int
    done: Future[None]


def _share(pieces: list[_Piece], *, failure: _Failure) -> None:
    """One worker's contiguous share, chunk after chunk in file order. A chunk's error
    completes its `done`; the chunks after it then complete as skipped (`_Stopped`), so no
    wait for one of them blocks."""
    for piece in pieces:
        try:
            piece.read(start=piece.start, length=piece.length, failure=failure)
        except BaseException as exc:
            piece.done.set_exception(exc)
        else:
            piece.done.set_result(None)


@dataclass(frozen=True)
class _InFlight:
    """A tensor in the window: read into `buffer` (pooled) or faulted into the map (not)."""

    info: TensorInfo
    buffer: torch.Tensor | None
    chunks: tuple[Future[None], ...]


class PooledReader(TensorReader):
    """A `TensorReader` whose tensors are read ahead, in file order, by a pool of threads.

    Each file is checked before its first byte is read, as `TensorReader` checks it (same
    device, inode, size and modification time as when its header was validated), and read
    through that checked descriptor; each tensor's end is checked against the file's size before
    it is read. A tensor comes back with the dtype and shape of its header, in its own fresh
    buffer (its name is in `fresh_names`; a misaligned tensor needs no extra copy). Reads ahead
    follow `iter(reader)`; a name asked for out of that order (or a second time) is read on the
    caller's thread.

    Only the tensors `pooled` selects are read so (all by default), and with
    `options.map_when_cached` only those not already in the page cache when the reader is made
    (`reference.read.prefetch.cached_samples`; the default): measured at 512 MiB on 2 cores, a
    warm copy out of the map was faster than the pool's `preadv` shares (`reference.read.reading`
    has the figures). The others are handed out as
    `TensorReader` hands them out, as views of the file's map; the workers fault those not
    cached in ahead of the caller within the same window (`reference.read.prefetch.populate`, where
    the system has it), so they are read at the rate of several streams too. With `streaming`
    the map is dropped after each of those reads, as `StreamingReader` does, and nothing is
    faulted in ahead. A load selects the tensors whose buffers become its loaded tensors:
    reading one the load copies anyway into a buffer first adds a copy, and measured, that made
    a warm load slower than copying from the map.

    With `buffers_kept` (the caller keeps every buffer it is handed as a loaded tensor), the
    first read schedules every tensor read ahead, as `workers` contiguous shares of their
    bytes in file order, without a window: the buffers are then the caller's memory, not the
    reader's, so the window would bound nothing but the speed (see the module's docstring).

    Errors never stay on a reader thread: the first one stops the pool (chunks not started are
    skipped) and is raised, naming the file and the tensor, by the caller's next `read`, after
    the threads were joined. `close()` cancels what is queued and joins the threads; the load
    functions close their reader in all cases.

    Args:
        checkpoint: the validated checkpoint.
        options: `workers` (at least 1), `max_tensors`, `max_bytes`, `map_when_cached`
            (`ReadOptions`).
        pooled: the names of the tensors the pool reads; None: all of them.
        streaming: drop the map after each read of a tensor the pool does not read.
        buffers_kept: the caller keeps every pooled tensor's buffer as a loaded tensor:
            read in contiguous shares, without a window.

    Raises:
        ArgumentError: `options.workers` is 0 (that means no pool: use `TensorReader`).
        CheckpointError: with `map_when_cached`, a file that changed since its header was read
            (it is mapped, and so checked, to tell what is cached).
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        options: ReadOptions,
        *,
        pooled: Collection[str] | None = None,
        streaming: bool = False,
        buffers_kept: bool = False,
    ) -> None:
        super().__init__(checkpoint)
        if options.workers < 1:
            raise ArgumentError(
                "PooledReader needs ReadOptions.workers of at least 1 (0 reads from the map)"
            )
        self.options = options
        self.streaming = streaming
        self.buffers_kept = buffers_kept
        self._order = list(super().__iter__())
        chosen = [n for n in self._order if pooled is None or n in pooled]
        self._cached_names: frozenset[str] = frozenset()
        if options.map_when_cached:
            samples: dict[Path, bytes | None] = {}  # each file's, taken once
            self._cached_names = frozenset(
                n for n in self._order if self._cached(checkpoint.tensors[n], samples)
            )
            if streaming:
                TensorReader.close(self)
        self.fresh_names = frozenset(n for n in chosen if n not in self._cached_names)
        self._position = {name: n for n, name in enumerate(self._order)}
        self._next = 0  # the first name of `_order` not yet scheduled
        self._taken: set[str] = set()  # names read out of order before they were scheduled
        self._in_flight: dict[str, _InFlight] = {}
        self._in_flight_bytes = 0
        self._fds: dict[Path, int] = {}
        self._failure = _Failure()
        self._executor: ThreadPoolExecutor | None = None
        self._faults_ahead = prefetch_supported()

    def _cached(self, info: TensorInfo, samples: dict[Path, bytes | None]) -> bool:
        """Whether the tensor's bytes are in the page cache, by the samples of its MiBs."""
        if info.file not in samples:
            samples[info.file] = cached_samples(self._map(info))
        held = samples[info.file]
        if held is None or info.nbytes == 0:
            return False
        return 0 not in held[info.start // SAMPLE_BYTES : (info.end - 1) // SAMPLE_BYTES + 1]

    def _descriptor(self, info: TensorInfo) -> int:
        fd = self._fds.get(info.file)
        if fd is None:
            fd = self._fds[info.file] = self._open(info)  # identity and size checked
            return fd
        problem = truncation(info, os.fstat(fd).st_size)
        if problem is not None:
            raise checkpoint_error(info.file, info.name, problem)
        return fd

    def _submit(self, job: Callable[..., None], *args: object, **kwargs: object) -> Future[None]:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                self.options.workers, thread_name_prefix=READER_THREAD_NAME
            )
        return self._executor.submit(job, *args, failure=self._failure, **kwargs)

    def _start(self, info: TensorInfo) -> tuple[torch.Tensor | None, Callable[..., None], int]:
        """What reading `info` ahead takes: its fresh buffer (None: its map is faulted in), the
        chunk job with its leading arguments bound, and the offset its chunks start from."""
        if info.name in self.fresh_names:
            fd = self._descriptor(info)
            buffer = torch.empty(info.nbytes, dtype=torch.uint8)
            return buffer, functools.partial(_chunk, fd, buffer, info=info), 0
        mapped = self._map(info)  # checked as TensorReader checks it
        return None, functools.partial(_populate, mapped), info.start

    def _schedule(self, info: TensorInfo) -> None:
        buffer, read, base = self._start(info)
        chunks = tuple(
            self._submit(read, start=base + start, length=min(CHUNK_BYTES, info.nbytes - start))
            for start in range(0, info.nbytes, CHUNK_BYTES)
        )
        self._in_flight[info.name] = _InFlight(info, buffer, chunks)
        self._in_flight_bytes += info.nbytes

    def _schedule_shares(self, infos: list[TensorInfo]) -> None:
        """Schedule `infos` (in file order) as `workers` contiguous shares of their bytes, each
        share one job that reads its chunks one after the other."""
        share = max(1, -(-sum(info.nbytes for info in infos) // self.options.workers))
        shares: list[list[_Piece]] = [[]]
        filled = 0  # bytes in the last share
        for info in infos:
            buffer, read, base = self._start(info)
            done: list[Future[None]] = []
            start = 0
            while start < info.nbytes:
                length = min(CHUNK_BYTES, info.nbytes - start, share - filled)
                piece = _Piece(read, base + start, length, Future())
                shares[-1].append(piece)
                done.append(piece.done)
                start += length
                filled += length
                if filled == share:
                    shares.append([])
                    filled = 0
            self._in_flight[info.name] = _InFlight(info, buffer, tuple(done))
            self._in_flight_bytes += info.nbytes
        for pieces in shares:
            if pieces:
                self._submit(_share, pieces)

    def _ahead_now(self, name: str) -> bool:
        """Whether `name`, next in file order, is to be scheduled: read ahead and not read yet."""
        return name not in self._taken and self._ahead(name)

    def _ahead(self, name: str) -> bool:
        """Whether `name` is read ahead: pooled, or faulted into a map that stays."""
        return name in self.fresh_names or (
            self._faults_ahead and not self.streaming and name not in self._cached_names
        )

    def _fill(self) -> None:
        """Schedule the next tensors in file order while the window has room (with
        `buffers_kept`, all of them, in shares)."""
        if self.buffers_kept:
            ahead, self._next = self._order[self._next :], len(self._order)
            infos = [self.checkpoint.tensors[name] for name in ahead if self._ahead_now(name)]
            if infos:
                self._schedule_shares(infos)
            return
        while self._next < len(self._order):
            name = self._order[self._next]
            if not self._ahead_now(name):
                self._next += 1
                continue
            info = self.checkpoint.tensors[name]
            if self._in_flight and (
                len(self._in_flight) >= self.options.max_tensors
                or self._in_flight_bytes + info.nbytes > self.options.max_bytes
            ):
                return
            self._schedule(info)
            self._next += 1

    def _raise(self) -> None:
        error = self._failure.error
        self.close()
        assert error is not None
        raise error

    def _wait(self, flight: _InFlight) -> None:
        wait(flight.chunks, return_when=FIRST_EXCEPTION)
        if self._failure.error is not None:
            self._raise()
        del self._in_flight[flight.info.name]

    def _fresh(self, info: TensorInfo, flight: _InFlight | None) -> torch.Tensor:
        """The bytes of a pooled tensor: waited for where in flight, else read now."""
        if flight is not None:
            self._wait(flight)
            assert flight.buffer is not None
            return flight.buffer
        buffer = torch.empty(info.nbytes, dtype=torch.uint8)
        read_range(self._descriptor(info), buffer, 0, info.nbytes, info)
        return buffer

    def read(self, name: str, *, device: torch.device) -> torch.Tensor:
        """One tensor, on `device`, with the dtype and shape of its header; on the CPU, for a
        name in `fresh_names`, in a fresh buffer of its own, else a view of the file's map.

        Raises:
            KeyError: for a name the checkpoint does not hold.
            CheckpointError: the file changed or was truncated since its header was read, or
                cannot be read, naming the file and the tensor (possibly a tensor read ahead).
        """
        info = self.checkpoint.tensors[name]
        if self._failure.error is not None:
            self._raise()
        try:
            self._fill()
            flight = self._in_flight.get(name)
            if flight is None and self._position[name] >= self._next:
                self._taken.add(name)  # read now, out of order: never read ahead after it
            if name in self.fresh_names:
                tensor = self._fresh(info, flight).view(info.dtype).view(info.shape)
                if device.type != "cpu":
                    tensor = tensor.to(device)
                self._progress(info.nbytes)
            else:
                if flight is not None:
                    self._wait(flight)
                tensor = TensorReader.read(self, name, device=device)
                if self.streaming:
                    TensorReader.close(self)
            if flight is not None:  # leaves the window only once copied where it goes
                self._in_flight_bytes -= info.nbytes
            self._fill()
        except BaseException:
            self.close()
            raise
        return tensor

    def close(self) -> None:
        """Cancel the reads queued, join the threads, drop the buffers in flight and close the
        descriptors; tensors already handed out are the caller's."""
        executor, self._executor = self._executor, None
        if executor is not None:
            self._failure.closed = True  # a share being read stops at its next chunk
            executor.shutdown(wait=True, cancel_futures=True)
            if self._failure.error is None:
                self._failure = _Failure()
        self._in_flight.clear()
        self._in_flight_bytes = 0
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)
        super().close()

    def __del__(self) -> None:
        if getattr(self, "_executor", None) is not None or getattr(self, "_fds", None):
            self.close()
