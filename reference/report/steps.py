"""Where a load's time goes: seconds per step, measured by the load itself.

A load times its steps with one `StepClock` and puts `StepClock.seconds()` into its report
(`LoadReport.steps`): `open` (the checkpoint's headers and the memory preflight), `build` (the
model on meta, the construction guard included, and the name check), `read` (making the reader,
and the time the load waited on it for tensors: the pool's reads, or views of the file's map,
whose pages are then read by the copy that touches them), `place` (the rest of giving every slot
its tensor: verdicts, copies, the records) and `finish` (buffers, weight processing, offload).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["STEPS", "StepClock"]

STEPS = ("open", "build", "read", "place", "finish")
"""The steps a DiT load reports, in the order they run."""


class StepClock:
    """Seconds per named step, summed over every time the step ran."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}

    def add(self, step: str, seconds: float) -> None:
        """Count `seconds` more to `step`."""
        self._seconds[step] = self._seconds.get(step, 0.0) + seconds

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time the block as (part of) step `name`, also when it raises."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - began)

    def seconds(self) -> tuple[tuple[str, float], ...]:
        """(step, seconds) of every step that ran, in the order of `STEPS`, then any other."""
        order = {name: i for i, name in enumerate(STEPS)}
        return tuple(sorted(self._seconds.items(), key=lambda kv: order.get(kv[0], len(order))))
