"""A loader that gets every decision right, words every error its own way and gives no reasons.

The suite's promise ("How a rule is judged"): it judges what a loader does, never its wording.
`RewordedAdapter` makes the same decisions as the reference (it calls it), but:
  * every refusal is a different class: a new subclass of the type the contract documents
    (`ComponentCheckpointUnsupportedError`, `CheckpointError` and `DeviceMemoryError`, which the
    rules and the adapter Protocol name; else plain `ValueError` / `RuntimeError`);
  * every message keeps the words that name things but in another order, in other prose;
  * zero-copy verdicts and load reports carry no reasons.
Run against it, the suite must fail ZC-14 (reasons are a SHOULD of the report) and nothing else.
It is not a subclass of `ReferenceAdapter`, so tests that judge the reference alone skip.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from reference.errors import (
    CheckpointError,
    ComponentCheckpointUnsupportedError,
    DeviceMemoryError,
)
from reference.kit.adapters.reference import ReferenceAdapter
from reference.place.adopt import Verdict
from reference.report.summary import LoadReport

__all__ = [
    "DOCUMENTED",
    "OWN_CLASSES",
    "RewordedAdapter",
    "reword",
    "reworded_error",
    "without_reasons",
]

# Types a rule or the adapter Protocol names: a reworded error stays an instance of them.
DOCUMENTED: tuple[type[Exception], ...] = (
    ComponentCheckpointUnsupportedError,
    CheckpointError,
    DeviceMemoryError,
    ValueError,
    RuntimeError,
)


def reword(message: str) -> str:
    """The same names, other prose: the message's words in reverse order, after a prefix."""
    return "this loader declines (" + " ".join(reversed(message.split())) + ")"


# One class of this loader's own per documented type.
OWN_CLASSES: dict[type[Exception], type[Exception]] = {
    documented: type(f"Reworded{documented.__name__}", (documented,), {})
    for documented in DOCUMENTED
}


def reworded_error(error: Exception) -> Exception:
    """`error` as another class (a subclass of its documented type) with a reworded message."""
    documented = next(t for t in DOCUMENTED if isinstance(error, t))
    cls = OWN_CLASSES[documented]
    if isinstance(error, CheckpointError):
        new = cls(error.file, error.entry, reword(error.problem))
    else:
        new = cls(reword(str(error)))
    new.__cause__ = error.__cause__
    return new


def without_reasons(value: Any) -> Any:
    """Verdicts and load reports (also inside tuples) with every reason dropped."""
    if isinstance(value, Verdict):
        return Verdict(value.adopt)
    if isinstance(value, LoadReport):
        records = tuple(dataclasses.replace(r, reason=None) for r in value.records)
        return dataclasses.replace(value, records=records)
    if isinstance(value, tuple):
        return tuple(without_reasons(v) for v in value)
    return value


def _rewording(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            result = method(*args, **kwargs)
        except DOCUMENTED as error:
            raise reworded_error(error) from None
        return without_reasons(result)

    return call


class RewordedAdapter:
    """The reference's decisions behind other words and no reasons (see the module docstring)."""

    name = "reworded"

    def __init__(self) -> None:
        self._reference = ReferenceAdapter()
        self.capabilities = self._reference.capabilities

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_"):  # private and dunder names (pickling asks before __init__)
            raise AttributeError(attribute)
        value = getattr(self._reference, attribute)
        return _rewording(value) if callable(value) else value
