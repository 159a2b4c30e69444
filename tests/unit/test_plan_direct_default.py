"""PLAN-2: the reference's own `WeightLoadPlan.for_component` leaves direct mode off by default.

The adapter always passes the direct flag explicitly, so only a direct call reaches the
classmethod's own default; that makes this a check of the reference's code alone.
"""

from __future__ import annotations

import pytest
import torch

from reference.request.plan import WeightLoadPlan

ACCEL = torch.device("cuda", 0)  # plans are values: no device is touched to build one


@pytest.mark.rule("PLAN-2")
@pytest.mark.reference_only("calls reference.request.plan.WeightLoadPlan.for_component directly")
def test_for_component_defaults_to_no_direct_mode() -> None:
    plan = WeightLoadPlan.for_component(
        checkpoint_load_device=ACCEL,
        needs_device_weight_postprocess=False,
        component_cpu_offload=False,
    )
    assert plan.load_full_state_dict_on_device is False
