"""PLAN: the weight-load plan."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from reference.adapter import PLANS, LoaderAdapter

pytestmark = pytest.mark.capability(PLANS)

CPU = torch.device("cpu")
ACCEL = torch.device("cuda", 0)  # plans are values: no device is touched to build one


@pytest.mark.rule("PLAN-1")
def test_plan_is_frozen(loader: LoaderAdapter) -> None:
    plan = loader.plan_for_component(
        checkpoint_load_device=ACCEL,
        needs_device_weight_postprocess=True,
        component_cpu_offload=True,
    )
    for field, value in [
        ("checkpoint_load_device", CPU),
        ("weight_postprocess_device", None),
        ("defer_cpu_offload", False),
        ("load_full_state_dict_on_device", True),
    ]:
        with pytest.raises(AttributeError):
            setattr(plan, field, value)
    assert (plan.checkpoint_load_device, plan.weight_postprocess_device) == (ACCEL, ACCEL)
    assert plan.defer_cpu_offload is True


@pytest.mark.rule("PLAN-1")
def test_plan_is_a_value() -> None:
    from reference.plan import WeightLoadPlan

    assert dataclasses.is_dataclass(WeightLoadPlan)
    assert WeightLoadPlan.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert {f.name for f in dataclasses.fields(WeightLoadPlan)} == {
        "checkpoint_load_device",
        "weight_postprocess_device",
        "defer_cpu_offload",
        "load_full_state_dict_on_device",
    }


@pytest.mark.rule("PLAN-2")
@pytest.mark.parametrize("device", [CPU, ACCEL], ids=str)
@pytest.mark.parametrize("needs_post", [False, True])
@pytest.mark.parametrize("offload", [False, True])
def test_for_component_derives_fields(
    loader: LoaderAdapter, device: torch.device, needs_post: bool, offload: bool
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
def test_for_component_passes_direct_flag_through(loader: LoaderAdapter) -> None:
    plan = loader.plan_for_component(
        checkpoint_load_device=ACCEL,
        needs_device_weight_postprocess=False,
        component_cpu_offload=False,
        load_full_state_dict_on_device=True,
    )
    assert plan.load_full_state_dict_on_device is True
    assert plan.weight_postprocess_device is None
    assert plan.defer_cpu_offload is False


@pytest.mark.rule("PLAN-2")
def test_for_component_is_keyword_only(loader: LoaderAdapter) -> None:
    with pytest.raises(TypeError):
        loader.plan_for_component(ACCEL, False, False)  # type: ignore[misc]


@pytest.mark.rule("PLAN-3")
@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (
            dict(
                checkpoint_load_device=CPU,
                weight_postprocess_device=ACCEL,
                defer_cpu_offload=False,
                load_full_state_dict_on_device=False,
            ),
            "weight_postprocess_device",
        ),
        (
            dict(
                checkpoint_load_device=ACCEL,
                weight_postprocess_device=None,
                defer_cpu_offload=True,
                load_full_state_dict_on_device=False,
            ),
            "defer_cpu_offload",
        ),
        (
            dict(
                checkpoint_load_device=CPU,
                weight_postprocess_device=None,
                defer_cpu_offload=False,
                load_full_state_dict_on_device=True,
            ),
            "load_full_state_dict_on_device",
        ),
        (
            dict(
                checkpoint_load_device=ACCEL,
                weight_postprocess_device=ACCEL,
                defer_cpu_offload=True,
                load_full_state_dict_on_device=True,
            ),
            "defer_cpu_offload",
        ),
    ],
    ids=["postprocess-elsewhere", "defer-without-postprocess", "direct-on-cpu", "direct-and-defer"],
)
def test_contradictory_plans_are_refused(
    loader: LoaderAdapter, fields: dict[str, object], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        loader.make_plan(**fields)  # type: ignore[arg-type]


@pytest.mark.rule("PLAN-3")
def test_for_component_refuses_direct_with_deferral(loader: LoaderAdapter) -> None:
    with pytest.raises(ValueError, match="defer_cpu_offload"):
        loader.plan_for_component(
            checkpoint_load_device=ACCEL,
            needs_device_weight_postprocess=True,
            component_cpu_offload=True,
            load_full_state_dict_on_device=True,
        )


@pytest.mark.rule("PLAN-3")
def test_consistent_explicit_plan_is_accepted(loader: LoaderAdapter) -> None:
    plan = loader.make_plan(
        checkpoint_load_device=ACCEL,
        weight_postprocess_device=ACCEL,
        defer_cpu_offload=True,
        load_full_state_dict_on_device=False,
    )
    assert plan.defer_cpu_offload is True


@pytest.mark.rule("PLAN-4")
def test_default_plan(loader: LoaderAdapter, runtime_device: torch.device) -> None:
    # ACCEL too: in the CPU tier the runtime device is cpu, which a CPU-only default would match.
    for device in (runtime_device, ACCEL):
        plan = loader.default_plan(device)
        assert plan.checkpoint_load_device == device
        assert plan.weight_postprocess_device is None
        assert plan.defer_cpu_offload is False
        assert plan.load_full_state_dict_on_device is False
