"""The load report: one component's load as a value, its tensors' records summed (ZC-14).

Loaders return a `LoadReport` beside the loaded module; the command line prints it and the suite
asserts on it. Nothing here is a log line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from reference.place.records import How, TensorRecord
from reference.request.plan import WeightLoadPlan

__all__ = ["LoadReport", "Tally"]


class Tally(NamedTuple):
    """How many tensors took one way, and their bytes."""

    tensors: int
    bytes: int


@dataclass(frozen=True)
class LoadReport:
    """Per-component summary of one load; `notes` are what a user should know that is not a
    refusal (files of the folder that were not read); `precision` is the dtype the component
    was built in (PREC-6; None where the load asked for none: the build's own dtypes); `steps`
    the seconds of each step of the load, where the loader timed them
    (`reference.report.steps`)."""

    component: str
    plan: WeightLoadPlan
    records: tuple[TensorRecord, ...] = ()
    seconds: float = 0.0
    events: tuple[str, ...] = field(default=())
    notes: tuple[str, ...] = field(default=())
    precision: torch.dtype | None = None
    steps: tuple[tuple[str, float], ...] = ()

    def _count(self, how: How) -> Tally:
        chosen = [r for r in self.records if r.how == how]
        return Tally(len(chosen), sum(r.nbytes for r in chosen))

    @property
    def adopted(self) -> Tally:
        """Tensors and bytes adopted without a copy."""
        return self._count("adopted")

    @property
    def copied(self) -> Tally:
        """Tensors and bytes copied."""
        return self._count("copied")

    @property
    def streamed(self) -> Tally:
        """Tensors and bytes streamed into slots."""
        return self._count("streamed")

    @property
    def conversions(self) -> dict[tuple[torch.dtype, torch.dtype], Tally]:
        """PREC-6: tensors and bytes (of the result) converted, by (checkpoint dtype, slot
        dtype)."""
        found: dict[tuple[torch.dtype, torch.dtype], list[TensorRecord]] = {}
        for record in self.records:
            if record.converted_from is not None and record.dtype is not None:
                found.setdefault((record.converted_from, record.dtype), []).append(record)
        return {
            pair: Tally(len(chosen), sum(r.nbytes for r in chosen))
            for pair, chosen in found.items()
        }

    @property
    def refusals(self) -> dict[str, str]:
        """Why each copied tensor was not adopted, by name."""
        return {r.name: r.reason for r in self.records if r.how == "copied" and r.reason}
