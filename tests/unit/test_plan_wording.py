"""PLAN-3: the reference's exact message for each contradictory plan.

Other loaders are judged only on the error type and the names in the message (test_plan.py);
the full sentences, fix included, are the reference's own wording and are pinned here alone.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from reference.errors import PlanError
from reference.request.plan import WeightLoadPlan

ACCEL = torch.device("cuda", 0)
OTHER = torch.device("cuda", 1)


@pytest.mark.rule("PLAN-3")
@pytest.mark.reference_only("pins the reference's own wording of PlanError")
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"checkpoint_load_device": ACCEL, "weight_postprocess_device": OTHER},
            "plan: weight_postprocess_device=cuda:1 differs from checkpoint_load_device=cuda:0;"
            " post-processing must run where the weights were loaded",
        ),
        (
            {"checkpoint_load_device": ACCEL, "defer_cpu_offload": True},
            "plan: defer_cpu_offload=True without a weight_postprocess_device; deferral only"
            " makes sense when weights are processed on the device first",
        ),
        (
            {
                "checkpoint_load_device": ACCEL,
                "weight_postprocess_device": ACCEL,
                "defer_cpu_offload": True,
                "load_full_state_dict_on_device": True,
            },
            "plan: load_full_state_dict_on_device=True with defer_cpu_offload=True; direct mode"
            " needs a resident component, so nothing can be deferred to CPU",
        ),
    ],
    ids=["post-device-differs", "deferral-without-post", "direct-with-deferral"],
)
def test_contradictory_plan_messages(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanError) as caught:
        WeightLoadPlan(**fields)
    assert str(caught.value) == message
