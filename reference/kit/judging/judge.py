"""Judging a refusal by the contract, not by the reference's wording ("How a rule is judged").

A refused request raises an instance of the documented error type (a `ValueError` unless a rule
names another) and its message names the offending thing: the flag, component, tensor or file.
The rest of the wording is the loader's choice. "Before any state changed" is the test's own
check (the module untouched, the files unread: see `reference.kit.judging.evidence`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
import torch

from reference.kit.failures import SeamViolation

__all__ = [
    "T",
    "assert_computed_alike",
    "assert_identifies",
    "assert_names",
    "chain",
    "identifies",
    "loaded_or_refused",
    "loaded_or_skip",
    "refusal",
    "skip_cpu_runtime_without_the_setting",
    "tensor_named",
]

T = TypeVar("T")


def refusal(
    call: Callable[[], object], *names: str, error: type[BaseException] = ValueError
) -> BaseException:
    """Run `call`, which must refuse; return what it raised.

    Args:
        call: the request under test.
        names: what the message must name (each a substring of it, exactly as given).
        error: the documented error type; any subclass passes.

    Raises:
        AssertionError: `call` returned, raised another type, or left a name out.
    """
    try:
        result = call()
    except error as raised:
        assert_names(raised, *names)
        return raised
    raise AssertionError(
        f"expected a refusal ({error.__name__}) naming {', '.join(map(repr, names)) or 'nothing'};"
        f" the call returned {type(result).__name__}"
    )


def loaded_or_refused(
    call: Callable[[], T], error: type[BaseException] = ValueError
) -> tuple[T | None, BaseException | None]:
    """Run `call` where a rule lets the loader either honour the request or refuse it:
    (its result, None) or (None, the refusal of type `error`)."""
    try:
        return call(), None
    except error as raised:
        return None, raised


def assert_names(raised: BaseException, *names: str) -> None:
    """The error's message names each of `names`."""
    message = str(raised)
    left_out = [name for name in names if name not in message]
    assert not left_out, f"the refusal does not name {left_out}: {message!r}"


def identifies(message: str, name: str) -> bool:
    """Whether `message` names the thing called `name` (a function, field, flag or component),
    in any usual spelling: any case, its words joined by `_`, `-`, a space or nothing, with or
    without leading underscores or dashes, as a whole word (`state_dict` is not named by
    `load_state_dict`)."""
    words = [w for w in re.split(r"[_\-\s]+", name) if w]
    if not words:
        return False
    spelled = r"[_\- ]?".join(re.escape(w) for w in words)
    pattern = rf"(?<![\w-])[_-]*{spelled}(?![\w-])"
    return re.search(pattern, message, re.IGNORECASE) is not None


def assert_identifies(raised: BaseException, *alternatives: str) -> None:
    """The error's message identifies the offending thing: at least one of `alternatives`
    (names of one thing) in any usual spelling (`identifies`). The rest of the wording is the
    loader's."""
    message = str(raised)
    assert any(identifies(message, name) for name in alternatives), (
        f"the refusal names none of {list(alternatives)} (in any spelling): {message!r}"
    )


def tensor_named(module: torch.nn.Module, name: str) -> torch.Tensor:
    """The tensor `module` holds under the dotted `name`, parameter or buffer alike: whether a
    buffer stayed a buffer is ZC-15's question, not that of a test comparing values."""
    owner, _, leaf = name.rpartition(".")
    value = getattr(module.get_submodule(owner), leaf)
    assert isinstance(value, torch.Tensor), f"{name} is no tensor of the module: {value!r}"
    return value


def chain(raised: BaseException) -> Iterator[BaseException]:
    """The error, then each error it was raised from or during, without cycles."""
    seen: list[BaseException] = []
    current: BaseException | None = raised
    while current is not None and all(current is not s for s in seen):
        seen.append(current)
        yield current
        current = current.__cause__ or current.__context__


def loaded_or_skip(call: Callable[[], T], *, judged_by: str) -> T:
    """Run a load whose *result* a test judges (a report's reasons, what it adopted): a load
    that raises leaves nothing to judge, and whether it may raise is `judged_by`'s question,
    so the test is skipped saying so rather than failing a rule the defect does not touch."""
    try:
        return call()
    except SeamViolation:  # the suite's own defect: never skipped
        raise
    except Exception as error:
        pytest.skip(
            f"the load raised {type(error).__name__}: nothing to judge here ({judged_by} judges"
            " whether it may)"
        )


def skip_cpu_runtime_without_the_setting(loader: object, runtime_device: torch.device) -> None:
    """Skip a CPU-runtime-device case under a CUDA platform for a loader without a
    runtime-device setting (its adapter says `runtime_device_setting = False`): its DiT and
    components run on CUDA whenever the platform is CUDA, so the case cannot arise (SPEC DG-2)."""
    if runtime_device.type == "cpu" and getattr(loader, "runtime_device_setting", True) is False:
        pytest.skip(
            "the loader has no runtime-device setting: a CPU runtime device under a CUDA"
            " platform cannot arise for it (SPEC DG-2)"
        )


def assert_computed_alike(actual: torch.Tensor, expected: torch.Tensor, *, what: str) -> None:
    """`actual` (computed by what a loader returned) against `expected` (computed by an ordinary
    load or construction): bit for bit where both were computed on the CPU; where either was
    computed on another device, within the dtype's default tolerance
    (`torch.testing.assert_close`), since CUDA and CPU kernels round differently (SPEC, GPU
    tier). The failure says what differed: `what`, the dtypes and shapes, the largest
    difference."""
    found = (actual.dtype, tuple(actual.shape))
    wanted = (expected.dtype, tuple(expected.shape))
    assert found == wanted, f"{what}: {found} where an ordinary load gives {wanted}"
    got, want = actual.detach().cpu(), expected.detach().cpu()
    if actual.device.type == "cpu" and expected.device.type == "cpu":
        if not torch.equal(got, want):
            worst = (got.double() - want.double()).abs().max().item()
            raise AssertionError(f"{what}: differs from an ordinary load's (max |diff| {worst})")
        return
    torch.testing.assert_close(
        got, want, msg=lambda detail: f"{what}: differs from an ordinary load's: {detail}"
    )
