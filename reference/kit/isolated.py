"""An attempt that can block, run where a timeout can stop it: in a fresh process.

A loader that opens a named pipe or a device file may block in a call no thread can interrupt
(safetensors' reader holds the GIL while it waits), so a watchdog thread in the test's own
process never fires and the whole run hangs. `attempt` starts a child process instead, which
resolves the loader under test from its SPEC (as the suite did: `--loader`, or the variable),
reaches it through the same seam as the test (only the methods of the capabilities the test is
marked with), makes the one call, and reports what happened. A child still running at the
deadline is killed and the attempt is `blocked`: the loader fails that test, the run goes on.

Each child also measures the memory its call took: the peak resident set during the call over
the resident set just before it (Linux: `VmHWM` is reset through `/proc/self/clear_refs`), and
runs under a data limit (`MEMORY_LIMIT`), so a call that grows without end fails there instead
of taking the machine; with glibc, its threads share one malloc arena, so memory they freed can
be given back (`_one_arena`). Where the platform has it, children are forked from one server
process that imported torch and the kit once (multiprocessing's `forkserver`), so an attempt
costs a fork, not an interpreter start; elsewhere each is a fresh interpreter (`spawn`).
"""

from __future__ import annotations

import multiprocessing
import queue
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import pytest

from reference.kit.failures import SeamView, describe
from reference.kit.seam import METHODS, Unsupported
from reference.kit.selection import resolve_spec

__all__ = [
    "DEADLINE",
    "MEMORY_LIMIT",
    "STARTUP",
    "Attempt",
    "SeamCall",
    "attempt",
    "attempt_with",
    "isolated_call",
]

DEADLINE = 20.0
"""Seconds an isolated call may take, counted from the moment the child is ready to make it
(its start, imports and the loader's resolution are not counted: see `STARTUP`)."""
STARTUP = 180.0
"""Seconds a child may take to start and resolve the loader (a spawned interpreter imports
torch; the first fork starts the server that imports it once)."""
MEMORY_LIMIT = 4 * 1024**3
"""Bytes of data (heap and anonymous maps) the child may hold: a loader that reads a device
file without end fails there, instead of growing until the machine runs out."""


@dataclass(frozen=True)
class Attempt:
    """What one isolated call did.

    Attributes:
        outcome: `returned`, `raised`, `blocked` (still running at the deadline: killed), or
            `crashed` (the process died without an answer: a signal, an abort).
        error_types: the raised error's class and its bases, by name (`CheckpointError`, ...).
        message: the raised error's message, or a summary of what was returned.
        attributes: the raised error's `file` and `entry`, where it has them.
        peak_bytes: how far the child's resident memory rose above its state before the call
            (None where the platform cannot say, or the child gave no answer).
        value: what a function run by `isolated_call` returned (it must pickle).
    """

    outcome: Literal["returned", "raised", "blocked", "crashed"]
    error_types: tuple[str, ...] = ()
    message: str = ""
    attributes: Mapping[str, Any] | None = None
    peak_bytes: int | None = None
    value: Any = None

    def raised(self, error_type: str) -> bool:
        """Whether the call raised an instance of the class named `error_type`."""
        return self.outcome == "raised" and error_type in self.error_types


_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_bytes(field: str) -> int | None:
    try:
        text = _STATUS.read_text()
    except OSError:
        return None
    found = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return int(found.group(1)) * 1024 if found else None


def _reset_peak() -> int | None:
    """The resident bytes now, with the kernel's peak reset to them (None: cannot measure)."""
    try:
        _CLEAR_REFS.write_text("5")  # "5": reset the peak resident set size to the current one
    except OSError:
        return None
    return _status_bytes("VmRSS")


_M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


