"""ZC-1..8, ZC-2b, ZC-2c, DG-5: the zero-copy truth table, asked and loaded.

Every row is one load that differs from an adopting load in exactly one condition. It is judged
twice: by the loader's predicate (`zero_copy_verdict`: only `adopt` is judged) and by a real
`load_full_state`, from the outcome: *adopted* means the parameter is the very tensor handed to
the loader (same memory; that it comes back with requires_grad False, though the module was
built with requires_grad True, is ZC-9's to judge, in tests of its own); *copied* means a fresh
allocation holding the handed values (converted to the parameter's dtype). Only the ZC-14
tests read the report's reasons.

A parameter with a `weight_loader` (the serving stack's linears) is judged by ZC-1..8; one
without (`torch.nn.Linear`, the "plain" base) by ZC-2b and ZC-2c only: its rows count toward
those two rules, never toward ZC-1..8 (SPEC, ZC).

Rows run in ordinary mode (tensors on CPU, ZC-1) and in direct mode (tensors on the load device,
DG-5; ZC-2..8 unchanged). The direct device is the runtime device: `cpu` in the CPU tier, where
direct loads read into fresh host memory (PLAN-3). Rows that need a tensor on a second device
(off the CPU, or off the load device) need CUDA and run in the GPU tier.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import MethodType

import pytest
import torch
from torch import nn

from fakes.layers import (
    LINEAR_KINDS,
    ColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    default_weight_loader,
)
from fakes.quant import OnlineFp8LinearMethod
from reference.kit.judging.judge import loaded_or_skip
from reference.kit.seam import DIRECT_DIT, ZERO_COPY, Plan, PlanLike, SeamLoader, StateRequest
from reference.report.summary import LoadReport

pytestmark = pytest.mark.capability(ZERO_COPY)

CPU = torch.device("cpu")
IN, OUT = 4, 6
LAYERS: dict[str, type[nn.Module]] = {
    "replicated": ReplicatedLinear,
    "column": ColumnParallelLinear,
    "row": RowParallelLinear,
}
PARALLEL = ("column", "row")
PLAIN = "plain"  # torch.nn.Linear: its parameter has no weight_loader (ZC-2b)
BASES = (*LAYERS, PLAIN)
FLAGS = ("is_metadata", "is_sharded_weight", "needs_scalar_to_array")


@pytest.fixture
def direct_device(runtime_device: torch.device) -> torch.device:
    """Where direct mode loads: the runtime device."""
    return runtime_device


def needs_a_second_device(device: torch.device, what: str) -> None:
    """Skip in the CPU tier: `what` needs a tensor on a real device besides the CPU, and the CPU
    tier has none (SPEC, "Real inputs": `meta` is no stand-in); the GPU tier runs it."""
    if device.type == "cpu":
        pytest.skip(f"{what} needs a CUDA tensor beside the CPU: the gpu tier runs this case")


# --- one load: a one-layer module built on meta and the tensor handed for its weight ------------


class Holder(nn.Module):
    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer


@dataclass
class Probe:
    """One zero-copy question: a module holding one layer, and the tensor for `layer.weight`."""

    module: Holder
    tensor: torch.Tensor

    @property
    def layer(self) -> nn.Module:
        return self.module.layer

    @property
    def param(self) -> torch.Tensor:
        weight: torch.Tensor = self.module.layer.weight
        return weight

    def replace_layer(self, layer: nn.Module) -> None:
        self.module.layer = layer
        layer.requires_grad_(True)

    def install(self, param: nn.Parameter) -> None:
        """Make `param` the layer's weight, with the old weight's attributes."""
        param.__dict__.update(self.param.__dict__)
        self.layer._parameters["weight"] = param


def checkpoint_values(shape: tuple[int, ...] = (OUT, IN)) -> torch.Tensor:
    """Values no construction gives (so equal values after a load are the loader's doing)."""
    return torch.arange(1, 1 + torch.Size(shape).numel(), dtype=torch.float32).reshape(shape) / 8


def make_layer(base: str, **options: object) -> nn.Module:
    with torch.device("meta"):
        if base == PLAIN:
            return nn.Linear(IN, OUT, bias=False, **options)  # type: ignore[arg-type]
        return LAYERS[base](IN, OUT, bias=False, **options)


def probe(base: str, device: torch.device) -> Probe:
    module = Holder(make_layer(base))
    module.requires_grad_(True)  # adoption must turn it off (ZC-9)
    return Probe(module, checkpoint_values().to(device))


# --- the rows: each changes one condition -------------------------------------------------------


class Foreign(nn.Module):
    """Not a linear layer, but it has a bound weight_loader of the same name."""

    tp_rank, tp_size = 0, 1

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor) -> None:
        param.data.copy_(loaded)


