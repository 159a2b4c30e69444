"""The construction guard's sizes (reference/place/op_sizes.py), checked against what each call
really allocates: a derived op's request is never below the bytes of the new tensors it returns,
and it is nothing where the call returns a view or the tensor itself. Calls whose rule does not
know its arguments fall back to one run on meta, and calls that fail there count nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from reference.place.op_sizes import (
    FACTORIES,
    Kind,
    cpu_tensors,
    derived_request,
    factory_request,
    slot_bytes,
    treatment_of,
)

pytestmark = pytest.mark.internal

A = torch.arange(12.0).reshape(3, 4)
B = torch.arange(4.0)
INTS = torch.arange(6)

CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = {
    "to-another-tensor": (torch.Tensor.to, (A, INTS), {}),
    "to-meta": (torch.Tensor.to, (A, "meta"), {}),
    "to-same-dtype": (torch.Tensor.to, (A, torch.float32), {}),
    "to-a-copy": (torch.Tensor.to, (A, torch.float32), {"copy": True}),
    "to-int": (torch.Tensor.to, (A, torch.int8), {}),
    "clone": (torch.Tensor.clone, (A,), {}),
    "contiguous-of-a-transpose": (torch.Tensor.contiguous, (A.t(),), {}),
    "contiguous-already": (torch.Tensor.contiguous, (A,), {}),
    "cat": (torch.cat, ([A, A],), {"dim": 1}),
    "cat-mixed-ranks": (torch.cat, ([A, B.reshape(1, 4), torch.empty(0)],), {}),
    "cat-ranks-differ": (torch.cat, ([A, torch.ones(2, 4, 1)],), {}),
    "stack": (torch.stack, ([B, B, B],), {"dim": 1}),
    "stack-shapes-differ": (torch.stack, ([B, A],), {}),
    "repeat-ints": (torch.Tensor.repeat, (B, 2, 3), {}),
    "repeat-one-int": (torch.Tensor.repeat, (B, 3), {}),
    "repeat-a-list": (torch.Tensor.repeat, (A, [2, 1, 2]), {}),
    "repeat-interleave-flat": (torch.repeat_interleave, (A, 3), {}),
    "repeat-interleave-dim": (torch.repeat_interleave, (A, 2), {"dim": -1}),
    "index-a-slice": (torch.Tensor.__getitem__, (A, (slice(0, 2), 1)), {}),
    "index-a-tensor": (torch.Tensor.__getitem__, (A, torch.tensor([0, 2])), {}),
    "index-a-list": (torch.Tensor.__getitem__, (A, [0, 1]), {}),
    "outer": (torch.outer, (B, B), {}),
    "broadcast-product": (torch.mul, (A, B), {}),
    "integer-divided": (torch.Tensor.__truediv__, (INTS, 2), {}),
    "cos": (torch.cos, (A,), {}),
    "matmul-on-meta": (torch.matmul, (A, B), {}),
    "no-broadcast": (torch.add, (A, torch.ones(5)), {}),
}


def fresh_bytes(value: Any, inputs: list[torch.Tensor]) -> int:
    """Bytes of the host tensors in `value` that share no storage with an input."""
    taken = {t.untyped_storage().data_ptr() for t in inputs}
    leaves = value if isinstance(value, tuple | list) else (value,)
    return sum(
        slot_bytes(t)
        for t in leaves
        if isinstance(t, torch.Tensor)
        and t.device.type == "cpu"
        and t.untyped_storage().data_ptr() not in taken
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_derived_request_is_never_below_what_the_call_allocates(case: str) -> None:
    func, args, kwargs = CASES[case]
    treatment = treatment_of(func)
    assert treatment.kind is Kind.DERIVED, treatment
    tensors = cpu_tensors(args, kwargs)
    asked, _ = derived_request(func, treatment.sizer, args, kwargs, tensors)
    try:
        out = func(*args, **kwargs)
    except RuntimeError:  # the call itself fails: it allocates nothing, and counts nothing
        assert asked == 0
        return
    allocated = fresh_bytes(out, tensors)
    assert asked >= allocated, (asked, allocated)
    if allocated == 0:
        assert asked == 0, f"{case}: counted {asked} bytes for a call that allocates none"


@pytest.mark.parametrize(
    ("func", "args", "kwargs", "expected"),
    [
        (torch.empty, (2, 3), {}, 24),
        (torch.zeros, ((2, 3),), {"dtype": torch.float16}, 12),
        (torch.full, ((4,), 1.0), {}, 16),
        (torch.arange, (10,), {}, 80),
        (torch.arange, (0.0, 1.0, 0.25), {}, 16),
        (torch.arange, (), {"end": 4}, 32),
        (torch.arange, (), {}, 0),
        (torch.eye, (3,), {}, 36),
        (torch.eye, ("three",), {}, 0),
        (torch.empty, ("huge",), {}, 0),
        (torch.empty, (2, 3), {"device": "meta"}, 0),
    ],
)
def test_a_factory_is_sized_from_its_arguments(
    func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], expected: int
) -> None:
    assert func in FACTORIES
    asked, _ = factory_request(func, args, kwargs, default_cpu=True)
    assert asked == expected
    assert factory_request(func, args, kwargs, default_cpu=False)[0] in (0, expected)


def test_an_op_whose_size_its_values_decide_counts_nothing() -> None:
    """`repeat_interleave` by a tensor of counts: neither shape arithmetic nor meta can size
    it before it runs, so it runs as it is (a construction's tables are sized by its config,
    not by data it computes)."""
    counts = torch.tensor([1, 2, 3, 4])
    treatment = treatment_of(torch.repeat_interleave)
    args = (B, counts)
    assert derived_request(torch.repeat_interleave, treatment.sizer, args, {}, [B, counts]) == (
        0,
        (),
    )


def test_views_queries_and_in_place_ops_count_nothing() -> None:
    for func in (torch.Tensor.view, torch.Tensor.size, torch.Tensor.add_, torch.Tensor.t):
        assert treatment_of(func).kind is Kind.PASS, func
    assert treatment_of(torch.Tensor.__iadd__).kind is Kind.PASS
    assert treatment_of(torch.nn.init.normal_).kind is Kind.INITIALISER
    assert treatment_of(torch.matmul).sizer is None  # unknown arithmetic: meta sizes it
