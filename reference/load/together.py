"""Loading a pipeline's prepared components at the same time, all or nothing (PIPE-3, PIPE-4).

Each component loads on a thread of its own through its own loader, at most `concurrency` at
once: reads (`preadv`, page faults) and torch's copies release the GIL, so a DiT, its text
encoder and its VAE overlap instead of queueing. The results come back in the order given,
whatever order the loads end in, and each is the one a sequential load gives (the same loader,
the same request).

The first failure stops the others: every reader reports each tensor it has read
(`reference.read.checkpoint.reading_progress`), and once a component has failed that report
raises `Stopped` in the others, whose loads then unwind as any failed load does (readers
closed, their threads joined, files closed). Nothing of the load is returned or kept: the
modules loaded so far are dropped, and the tracebacks that would hold them are cleared, so their
memory goes back. Ctrl-C while the components load does the same, and re-raises.
"""

from __future__ import annotations

import contextvars
import gc
import threading
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import NoReturn, TypeVar

from reference.errors import LoadError
from reference.read.checkpoint import current_progress, reading_progress

__all__ = ["LOADER_THREAD_NAME", "Stopped", "run_together"]

T = TypeVar("T")
LOADER_THREAD_NAME = "pipeline-component"


class Stopped(LoadError):
    """A component's load stopped because another one of the same pipeline load failed (never
    leaves `run_together`)."""


def _clear(error: BaseException | None) -> None:
    """Drop the frames `error` and the errors it chains hold: they reference the modules of
    the loads that failed."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if error.__traceback__ is not None:
            traceback.clear_frames(error.__traceback__)
            error.__traceback__ = None
        error = error.__cause__ or error.__context__


class _Run:
    """One `run_together` call's shared state: the stop flag every reader checks, and the first
    failure in time (not in the jobs' order)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.outer = current_progress()
        self._lock = threading.Lock()
        self.first: tuple[BaseException, str] | None = None

    def watch(self, nbytes: int) -> None:
        """The progress callback of every job's readers: passes the bytes on, and stops a job
        at its next tensor once another failed."""
        if self.outer is not None:
            self.outer(nbytes)
        if self.stop.is_set():
            raise Stopped("stopped: another component of the pipeline failed")

    def job(self, job: Callable[[], T], name: str) -> T:
        if self.stop.is_set():
            raise Stopped("stopped before it started: another component failed")
        try:
            with reading_progress(self.watch):
                return job()
        except BaseException as error:
            with self._lock:
                if self.first is None and not isinstance(error, Stopped):
                    self.first = (error, name)
            self.stop.set()  # the others stop at their next tensor, not when this thread is seen
            raise


def run_together(
    jobs: Sequence[Callable[[], T]], *, names: Sequence[str], concurrency: int
) -> list[T]:
    """Run every job (one component's load each, `names[i]` naming job i) on at most
    `concurrency` threads; return their results in the order of `jobs`.

    Raises:
        The first failure of a job in time, as raised (with a note, from Python 3.11, naming
        its component and saying that the others were stopped and nothing was kept);
        KeyboardInterrupt (after stopping every job the same way).
    """
    state = _Run()
    futures: list[Future[T]] = []
    interrupt: BaseException | None = None
    executor = ThreadPoolExecutor(
        max_workers=max(1, min(concurrency, len(jobs))), thread_name_prefix=LOADER_THREAD_NAME
    )
    try:
        for job, name in zip(jobs, names, strict=True):
            # Each thread starts from this context: the caller's progress callback reaches it.
            futures.append(executor.submit(contextvars.copy_context().run, state.job, job, name))
        pending = set(futures)
        while pending and not state.stop.is_set():
            # A bounded wait, so a Ctrl-C reaches this thread while the loads run.
            _, pending = wait(pending, timeout=0.1, return_when=FIRST_EXCEPTION)
    except BaseException as error:  # Ctrl-C: stop every load as a failure would
        interrupt = error
        state.stop.set()
    finally:
        if state.stop.is_set():
            for future in futures:
                future.cancel()
        executor.shutdown(wait=True)
    if not state.stop.is_set():
        return [future.result() for future in futures]
    for future in futures:
        if future.done() and not future.cancelled():
            _clear(future.exception())
    del futures, jobs
    failure, failed = state.first or (interrupt, "")
    state.first = None
    if interrupt is not None:
        failure, failed = interrupt, ""
    assert failure is not None
    _raise(failure, failed)


def _raise(failure: BaseException, failed: str) -> NoReturn:
    """Raise `failure` with nothing of the load left reachable from it."""
    _clear(failure.__context__ if not isinstance(failure, Exception) else failure)
    gc.collect()
    add_note = getattr(failure, "add_note", None)  # Python 3.11 and later
    if add_note is not None and failed:
        add_note(
            f"component {failed!r} failed; the pipeline's other components were stopped and"
            " nothing of the load was kept"
        )
    raise failure