class UserLoaderMixin:
    """A user's base class whose weight_loader overrides the standard layer's (it comes first)."""

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor) -> None:
        param.data.copy_(loaded)


class SubParameter(nn.Parameter):
    """A parameter subclass (stacks use them for packed or scaled weights)."""


def subclass_layer(p: Probe, *, override: bool, levels: int = 1) -> None:
    """Replace the layer by an instance of a subclass `levels` deep that overrides weight_loader
    at the deepest level, or never."""
    cls = type(p.layer)

    def weight_loader(self: nn.Module, param: torch.Tensor, loaded: torch.Tensor) -> None:
        param.data.copy_(loaded)

    for level in range(levels):
        body = {"weight_loader": weight_loader} if override and level == levels - 1 else {}
        cls = type(f"Sub{level}{cls.__name__}", (cls,), body)
    with torch.device("meta"):
        p.replace_layer(cls(IN, OUT, bias=False))


def mixin_override(p: Probe) -> None:
    cls = type(f"Mixed{type(p.layer).__name__}", (UserLoaderMixin, type(p.layer)), {})
    with torch.device("meta"):
        p.replace_layer(cls(IN, OUT, bias=False))


def no_loader(p: Probe) -> None:
    del p.param.weight_loader


def plain_function(p: Probe) -> None:
    p.param.weight_loader = default_weight_loader  # type: ignore[attr-defined]


def lambda_loader(p: Probe) -> None:
    p.param.weight_loader = lambda param, loaded: param.data.copy_(loaded)  # type: ignore[attr-defined]


def partial_loader(p: Probe) -> None:
    # the standard function and the standard owner, but not a bound method
    p.param.weight_loader = functools.partial(type(p.layer).weight_loader, p.layer)  # type: ignore[attr-defined]


def foreign_owner(p: Probe) -> None:
    # the standard function itself, bound to an owner that is not a linear layer
    p.param.weight_loader = MethodType(type(p.layer).weight_loader, Foreign())  # type: ignore[attr-defined]


def foreign_function(p: Probe) -> None:
    # the standard owner, bound to a function of the same name from another class
    p.param.weight_loader = MethodType(Foreign.weight_loader, p.layer)  # type: ignore[attr-defined]


def quantized_owner(p: Probe) -> None:
    p.layer.quant_method = OnlineFp8LinearMethod()


def tp_size(size: int) -> Callable[[Probe], None]:
    def set_size(p: Probe) -> None:
        p.layer.tp_size = size  # set after construction: the predicate must read it at call time

    return set_size


def built_for_tp2_then_tp1(p: Probe) -> None:
    """A layer built as rank 0 of 2, whose tp_size then reads 1: its (shard-shaped) weight is
    adopted, as the predicate reads tp_size at call time."""
    with torch.device("meta"):
        p.replace_layer(type(p.layer)(IN, OUT, bias=False, tp_size=2))
    p.layer.tp_size = 1
    p.tensor = checkpoint_values(tuple(p.param.shape)).to(p.tensor.device)


def parameter_subclass(p: Probe) -> None:
    p.install(SubParameter(torch.empty(OUT, IN, device="meta")))


def flag(name: str, value: object) -> Callable[[Probe], None]:
    def set_flag(p: Probe) -> None:
        setattr(p.param, name, value)

    return set_flag


def dtypes(param: torch.dtype, tensor: torch.dtype) -> Callable[[Probe], None]:
    """The parameter in `param` dtype, the checkpoint tensor in `tensor` dtype."""

    def retype(p: Probe) -> None:
        if param != p.param.dtype:
            p.install(nn.Parameter(torch.empty(OUT, IN, dtype=param, device="meta")))
        p.tensor = checkpoint_values().to(tensor).to(p.tensor.device)

    return retype


