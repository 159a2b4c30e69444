"""How the suite reaches a loader and how it reports what a loader did wrong.

`SeamView` is the loader as one test may reach it: the methods of the capabilities the test is
marked with, and no others (a call outside them raises `SeamViolation`, a defect of the suite).
`one_line` turns a failed contract test into the line a loader author reads: the rules, the case
in words, and what was expected against what the loader did, without tensor or storage dumps.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from reference.kit.errors import KitError
from reference.kit.seam import LoaderAdapter, Unsupported, capability_of

__all__ = [
    "LINE_LIMIT",
    "SeamView",
    "SeamViolation",
    "describe",
    "first_difference",
    "one_line",
    "printable",
]

LINE_LIMIT = 400
"""The longest failure line the suite prints; longer ones are cut, saying so."""


class SeamViolation(KitError):
    """A test called a loader method of a capability it is not marked with: a suite defect."""


class SeamView:
    """The loader under test as one test reaches it.

    Attributes other than seam methods (`name`, `capabilities`, anything the adapter adds) pass
    through; a seam method passes only when one of the test's capabilities has it, and its
    `Unsupported` (an option the loader does not take) skips the test with the reason.
    """

    def __init__(
        self, adapter: LoaderAdapter, *, allowed: frozenset[str], marked: frozenset[str]
    ) -> None:
        self._adapter = adapter
        self._allowed = allowed
        self._marked = marked

    def __getattr__(self, name: str) -> Any:
        owners = capability_of(name)
        if owners and name not in self._allowed:
            marked = ", ".join(sorted(self._marked)) or "no capability"
            raise SeamViolation(
                f"the test calls {name}, a method of capability {' / '.join(owners)}, but is"
                f" marked with {marked}: a defect of the suite (mark the test, or reach the"
                " loader through its own capability's methods), not of the loader"
            )
        attribute = getattr(self._adapter, name)
        if owners and callable(attribute):
            return _skipping_unsupported(attribute, name)
        return attribute

    def __repr__(self) -> str:
        return f"<{self._adapter.name} seen through {', '.join(sorted(self._marked))}>"


def _skipping_unsupported(method: Callable[..., Any], name: str) -> Callable[..., Any]:
    """`method`, with the adapter's `Unsupported` turned into a skip of the test naming it."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except Unsupported as unsupported:
            pytest.skip(f"the adapter's {name} does not take this request: {unsupported}")

    return call


def describe(value: object) -> str:
    """A tensor, storage or module in a few words; anything else as its short repr."""
    if isinstance(value, torch.Tensor):
        kind = type(value).__name__
        return f"{kind}({value.dtype}, {tuple(value.shape)}, {value.device})"
    if isinstance(value, torch.UntypedStorage):
        return f"UntypedStorage({value.nbytes()} bytes, {value.device})"
    if isinstance(value, torch.nn.Module):
        return f"{type(value).__name__} module"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def first_difference(left: object, right: object) -> str | None:
    """Where two tensors of one shape first differ, in words (None when that cannot be said)."""
    if not (isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor)):
        return None
    if left.shape != right.shape:
        return f"shapes differ: {tuple(left.shape)} vs {tuple(right.shape)}"
    if left.is_meta or right.is_meta or left.numel() == 0:
        return None
    a, b = left.detach().cpu().reshape(-1), right.detach().cpu().reshape(-1)
    try:
        unequal = (a != b.to(a.dtype)).nonzero()
    except RuntimeError:  # dtypes that cannot be compared
        return None
    if unequal.numel() == 0:
        return None
    index = int(unequal[0])
    return f"first difference at flat index {index}: {a[index].item()!r} vs {b[index].item()!r}"


def _case(item: pytest.Item) -> str:
    words = getattr(item, "originalname", item.name).removeprefix("test_").replace("_", " ")
    callspec = getattr(item, "callspec", None)
    return f"{words} [{callspec.id}]" if callspec is not None else words


def _message(error: BaseException) -> str:
    text = str(error).strip()
    if not isinstance(error, AssertionError):
        return f"{type(error).__name__}: {' '.join(text.split())}"
    # pytest's rewritten message: the test's own words first (when it has any), then
    # `assert <expression>` and explanation lines; `where` lines repeat reprs and are dropped.
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    kept = [line for line in lines if not line.startswith(("+", "where"))]
    if kept and not kept[0].startswith("assert "):
        return kept[0]  # the test said what went wrong
    return "; ".join(kept) or "assertion failed"


def printable(text: str) -> str:
    """`text` encodable as UTF-8: a loader's message may carry a path that is not UTF-8 (lone
    surrogates), which no report, terminal or pytest-xdist channel can carry."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def one_line(item: pytest.Item, rules: tuple[str, ...], excinfo: pytest.ExceptionInfo[Any]) -> str:
    """`RULES: the case: what went wrong`, on one line, at most LINE_LIMIT characters."""
    head = ", ".join(rules) or "(no rule)"
    line = printable(" ".join(f"{head}: {_case(item)}: {_message(excinfo.value)}".split()))
    if len(line) > LINE_LIMIT:
        line = line[: LINE_LIMIT - 12] + " ... (cut)"
    return line
