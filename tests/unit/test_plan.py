"""PLAN: the weight-load plan.

Plans are values: devices here are plain values (no device is touched to build a plan), with and
without an index. A refused plan is judged by contract: a ValueError naming the offending field.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from reference.kit.judging.judge import refusal
from reference.kit.seam import PLANS, PlanLike, SeamLoader

pytestmark = pytest.mark.capability(PLANS)

CPU = torch.device("cpu")
ACCEL = torch.device("cuda", 0)
OTHER = torch.device("cuda", 1)  # differs from ACCEL only by its index
FIELDS = (
    "checkpoint_load_device",
    "weight_postprocess_device",
    "defer_cpu_offload",
    "load_full_state_dict_on_device",
)


def fields_of(plan: PlanLike) -> tuple[object, ...]:
    return tuple(getattr(plan, name) for name in FIELDS)


@pytest.mark.rule("PLAN-1")
def test_plan_is_frozen(loader: SeamLoader) -> None:
    plan = loader.plan_for_component(
        checkpoint_load_device=ACCEL,
        needs_device_weight_postprocess=True,
        component_cpu_offload=True,
    )
    before = fields_of(plan)
    assert before == (ACCEL, ACCEL, True, False)
    for field, value in zip(FIELDS, (CPU, None, False, True), strict=True):
        with pytest.raises(AttributeError):
            setattr(plan, field, value)
    assert fields_of(plan) == before


@pytest.mark.rule("PLAN-1")
@pytest.mark.reference_only("checks the reference's own plan class")
def test_plan_is_a_value() -> None:
    from reference.request.plan import WeightLoadPlan

    assert dataclasses.is_dataclass(WeightLoadPlan)
    assert WeightLoadPlan.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert tuple(f.name for f in dataclasses.fields(WeightLoadPlan)) == FIELDS


@pytest.mark.rule("PLAN-2")
@pytest.mark.parametrize("device", [CPU, ACCEL, OTHER, torch.device("cuda")], ids=str)
@pytest.mark.parametrize("needs_post", [False, True])
@pytest.mark.parametrize("offload", [False, True])
def test_for_component_derives_fields(
    loader: SeamLoader, device: torch.device, needs_post: bool, offload: bool
) -> None:
    plan = loader.plan_for_component(
        checkpoint_load_device=device,
        needs_device_weight_postprocess=needs_post,
        component_cpu_offload=offload,
    )
    assert plan.checkpoint_load_device == device
    assert plan.weight_postprocess_device == (device if needs_post else None)
    assert plan.defer_cpu_offload is (needs_post and offload)
    assert plan.load_full_state_dict_on_device is False


@pytest.mark.rule("PLAN-2")
@pytest.mark.parametrize("device", [ACCEL, OTHER, CPU], ids=str)
def test_for_component_passes_direct_flag_through(loader: SeamLoader, device: torch.device) -> None:
    plan = loader.plan_for_component(
        checkpoint_load_device=device,
        needs_device_weight_postprocess=True,
        component_cpu_offload=False,
        load_full_state_dict_on_device=True,
    )
    assert fields_of(plan) == (device, device, False, True)


@pytest.mark.rule("PLAN-2")
def test_for_component_is_keyword_only(loader: SeamLoader) -> None:
    with pytest.raises(TypeError):
        loader.plan_for_component(ACCEL, False, False)  # type: ignore[misc]


def plan_fields(
    load: torch.device,
    post: torch.device | None = None,
    *,
    defer: bool = False,
    direct: bool = False,
) -> dict[str, object]:
    return dict(zip(FIELDS, (load, post, defer, direct), strict=True))


# Each case holds exactly one contradiction; the field named is the one to judge it by.
CONTRADICTIONS = [
    pytest.param(plan_fields(CPU, ACCEL), "weight_postprocess_device", id="post-on-accel-load-cpu"),
    pytest.param(plan_fields(ACCEL, CPU), "weight_postprocess_device", id="post-on-cpu-load-accel"),
    pytest.param(
        plan_fields(ACCEL, OTHER), "weight_postprocess_device", id="post-differs-by-index"
    ),
    pytest.param(
        plan_fields(OTHER, ACCEL, defer=True),
        "weight_postprocess_device",
        id="post-differs-by-index-deferred",
    ),
    pytest.param(plan_fields(ACCEL, defer=True), "defer_cpu_offload", id="defer-without-post"),
    pytest.param(plan_fields(CPU, defer=True), "defer_cpu_offload", id="defer-without-post-cpu"),
    pytest.param(
        plan_fields(CPU, CPU, defer=True, direct=True), "defer_cpu_offload", id="direct-cpu-defer"
    ),
    pytest.param(
        plan_fields(ACCEL, ACCEL, defer=True, direct=True),
        "defer_cpu_offload",
        id="direct-and-defer",
    ),
]


@pytest.mark.rule("PLAN-3")
@pytest.mark.parametrize(("fields", "field"), CONTRADICTIONS)
def test_contradictory_plans_are_refused(
    loader: SeamLoader, fields: dict[str, object], field: str
) -> None:
    refusal(lambda: loader.make_plan(**fields), field)  # type: ignore[arg-type]


@pytest.mark.rule("PLAN-3")
@pytest.mark.reference_only("checks the reference's own error class")
@pytest.mark.parametrize(("fields", "field"), CONTRADICTIONS)
def test_contradictory_plans_raise_plan_error(fields: dict[str, object], field: str) -> None:
    from reference.errors import PlanError
    from reference.request.plan import WeightLoadPlan

    with pytest.raises(PlanError, match=rf"^plan: .*{field}"):
        WeightLoadPlan(**fields)  # type: ignore[arg-type]


@pytest.mark.rule("PLAN-3")
@pytest.mark.parametrize("device", [ACCEL, OTHER], ids=str)
def test_for_component_refuses_direct_with_deferral(
    loader: SeamLoader, device: torch.device
) -> None:
    refusal(
        lambda: loader.plan_for_component(
            checkpoint_load_device=device,
            needs_device_weight_postprocess=True,
            component_cpu_offload=True,
            load_full_state_dict_on_device=True,
        ),
        "defer_cpu_offload",
    )


@pytest.mark.rule("PLAN-3")
@pytest.mark.parametrize(
    "fields",
    [
        plan_fields(ACCEL, ACCEL, defer=True),
        plan_fields(OTHER, OTHER, defer=True),
        plan_fields(CPU, CPU, defer=True),
        plan_fields(CPU, CPU),
        plan_fields(ACCEL, direct=True),
        plan_fields(OTHER, OTHER, direct=True),
        plan_fields(CPU),
        plan_fields(CPU, direct=True),
        plan_fields(torch.device("cpu", 0), direct=True),
        plan_fields(CPU, CPU, direct=True),
    ],
    ids=[
        "defer",
        "defer-other",
        "defer-cpu",
        "post-cpu",
        "direct",
        "direct-post",
        "plain-cpu",
        "direct-on-cpu",
        "direct-on-cpu-0",
        "direct-post-cpu",
    ],
)
def test_consistent_explicit_plans_are_accepted(
    loader: SeamLoader, fields: dict[str, object]
) -> None:
    """A direct plan on the CPU is no contradiction (PLAN-3): it reads into fresh host memory."""
    plan = loader.make_plan(**fields)  # type: ignore[arg-type]
    assert fields_of(plan) == tuple(fields.values())


@pytest.mark.rule("PLAN-4")
@pytest.mark.parametrize("device", [ACCEL, OTHER, torch.device("cuda")], ids=str)
def test_default_plan(
    loader: SeamLoader, runtime_device: torch.device, device: torch.device
) -> None:
    # Accelerators too: in the CPU tier the runtime device is cpu, which a CPU-only default
    # would match.
    for wanted in (runtime_device, device):
        assert fields_of(loader.default_plan(wanted)) == (wanted, None, False, False)