def strided_tensor(p: Probe) -> None:
    """A transposed (non-contiguous) tensor; the parameter is contiguous."""
    p.tensor = checkpoint_values((IN, OUT)).to(p.tensor.device).t()


def strided_target(p: Probe) -> None:
    """A transposed (non-contiguous) parameter; the tensor is contiguous."""
    p.install(nn.Parameter(torch.empty(IN, OUT, device="meta").t()))


def both_strided_unequal(p: Probe) -> None:
    """Both non-contiguous, with different strides: (1, OUT) against (2 * IN, 2)."""
    strided_target(p)
    p.tensor = checkpoint_values((OUT, 2 * IN)).to(p.tensor.device)[:, ::2]


def both_strided_equal(p: Probe) -> None:
    """Both non-contiguous, with equal strides: adopted as they are."""
    strided_target(p)
    strided_tensor(p)


def other_shape(p: Probe) -> None:
    p.tensor = checkpoint_values((OUT, IN - 1)).to(p.tensor.device)


def other_layout(p: Probe) -> None:
    with warnings.catch_warnings():  # sparse CSR support is marked beta
        warnings.simplefilter("ignore", UserWarning)
        p.tensor = checkpoint_values().to_sparse_csr().to(p.tensor.device)  # it has no strides


@dataclass(frozen=True)
class Row:
    """One row of the truth table: what changes, the rule it touches, the answer, which layers.

    `plain_rule` is the rule the row pins for a parameter without weight_loader: ZC-2b (it takes
    the tensor, converted where the dtype differs) or ZC-2c (adopted only as an exact Parameter
    with no flag and the same layout and strides).
    """

    rule: str
    what: str
    change: Callable[[Probe], None]
    adopt: bool
    bases: tuple[str, ...] = tuple(LAYERS)
    loadable: bool = True  # False: a load cannot take it (it raises instead: ZC-10)
    plain_rule: str = "ZC-2c"

    def rule_for(self, base: str) -> str:
        return self.plain_rule if base == PLAIN else self.rule


TRUTHY = (True, 1, "yes")
FALSY = (False, 0, None, "")
ROWS: list[Row] = [
    Row("ZC-2b", "no-weight-loader", no_loader, True),
    Row("ZC-2", "plain-function-loader", plain_function, False),
    Row("ZC-2", "lambda-loader", lambda_loader, False),
    Row("ZC-2", "partial-of-the-standard-loader", partial_loader, False),
    Row("ZC-3", "owner-not-a-linear", foreign_owner, False),
    Row("ZC-3", "standard-owner-foreign-function", foreign_function, False),
    Row("ZC-3", "subclass-overrides", functools.partial(subclass_layer, override=True), False),
    Row(
        "ZC-3",
        "subclass-overrides-3-levels-down",
        functools.partial(subclass_layer, override=True, levels=3),
        False,
    ),
    Row("ZC-3", "user-mixin-overrides", mixin_override, False),
    Row("ZC-3", "subclass-inherits", functools.partial(subclass_layer, override=False), True),
    Row(
        "ZC-3",
        "subclass-3-levels-inherits",
        functools.partial(subclass_layer, override=False, levels=3),
        True,
    ),
    Row("ZC-4", "quantized-method", quantized_owner, False),
    Row("ZC-5", "tp-size-2-after-construction", tp_size(2), False, PARALLEL),
    Row("ZC-5", "built-tp2-then-tp-size-1", built_for_tp2_then_tp1, True, PARALLEL),
    Row("ZC-5", "replicated-has-no-tp-size", tp_size(2), True, ("replicated",)),
    Row("ZC-6", "parameter-subclass", parameter_subclass, False, BASES),
    *(
        Row("ZC-7", f"{name}={value!r}", flag(name, value), False, BASES)
        for name in FLAGS
        for value in TRUTHY
    ),
    *(
        Row("ZC-7", f"{name}={value!r}", flag(name, value), True, BASES)
        for name in FLAGS
        for value in FALSY
    ),
    Row("ZC-8", "shape", other_shape, False, BASES, loadable=False, plain_rule="ZC-2b"),
    Row("ZC-8", "layout", other_layout, False, BASES, loadable=False),
    *(
        Row(
            "ZC-8",
            f"{str(param).removeprefix('torch.')}-param-{str(tensor).removeprefix('torch.')}-tensor",
            dtypes(param, tensor),
            param == tensor,
            BASES,
            plain_rule="ZC-2b",
        )
        for param, tensor in (
            (torch.float32, torch.bfloat16),
            (torch.bfloat16, torch.float16),
            (torch.float32, torch.int32),
            (torch.bfloat16, torch.bfloat16),
        )
    ),
    Row("ZC-8", "strided-tensor", strided_tensor, False, BASES),
    Row("ZC-8", "strided-target", strided_target, False, BASES),
    Row("ZC-8", "both-strided-unequal", both_strided_unequal, False, BASES),
    Row("ZC-8", "both-strided-equal", both_strided_equal, True, BASES),
]
ADOPT_RULES = ("ZC-1", "ZC-2", "ZC-3", "ZC-4", "ZC-5", "ZC-6", "ZC-7", "ZC-8")
DIRECT = [pytest.mark.capability(DIRECT_DIT)]


