"""ZC-1..14: the reference's own adoption machinery (reference.place.adopt), piece by piece.

test_zc.py / test_zc_loads.py judge every loader by what its loads do; these tests call the
reference's building blocks directly: its device match, its record of adopted byte ranges
(ZC-12), its slot finder (tied and shared entries), its copy path (strides, requires_grad, the
parameter class) and its reasons (ZC-14) when a layer lacks what the rules read.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from fakes.layers import LINEAR_KINDS, ColumnParallelLinear, ReplicatedLinear
from reference.place.adopt import (
    AdoptedBytes,
    LinearKinds,
    load_full_state,
    same_device,
    zero_copy_verdict,
)
from reference.place.cast import cast_slots
from reference.place.modules import (
    find_slots,
    in_eval_mode,
    own_attribute,
)

pytestmark = pytest.mark.reference_only("calls reference.place.adopt's internals directly")

CPU = torch.device("cpu")


def dev(spec: str) -> torch.device:
    return torch.device(spec)


@pytest.mark.rule("DG-5")
@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("cpu", "cpu", True),
        ("cpu", "cpu:0", True),
        ("cuda:0", "cuda", True),
        ("cuda", "cuda:1", True),
        ("cuda:1", "cuda:1", True),
        ("cuda:0", "cuda:1", False),
        ("cpu", "cuda", False),
        ("cpu", "meta", False),
    ],
)
def test_same_device(a: str, b: str, same: bool) -> None:
    assert same_device(dev(a), dev(b)) is same
    assert same_device(dev(b), dev(a)) is same


@pytest.mark.rule("ZC-12")
def test_adopted_ranges_name_the_one_overlapped() -> None:
    data = torch.arange(16.0)
    adopted = AdoptedBytes()
    adopted.add("x", data[0:4])
    adopted.add("y", data[8:12])
    assert adopted.clash(data[9:10]) == "y"
    assert adopted.clash(data[2:3]) == "x"
    assert adopted.clash(data[3:9]) == "y"  # overlaps both: the later one is found first
    assert adopted.clash(data[4:8]) is None
    assert adopted.clash(data[12:16]) is None
    assert adopted.clash(data[10:10]) is None  # no bytes, nothing shared


@pytest.mark.rule("ZC-12")
def test_overlap_is_found_across_storage_objects() -> None:
    """Two tensors over the same memory through different storages still share bytes."""
    data = torch.arange(8.0)
    again = torch.from_numpy(np.asarray(data.numpy()))
    assert again.untyped_storage()._cdata != data.untyped_storage()._cdata
    adopted = AdoptedBytes()
    adopted.add("x", data)
    assert adopted.clash(again[2:3]) == "x"


@pytest.mark.rule("ZC-12")
def test_meta_storages_are_separate_spaces() -> None:
    a = torch.empty(8, device="meta")
    b = torch.empty(8, device="meta")
    adopted = AdoptedBytes()
    adopted.add("a", a[0:4])
    assert adopted.clash(b[0:4]) is None
    assert adopted.clash(a[2:6]) == "a"


class TwoNames(nn.Module):
    """One parameter under two names of one module, a None parameter before a real one, and a
    submodule registered under two paths."""

    def __init__(self) -> None:
        super().__init__()
        self.register_parameter("none_first", None)
        self.w1 = nn.Parameter(torch.ones(2))
        self.register_parameter("w2", self.w1)
        self.inner = nn.Linear(2, 2)
        self.again = self.inner


@pytest.mark.rule("ZC-12")
def test_find_slots_keeps_every_place_and_alias() -> None:
    module = TwoNames()
    found = find_slots(module)
    slots, aliases = found.by_name, found.aliases
    assert list(slots) == ["w1", "inner.weight", "inner.bias"]
    assert slots["w1"].places == ((module, "w1"), (module, "w2"))
    assert slots["inner.weight"].places == ((module.inner, "weight"),)
    assert aliases == {"w2": "w1", "again.weight": "inner.weight", "again.bias": "inner.bias"}


@pytest.mark.internal
def test_cast_slots_returns_the_slots_find_slots_finds_after_it() -> None:
    with torch.device("meta"):
        module = TwoNames()
    module.register_buffer("steps", torch.zeros(2, dtype=torch.int64, device="meta"))
    returned = cast_slots(module, torch.bfloat16)
    found = find_slots(module)
    assert list(returned.by_name) == list(found.by_name)
    assert returned.aliases == found.aliases
    for name, slot in found.by_name.items():
        mine = returned.by_name[name]
        assert mine.tensor is slot.tensor
        assert mine.places == slot.places
        assert mine.is_parameter == slot.is_parameter
    assert module.w1 is module.w2
    assert module.w1.dtype == torch.bfloat16
    assert module.steps.dtype == torch.int64


class _KeepsNormTraining(nn.Module):
    """A module whose `train` keeps its norm in training mode (a class override to honour)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(2)

    def train(self, mode: bool = True) -> _KeepsNormTraining:
        super().train(mode)
        self.norm.training = True
        return self


