"""An attempt that can block, run where a timeout can stop it: in a fresh process.

A loader that opens a named pipe or a device file may block in a call no thread can interrupt
(safetensors' reader holds the GIL while it waits), so a watchdog thread in the test's own
process never fires and the whole run hangs. `attempt` starts a child process instead, which
resolves the loader under test from its SPEC (as the suite did: `--loader`, or the variable),
reaches it through the same seam as the test (only the methods of the capabilities the test is
marked with), makes the one call, and reports what happened. A child still running at the
deadline is killed and the attempt is `blocked`: the loader fails that test, the run goes on.
"""

from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from reference.kit.failures import SeamView, describe
from reference.kit.seam import METHODS
from reference.kit.selection import resolve_spec

__all__ = ["Attempt", "attempt"]

DEADLINE = 60.0
"""Seconds an isolated call may take: a fresh interpreter imports torch first (seconds)."""
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
    """

    outcome: Literal["returned", "raised", "blocked", "crashed"]
    error_types: tuple[str, ...] = ()
    message: str = ""
    attributes: Mapping[str, Any] | None = None

    def raised(self, error_type: str) -> bool:
        """Whether the call raised an instance of the class named `error_type`."""
        return self.outcome == "raised" and error_type in self.error_types


@dataclass(frozen=True)
class _Call:
    spec: str
    capabilities: frozenset[str]
    method: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]


def _child(call: _Call, results: Any) -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_LIMIT, MEMORY_LIMIT))
    except (ImportError, ValueError, OSError):  # not POSIX, or a lower hard limit: keep it
        pass
    adapter = resolve_spec(call.spec, origin="the isolated attempt")
    allowed = frozenset().union(*(METHODS[c] for c in call.capabilities))
    view = SeamView(adapter, allowed=allowed, marked=call.capabilities)
    try:
        value = getattr(view, call.method)(*call.args, **call.kwargs)
    except BaseException as error:
        names = tuple(cls.__name__ for cls in type(error).__mro__)
        found = {k: getattr(error, k) for k in ("file", "entry") if hasattr(error, k)}
        results.put(("raised", names, " ".join(str(error).split()), found))
        return
    results.put(("returned", (), describe(value), None))


def attempt(
    spec: str,
    capabilities: frozenset[str],
    method: str,
    *args: Any,
    deadline: float = DEADLINE,
    **kwargs: Any,
) -> Attempt:
    """Call `method(*args, **kwargs)` of the loader `spec` names, in a child process.

    Args:
        spec: the loader under test's SPEC (what `--loader` was given).
        capabilities: the test's capabilities: the child reaches only their methods.
        method: the seam method to call; `args` and `kwargs` must pickle (paths, devices).
        deadline: seconds before the child is killed and the attempt counts as blocked.
    """
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    call = _Call(spec, capabilities, method, args, dict(kwargs))
    child = context.Process(target=_child, args=(call, results), daemon=True)
    child.start()
    waited = 0.0
    while waited < deadline:
        try:
            outcome, names, message, found = results.get(timeout=0.2)
        except queue.Empty:
            waited += 0.2
            if not child.is_alive():
                return Attempt("crashed", message=f"the process died (exit code {child.exitcode})")
            continue
        child.join(5)
        return Attempt(outcome, tuple(names), message, found)
    child.kill()
    child.join(5)
    return Attempt("blocked", message=f"still running after {deadline:.0f} s: killed")