def rules_of(base: str, row: Row | None, mode: str) -> tuple[str, ...]:
    """The rules a row pins. In direct mode ZC-1 gives way to DG-5 and ZC-2..8 are DG-5's own
    conditions: there, a tensor that meets them all and is not adopted breaks DG-5 alone. A
    plain parameter's rows (a plain layer's, or a standard layer's parameter without its
    weight_loader) pin ZC-2b / ZC-2c alone, in either mode (ZC-2b: "in any mode")."""
    adopt = row is None or row.adopt
    if base == PLAIN or (row is not None and row.rule == "ZC-2b"):  # no weight_loader: plain
        return ("ZC-2b",) if adopt else (row.rule_for(base),)  # type: ignore[union-attr]
    if mode == "direct":
        return ("DG-5",) if adopt else (row.rule, "DG-5")  # type: ignore[union-attr]
    if row is None:
        return ADOPT_RULES
    return (row.rule,)


def table(*, loads: bool) -> list[object]:
    """(base, row, mode) for every row of the table, each marked with the rules it pins."""
    cases: list[tuple[str, Row | None, str]] = [
        (base, row, mode)
        for row in ROWS
        for base in row.bases
        if row.loadable or not loads
        for mode in ("ordinary", "direct")
    ]
    cases += [(base, None, mode) for base in BASES for mode in ("ordinary", "direct")]
    return [
        pytest.param(
            base,
            row,
            mode,
            id=f"{base}-{row.what if row else 'all-hold'}-{mode}",
            marks=[
                pytest.mark.rule(*rules_of(base, row, mode)),
                *(DIRECT if mode == "direct" else []),
            ],
        )
        for base, row, mode in cases
    ]


def home(mode: str, direct_device: torch.device) -> torch.device:
    return direct_device if mode == "direct" else CPU


def plan_for(device: torch.device, *, direct: bool) -> PlanLike:
    return Plan(checkpoint_load_device=device, load_full_state_dict_on_device=direct)


def build(base: str, row: Row | None, device: torch.device) -> tuple[Probe, bool]:
    p = probe(base, device)
    if row is not None:
        row.change(p)
    return p, row is None or row.adopt


# --- judged by the predicate (only `adopt`) -----------------------------------------------------


def verdict(loader: SeamLoader, p: Probe, direct_device: torch.device | None) -> bool:
    answer = loader.zero_copy_verdict(
        p.param, p.tensor, p.param, kinds=LINEAR_KINDS, direct_device=direct_device
    )
    return answer.adopt


@pytest.mark.parametrize(("base", "row", "mode"), table(loads=False))
def test_the_predicate_answers_each_row(
    loader: SeamLoader, direct_device: torch.device, base: str, row: Row | None, mode: str
) -> None:
    p, adopt = build(base, row, home(mode, direct_device))
    assert verdict(loader, p, direct_device if mode == "direct" else None) is adopt


@pytest.mark.rule("ZC-1")
@pytest.mark.parametrize("base", tuple(LAYERS))
def test_the_predicate_refuses_a_tensor_off_cpu(
    loader: SeamLoader, direct_device: torch.device, base: str
) -> None:
    needs_a_second_device(direct_device, "a checkpoint tensor off the CPU")
    assert verdict(loader, probe(base, direct_device), None) is False