def _one_arena() -> None:
    """With glibc, make every thread allocate from the main arena. `malloc_trim` gives back
    the free top of the main arena only, not of a thread's own arena, so a load's threads could
    leave freed memory resident (measured: a failed pipeline load, nothing of it alive, 14 MiB
    in a thread's arena in 3 of 16 attempts; none of 16 with one arena), which a test would
    count as memory the load kept. Elsewhere nothing to do."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, 1)
    except (OSError, AttributeError):
        pass


def _child(prepare: Callable[..., Callable[[], Any]], args: tuple[Any, ...], results: Any) -> None:
    _one_arena()  # before any thread of the call allocates
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_LIMIT, MEMORY_LIMIT))
    except (ImportError, ValueError, OSError):  # not POSIX, or a lower hard limit: keep it
        pass
    try:
        call = prepare(*args)  # imports, resolves and warms what the call needs: not charged
    except BaseException as error:
        results.put(("ready",))
        answer = _raised(error, None)
        if answer[0] == "raised":  # not the measured call's refusal: the attempt never ran
            text = f"before the call (resolving or warming the loader): {answer[2]}"
            answer = ("crashed", answer[1], text, None, None, None)
        results.put(answer)
        return
    results.put(("ready",))
    before = _reset_peak()

    def grown() -> int | None:
        peak = _status_bytes("VmHWM")
        return None if before is None or peak is None else max(0, peak - before)

    try:
        value = call()
    except BaseException as error:
        results.put(_raised(error, grown()))
        return
    results.put(("returned", (), describe(value), None, grown(), _picklable(value)))


def _raised(error: BaseException, grown: int | None) -> tuple[Any, ...]:
    text = " ".join(str(error).split())
    if isinstance(error, Unsupported | pytest.skip.Exception):
        # The adapter does not take this request (the seam view turns its `Unsupported` into a
        # skip; one raised outside a seam method, or while warming, is the same answer): carried
        # back as a skip of the test, never as the loader's failure.
        return ("skipped", (), text, None, grown, None)
    names = tuple(cls.__name__ for cls in type(error).__mro__)
    found = {k: getattr(error, k) for k in ("file", "entry") if hasattr(error, k)}
    return ("raised", names, text, found, grown, None)


def _picklable(value: Any) -> Any:
    import pickle

    import torch

    if isinstance(value, torch.nn.Module | torch.Tensor | torch.UntypedStorage):
        return None  # described, not sent: pickling would copy every byte of the weights
    try:
        pickle.dumps(value)
    except Exception:  # a module, a tensor of a map: described, not sent
        return None
    return value


@cache
def _context() -> Any:
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        import torch

        # Imported once in the server, before any child: torch's import is most of a spawn.
        preload = ["torch", __name__]
        if not torch.cuda.is_available():
            # torch._dynamo (with sympy) is what torch imports the first time a process runs
            # some ops on meta through their Python references (a loader's meta build may run
            # them; the reference answers weight_norm's itself): a second per child that
            # builds one (measured 2026-12-07: 3.99 s against 2.06 s for test_pipe's second
            # memory test). Only without CUDA: nothing the server imports may initialise CUDA,
            # which its children could then not use.
            preload.insert(1, "torch._dynamo")
        context.set_forkserver_preload(preload)
        return context
    return multiprocessing.get_context("spawn")


def isolated_call(
    function: Callable[..., Any], *args: Any, deadline: float = DEADLINE, **kwargs: Any
) -> Attempt:
    """Run `function(*args, **kwargs)` in a child process (see the module docstring).

    `function` must be importable by its module and name, and its arguments must pickle.
    """
    return _isolated(_plain, (function, args, kwargs), deadline=deadline)


def _plain(
    function: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Callable[[], Any]:
    return lambda: function(*args, **kwargs)


def _isolated(
    prepare: Callable[..., Callable[[], Any]], args: tuple[Any, ...], *, deadline: float
) -> Attempt:
    context = _context()
    results = context.Queue()
    child = context.Process(target=_child, args=(prepare, args, results), daemon=True)
    child.start()
    started = time.monotonic()
    limit, ready = STARTUP, False
    while time.monotonic() - started < limit:
        try:
            message = results.get(timeout=0.2)
        except queue.Empty:
            if not child.is_alive():
                return Attempt("crashed", message=f"the process died (exit code {child.exitcode})")
            continue
        if message == ("ready",):
            started, limit, ready = time.monotonic(), deadline, True
            continue
        outcome, names, text, found, grown, value = message
        child.join(5)
        if outcome == "skipped":  # the seam's answer (`Unsupported`), not the loader's failure
            pytest.skip(f"in the isolated attempt: {text}")
        return Attempt(outcome, tuple(names), text, found, grown, value)
    child.kill()
    child.join(5)
    if not ready:
        return Attempt("crashed", message=f"the child did not start within {STARTUP:.0f} s")
    return Attempt("blocked", message=f"still running after {deadline:.0f} s: killed")


SeamCall = tuple[Callable[..., Any], tuple[Any, ...], Mapping[str, Any]]
"""`(function, args, kwargs)`: the call `function(loader, *args, **kwargs)`."""


def _through_seam(
    spec: str, capabilities: frozenset[str], call: SeamCall, warm: SeamCall | None
) -> Callable[[], Any]:
    adapter = resolve_spec(spec, origin="the isolated attempt")
    allowed = frozenset().union(*(METHODS[c] for c in capabilities))
    view = SeamView(adapter, allowed=allowed, marked=capabilities)
    if warm is not None:
        # Before the measured call, neither timed nor measured: a process's one-time costs
        # (torch's lazy imports on a first meta initialisation, allocator pools, first-call
        # caches) are not the load's own (SPEC, "Memory is the load's own").
        warm_function, warm_args, warm_kwargs = warm
        warm_function(view, *warm_args, **warm_kwargs)
    function, args, kwargs = call
    return lambda: function(view, *args, **kwargs)


def _method(view: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    return getattr(view, method)(*args, **kwargs)


def attempt_with(
    spec: str,
    capabilities: frozenset[str],
    function: Callable[..., Any],
    *args: Any,
    deadline: float = DEADLINE,
    warm: SeamCall | None = None,
    **kwargs: Any,
) -> Attempt:
    """Call `function(loader, *args, **kwargs)` in a child process, where `loader` is the
    loader `spec` names, seen through the seam of `capabilities` only.

    Args:
        spec: the loader under test's SPEC (what `--loader` was given).
        capabilities: the test's capabilities: the child reaches only their methods.
        function: importable by module and name (a kit helper such as
            `reference.kit.judging.load_paths.load_on_path`); `args` and `kwargs` must pickle.
        deadline: seconds before the child is killed and the attempt counts as blocked.
        warm: `(function, args, kwargs)`, called the same way first, unmeasured and untimed
            (within `STARTUP`): the same kind of load on a small model, so that the attempt's
            `peak_bytes` is the load's own growth. An error it raises makes the attempt
            `crashed` (an adapter's `Unsupported` a skip): never a refusal of the call.
    """
    request = (spec, capabilities, (function, args, dict(kwargs)), warm)
    return _isolated(_through_seam, request, deadline=deadline)


def attempt(
    spec: str,
    capabilities: frozenset[str],
    method: str,
    *args: Any,
    deadline: float = DEADLINE,
    **kwargs: Any,
) -> Attempt:
    """Call the seam method `method(*args, **kwargs)` of the loader `spec` names, in a child
    process (see `attempt_with`)."""
    return attempt_with(spec, capabilities, _method, method, *args, deadline=deadline, **kwargs)
