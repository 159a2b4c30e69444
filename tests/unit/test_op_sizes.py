"""The construction guard's sizes (reference/place/op_sizes.py), checked against what each call
really allocates: a derived op's request is never below the bytes of the new tensors it returns,
and it is nothing where the call returns a view or the tensor itself. Calls whose rule does not
know its arguments fall back to one run on meta, and calls that fail there count nothing.

Then the mode that asks it (reference/place/host_memory.py): a meta build's standard layers
make their parameters on meta at once, still checked against every budget, and a guard nested
in another without a budget of its own takes the enclosing one's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from reference.errors import HostMemoryError
from reference.place.host_memory import allocation_guard, factories_on_meta
from reference.place.meta import MetaBuild
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
        (torch.empty, ((2, "wide"),), {}, 0),
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


def _factory_in_a_helper() -> torch.Tensor:
    return torch.empty(4)


def test_only_the_named_constructors_own_factory_calls_go_to_meta() -> None:
    """A factory the constructor calls itself goes to meta; one it calls through another
    function, one made outside it, and one that names another device keep their device."""
    own = nn.Linear.__init__.__code__
    with factories_on_meta(frozenset({own})):
        assert nn.Linear(4, 4).weight.is_meta
        assert not torch.empty(4).is_meta
        assert not _factory_in_a_helper().is_meta
        with factories_on_meta(frozenset({_factory_in_a_helper.__code__})):
            assert _factory_in_a_helper().is_meta
            assert nn.Linear(4, 4).bias.is_meta
        assert not _factory_in_a_helper().is_meta  # the inner block's constructors are gone
        assert nn.Linear(4, 4, device="meta").weight.is_meta
    assert not nn.Linear(4, 4).weight.is_meta


LAYERS: dict[str, Any] = {
    "linear": lambda: nn.Linear(8, 4),
    "conv": lambda: nn.Conv2d(3, 8, 3),
    "conv-transpose": lambda: nn.ConvTranspose3d(3, 8, 3),
    "embedding": lambda: nn.Embedding(10, 4),
    "layer-norm": lambda: nn.LayerNorm(8),
    "group-norm": lambda: nn.GroupNorm(2, 8),
    **({"rms-norm": lambda: nn.RMSNorm(8)} if hasattr(nn, "RMSNorm") else {}),  # torch 2.4+
}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_a_meta_build_makes_a_standard_layers_parameters_on_meta_and_holds_no_bytes(
    layer: str,
) -> None:
    """Every parameter of the layer is a meta `Parameter`, its `reset_parameters` is its own
    again after the build, and none of its bytes are held against the budget: a budget that
    admits the largest parameter admits a build of several layers."""
    with MetaBuild.building(), allocation_guard("vae", budget=1 << 12):
        built = [LAYERS[layer]() for _ in range(64)]  # about 64 x 1 KiB at most, all released
    for module in built:
        params = list(module.parameters())
        assert params
        assert all(type(p) is nn.Parameter and p.is_meta for p in params)
        assert "reset_parameters" not in vars(module)


def test_a_standard_layer_sized_past_the_budget_is_refused_though_it_would_go_to_meta() -> None:
    with (
        MetaBuild.building(),
        allocation_guard("vae", budget=1 << 20, config={"width": 1024}),
        pytest.raises(HostMemoryError, match=r"^vae: .*\[1024, 1024\].*width=1024"),
    ):
        nn.Linear(1024, 1024)  # a 4 MiB weight


def test_a_nested_guard_without_a_budget_takes_the_enclosing_ones() -> None:
    with allocation_guard("outer", budget=1 << 12), allocation_guard("inner"):
        with pytest.raises(HostMemoryError, match=r"^inner: .*past the 4096 bytes"):
            torch.outer(torch.ones(64), torch.ones(64))  # 16 KiB
        assert torch.outer(torch.ones(16), torch.ones(16)).numel() == 256


class _Scaled(nn.Module):
    """A standard layer beside a parameter its own constructor computes."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.fp8 = nn.Linear(4, 4, bias=False, dtype=torch.float8_e4m3fn)
        self.scale = nn.Parameter(torch.randn(4) / 2)


def test_a_meta_build_given_a_precision_makes_the_standard_layers_floating_slots_in_it() -> None:
    """Only what the cast would give that precision anyway: not a float8 weight, and not a
    parameter the model computes (it goes to meta as it was made)."""
    from reference.place.build import build_on_meta

    built = build_on_meta(_Scaled, component="transformer", dtype=torch.bfloat16)
    dtypes = {name: p.dtype for name, p in built.named_parameters()}
    assert all(p.is_meta for p in built.parameters())
    assert dtypes == {
        "proj.weight": torch.bfloat16,
        "proj.bias": torch.bfloat16,
        "fp8.weight": torch.float8_e4m3fn,
        "scale": torch.float32,
    }
    assert build_on_meta(_Scaled, component="transformer").proj.weight.dtype == torch.float32