@pytest.mark.internal
def test_in_eval_mode_is_eval_and_runs_overrides() -> None:
    plain = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Dropout()))
    assert in_eval_mode(plain) is plain
    assert not any(sub.training for sub in plain.modules())
    custom = nn.Sequential(_KeepsNormTraining())
    assert in_eval_mode(custom) is custom
    assert custom[0].norm.training
    assert not custom[0].training
    assert not custom.training


class _QuantMethodOnClass(nn.Linear):
    quant_method = "on the class"


@pytest.mark.internal
def test_own_attribute_is_getattr_with_none_for_a_missing_name() -> None:
    layer = nn.Linear(2, 2)
    assert own_attribute(layer, "quant_method") is None
    layer.quant_method = "on the instance"  # type: ignore[assignment]
    assert own_attribute(layer, "quant_method") == "on the instance"
    assert own_attribute(_QuantMethodOnClass(2, 2), "quant_method") == "on the class"
    holder = nn.Module()
    holder.quant_method = nn.Identity()  # a registered submodule under that name
    assert own_attribute(holder, "quant_method") is holder.quant_method
    assert own_attribute(layer, "weight") is layer.weight


@pytest.mark.rule("ZC-10")
def test_copies_keep_strides_grad_and_parameter_class() -> None:
    """A copied slot is a fresh Parameter on the load device, with the target's strides and
    its requires_grad (float); a frozen target stays frozen."""
    with torch.device("meta"):
        module = nn.Module()
        module.t = nn.Parameter(torch.empty(3, 2).t())  # non-contiguous target
        module.frozen = nn.Parameter(torch.empty(2), requires_grad=False)
    state = {"t": torch.arange(6.0).reshape(2, 3).double(), "frozen": torch.ones(2).double()}
    load_full_state(module, state.items(), load_device=CPU, kinds=LINEAR_KINDS)
    assert type(module.t) is nn.Parameter
    assert module.t.device == CPU
    assert module.t.stride() == (1, 2)
    assert torch.equal(module.t, state["t"].float())
    assert module.t.requires_grad is True
    assert module.frozen.requires_grad is False


def _layer_param(layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    weight = layer.get_parameter("weight")
    return weight, weight.detach().clone()


@pytest.mark.rule("ZC-4", "ZC-14")
def test_a_layer_without_quant_method_is_refused_by_zc4() -> None:
    layer = ColumnParallelLinear(2, 2)
    del layer.quant_method
    param, tensor = _layer_param(layer)
    verdict = zero_copy_verdict(param, tensor, param, kinds=LINEAR_KINDS)
    assert verdict.reason == "ZC-4: quant method is NoneType, not UnquantizedLinearMethod"


@pytest.mark.rule("ZC-5", "ZC-14")
def test_a_layer_without_tp_size_is_refused_by_zc5() -> None:
    layer = ColumnParallelLinear(2, 2)
    del layer.tp_size
    param, tensor = _layer_param(layer)
    assert zero_copy_verdict(param, tensor, param, kinds=LINEAR_KINDS).reason == (
        "ZC-5: tp_size is None"
    )


@pytest.mark.rule("ZC-3")
def test_kinds_may_name_a_layer_without_weight_loader() -> None:
    kinds = LinearKinds(
        replicated=ReplicatedLinear,
        column_parallel=ColumnParallelLinear,
        row_parallel=nn.Linear,  # no weight_loader at all
        unquantized_method=LINEAR_KINDS.unquantized_method,
    )
    layer = ColumnParallelLinear(2, 2)
    param, tensor = _layer_param(layer)
    assert zero_copy_verdict(param, tensor, param, kinds=kinds).adopt is True


class Fancy(nn.Parameter):
    pass


class Other(nn.Module):
    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor) -> None:
        param.copy_(loaded)


class OtherMethod:
    pass


def _reason(param: torch.Tensor, **attrs: Any) -> str | None:
    param.__dict__.update(attrs)
    return zero_copy_verdict(param, param.detach(), param, kinds=LINEAR_KINDS).reason


@pytest.mark.rule("ZC-14")
def test_reasons_name_the_offending_class() -> None:
    assert _reason(Fancy(torch.ones(2))) == "ZC-2c: parameter type is Fancy, not Parameter"
    assert _reason(nn.Parameter(torch.ones(2)), weight_loader=print) == (
        "ZC-2: weight_loader is a builtin_function_or_method, not a bound method"
    )
    assert _reason(nn.Parameter(torch.ones(2)), weight_loader=Other().weight_loader) == (
        "ZC-3: weight_loader belongs to Other, not a replicated, column- or row-parallel linear"
    )
    layer = ReplicatedLinear(2, 2)
    layer.quant_method = OtherMethod()  # type: ignore[assignment]
    assert _reason(layer.weight) == "ZC-4: quant method is OtherMethod, not UnquantizedLinearMethod"
