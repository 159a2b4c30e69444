"""A copy engine that behaves like a GPU's, on the CPU: copies complete late and out of order.

`DelayedEngine` implements `reference.read.engine.CopyEngine` with a background thread that runs
each copy after a random delay (from `random.Random(seed)`, so a failing seed replays), in the
order the delays fall due, not the order the copies were started. A copy reads its source when it
finally runs: a reader that refills a staging buffer before the copy's event completed gets the
next bytes in its tensor, which a real device shows only as rare corrupted weights. It can fail
a chosen copy (its event re-raises the error), raise `KeyboardInterrupt` from a chosen `copy`
call, and counts the staging bytes in use (now and at peak).
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from dataclasses import dataclass, field

import torch

from reference.read.engine import CopyEvent

__all__ = ["ENGINE_THREAD_NAME", "CopyFailed", "DelayedEngine"]

ENGINE_THREAD_NAME = "delayed-copy-engine"


class CopyFailed(RuntimeError):
    """The error of the copy a `DelayedEngine` was told to fail."""


class _Event:
    def __init__(self) -> None:
        self._done = threading.Event()
        self.error: BaseException | None = None

    def finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self._done.set()

    def query(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        self._done.wait()
        if self.error is not None:
            raise self.error


@dataclass(order=True)
class _Job:
    due: float
    index: int
    source: torch.Tensor = field(compare=False)
    destination: torch.Tensor = field(compare=False)
    event: _Event = field(compare=False)


class DelayedEngine:
    """A `CopyEngine` whose copies run late, out of order, on a background thread.

    Args:
        seed: seeds the delays.
        streams: streams it accepts (each copy may name any of them; all share one thread).
        max_delay: each copy runs between 0 and this many seconds after it was started.
        fail_at: the index (0-based, in the order `copy` was called) of a copy that fails: its
            event's `wait` raises `CopyFailed`, and its destination is left as it was.
        interrupt_at: the index of a `copy` call that raises `KeyboardInterrupt` itself.

    Attributes:
        copies: how many copies were started.
        completed: the indices of the copies in the order they ran (failed ones included).
        in_use: staging bytes handed out and not yet released; `peak`: the most at once.
    """

    def __init__(
        self,
        seed: int,
        *,
        streams: int = 2,
        max_delay: float = 0.002,
        fail_at: int | None = None,
        interrupt_at: int | None = None,
    ) -> None:
        self._random = random.Random(seed)
        self._streams = streams
        self.max_delay = max_delay
        self.fail_at = fail_at
        self.interrupt_at = interrupt_at
        self.copies = 0
        self.completed: list[int] = []
        self.in_use = 0
        self.peak = 0
        self._held: dict[int, int] = {}
        self._cond = threading.Condition()
        self._jobs: list[_Job] = []
        self._thread: threading.Thread | None = None
        self._started: list[threading.Thread] = []  # not joined yet

    @property
    def streams(self) -> int:
        return self._streams

    def stages_in_place(self, device: torch.device) -> bool:
        return False

    def staging(self, nbytes: int) -> torch.Tensor:
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        with self._cond:
            self._held[buffer.data_ptr()] = nbytes
            self.in_use += nbytes
            self.peak = max(self.peak, self.in_use)
        return buffer

    def release(self, buffer: torch.Tensor) -> None:
        with self._cond:
            nbytes = self._held.pop(buffer.data_ptr(), None)
            if nbytes is None:
                raise AssertionError("DelayedEngine.release: a buffer it did not hand out")
            self.in_use -= nbytes

    def copy(self, source: torch.Tensor, destination: torch.Tensor, *, stream: int) -> CopyEvent:
        if not 0 <= stream < self._streams:
            raise AssertionError(f"DelayedEngine.copy: no stream {stream}")
        if source.nbytes != destination.nbytes:
            raise AssertionError("DelayedEngine.copy: source and destination sizes differ")
        event = _Event()
        with self._cond:
            index = self.copies
            self.copies += 1
            if index == self.interrupt_at:
                raise KeyboardInterrupt
            due = time.monotonic() + self._random.uniform(0, self.max_delay)
            heapq.heappush(self._jobs, _Job(due, index, source, destination, event))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=ENGINE_THREAD_NAME, daemon=True
                )
                self._thread.start()
                self._started.append(self._thread)
            self._cond.notify_all()
        return event

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._jobs:
                    self._thread = None
                    return
                job = self._jobs[0]
                wait = job.due - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._jobs)
                self.completed.append(job.index)
            if job.index == self.fail_at:
                job.event.finish(CopyFailed(f"copy {job.index} failed (DelayedEngine fail_at)"))
                continue
            try:
                job.destination.copy_(job.source)  # reads the source now, not when started
            except Exception as exc:  # an event never finished would hang its waiter
                job.event.finish(exc)
            else:
                job.event.finish()

    def close(self) -> None:
        """Wait until every copy started has run and the background thread has ended."""
        while True:
            with self._cond:
                started, self._started = self._started, []
            if not started:
                return
            for thread in started:
                thread.join()