@pytest.mark.rule("DG-5")
@pytest.mark.capability(DIRECT_DIT)
@pytest.mark.parametrize("base", tuple(LAYERS))
def test_the_direct_predicate_refuses_a_tensor_off_the_load_device(
    loader: SeamLoader, direct_device: torch.device, base: str
) -> None:
    needs_a_second_device(direct_device, "a checkpoint tensor off the load device")
    assert verdict(loader, probe(base, CPU), direct_device) is False


@pytest.mark.rule("ZC-2b")
@pytest.mark.capability(DIRECT_DIT)
def test_a_plain_parameter_is_converted_onto_the_load_device_in_direct_mode(
    loader: SeamLoader, direct_device: torch.device
) -> None:
    """ZC-2b: a tensor on another device than the load device is not taken as is."""
    needs_a_second_device(direct_device, "a checkpoint tensor off the load device")
    assert verdict(loader, probe(PLAIN, CPU), direct_device) is False


@pytest.mark.rule("ZC-5")
def test_tp_size_is_read_at_each_call(loader: SeamLoader) -> None:
    p = probe("column", CPU)
    answers = []
    for size in (1, 2, 1):
        tp_size(size)(p)
        answers.append(verdict(loader, p, None))
    assert answers == [True, False, True]


# --- judged by loading ---------------------------------------------------------------------------


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` is `b`'s memory: same device and address."""
    return a.device == b.device and a.data_ptr() == b.data_ptr()


def assert_adopted(param: torch.Tensor, handed: torch.Tensor) -> None:
    assert same_memory(param, handed), (
        "expected the tensor adopted (the parameter is the handed tensor's memory); the loader"
        " gave the parameter other memory (a copy)"
    )


def assert_copied(param: torch.Tensor, handed: torch.Tensor, dtype: torch.dtype) -> None:
    """A fresh allocation of the slot's dtype holding the handed values."""
    assert param.untyped_storage().data_ptr() != handed.untyped_storage().data_ptr(), (
        "expected a copy (fresh memory); the loader adopted the handed tensor as is"
    )
    assert param.dtype == dtype, f"expected the copy in the slot's {dtype}, got {param.dtype}"
    assert torch.equal(param.detach().cpu(), handed.to(dtype).cpu()), (
        "the copy does not hold the checkpoint's values converted to the slot's dtype"
    )


def load(loader: SeamLoader, p: Probe, plan: PlanLike) -> LoadReport:
    """Load `p`; its report (only the ZC-14 tests read it)."""
    return loader.load_full_state(
        StateRequest(p.module, [("layer.weight", p.tensor)], plan=plan, kinds=LINEAR_KINDS)
    )


def assert_copy_reported_as(report: LoadReport, rule: str) -> None:
    """The copy of `layer.weight` is reported with `rule` as its first failing condition; a
    load that adopted it instead reports no refusal (the row's own rule judges that)."""
    (record,) = [r for r in report.records if r.name == "layer.weight"]
    if record.how != "copied":
        pytest.skip(f"the loader did not copy the tensor: no refusal to report ({rule} judges it)")
    assert (record.reason or "").startswith(f"{rule}: "), record


@pytest.mark.parametrize(("base", "row", "mode"), table(loads=True))
def test_loading_each_row_adopts_or_copies(
    loader: SeamLoader, direct_device: torch.device, base: str, row: Row | None, mode: str
) -> None:
    device = home(mode, direct_device)
    p, adopt = build(base, row, device)
    dtype = p.param.dtype
    load(loader, p, plan_for(device, direct=mode == "direct"))
    if adopt:
        assert_adopted(p.param, p.tensor)
    else:
        assert_copied(p.param, p.tensor, dtype)


@pytest.mark.rule("ZC-1")
@pytest.mark.parametrize("base", tuple(LAYERS))
def test_loading_a_tensor_off_cpu_copies_it(
    loader: SeamLoader, direct_device: torch.device, base: str
) -> None:
    """An ordinary (not direct) plan that loads on a non-CPU device: a parameter with a
    weight_loader is copied there (ZC-1)."""
    needs_a_second_device(direct_device, "a checkpoint tensor off the CPU")
    p = probe(base, direct_device)
    load(loader, p, plan_for(direct_device, direct=False))
    assert_copied(p.param, p.tensor, torch.float32)


@pytest.mark.rule("ZC-2b")
def test_a_plain_parameter_takes_a_tensor_on_its_load_device_as_is(
    loader: SeamLoader, direct_device: torch.device
) -> None:
    """An ordinary plan that loads on a non-CPU device: a parameter without weight_loader takes
    its tensor as is there, in any mode (ZC-2b)."""
    needs_a_second_device(direct_device, "a checkpoint tensor off the CPU")
    p = probe(PLAIN, direct_device)
    load(loader, p, plan_for(direct_device, direct=False))
    assert_adopted(p.param, p.tensor)


def indexed(device: torch.device) -> torch.device:
    return torch.device(device.type, 0)


@pytest.mark.parametrize(
    ("base", "mode"),
    [
        pytest.param(
            base,
            mode,
            id=f"{base}-{mode}",
            marks=[
                pytest.mark.rule(
                    "ZC-2b" if base == PLAIN else "DG-5" if mode == "direct" else "ZC-1"
                ),
                *(DIRECT if mode == "direct" else []),
            ],
        )
        for base in BASES
        for mode in ("ordinary", "direct")
    ],
)
@pytest.mark.parametrize("plan_index", [False, True], ids=["plan-device", "plan-device-index-0"])
def test_a_device_with_or_without_its_index_is_the_same_device(
    loader: SeamLoader,
    direct_device: torch.device,
    *,
    base: str,
    mode: str,
    plan_index: bool,
) -> None:
    """cpu and cpu:0 (cuda and cuda:0) are one device: tensors there are adopted either way."""
    device = home(mode, direct_device)
    tensor_device = indexed(device) if device.type == "cuda" else device
    p = probe(base, tensor_device)
    plan_device = indexed(device) if plan_index else torch.device(device.type)
    load(loader, p, plan_for(plan_device, direct=mode == "direct"))
    assert_adopted(p.param, p.tensor)


# --- the report's reasons (ZC-14) ----------------------------------------------------------------


@pytest.mark.rule("ZC-14")
@pytest.mark.parametrize(
    ("base", "row"),
    [
        pytest.param(base, row, id=f"{base}-{row.what}")
        for row in ROWS
        for base in row.bases
        if row.loadable and not row.adopt
    ],
)
def test_each_copy_is_reported_with_its_first_failing_condition(
    loader: SeamLoader, base: str, row: Row
) -> None:
    p, _ = build(base, row, CPU)
    rule = row.rule_for(base)
    report = loaded_or_skip(lambda: load(loader, p, plan_for(CPU, direct=False)), judged_by=rule)
    assert_copy_reported_as(report, rule)


@pytest.mark.rule("ZC-14")
def test_a_copy_off_cpu_is_reported_as_zc1(loader: SeamLoader, direct_device: torch.device) -> None:
    needs_a_second_device(direct_device, "a checkpoint tensor off the CPU")
    plan = plan_for(direct_device, direct=False)
    assert_copy_reported_as(load(loader, probe("column", direct_device), plan), "ZC-1")


# --- the reference's own reasons ----------------------------------------------------------------


@pytest.mark.rule("ZC-14")
@pytest.mark.reference_only("the reference's reason strings")
def test_reference_reasons_name_the_condition(
    loader: SeamLoader, direct_device: torch.device
) -> None:
    def reason(p: Probe, direct: torch.device | None = None) -> str | None:
        return loader.zero_copy_verdict(
            p.param, p.tensor, p.param, kinds=LINEAR_KINDS, direct_device=direct
        ).reason

    meta = torch.device("meta")  # a device the predicate can name without owning one
    off = probe("column", meta)
    assert reason(off) == "ZC-1: checkpoint tensor is on meta, not cpu"
    assert (reason(probe("column", CPU), meta) or "").startswith(
        "DG-5: checkpoint tensor is on cpu"
    )
    p = probe("column", CPU)
    tp_size(2)(p)
    assert reason(p) == "ZC-5: tp_size is 2"
    p = probe("column", CPU)
    flag("is_metadata", "yes")(p)
    assert reason(p) == "ZC-7: parameter flag is_metadata is set"
    p = probe(PLAIN, CPU)
    flag("is_metadata", "yes")(p)
    assert reason(p) == "ZC-2c: parameter flag is_metadata is set"
    assert reason(probe(PLAIN, CPU)) is None
