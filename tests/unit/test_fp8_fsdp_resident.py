"""FP8-4 for a resident component: under FSDP the post-process device is dropped too.

test_fp8.py pins the offloaded case (override and deferral both set); here the plan has a
post-process device and no deferral, which FSDP must drop all the same, with a warning.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest
import torch

from fakes.dit import TinyDiT, write_dit_checkpoint
from fakes.layers import LINEAR_KINDS
from reference.kit.seam import FP8_DEFER, DitRequest, Plan, SeamLoader
from reference.request.quantization import QuantizationSpec

pytestmark = pytest.mark.capability(FP8_DEFER)


@pytest.mark.rule("FP8-4")
def test_fsdp_drops_the_post_process_device_of_a_resident_component(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = QuantizationSpec("fp8")
    path, _ = write_dit_checkpoint(tmp_path)
    # A resident component processed on its device (PLAN-2: no deferral).
    plan = Plan(checkpoint_load_device=runtime_device, weight_postprocess_device=runtime_device)
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module, _ = loader.load_dit(
            DitRequest(
                lambda: TinyDiT(quantization=spec),
                path,
                plan=plan,
                kinds=LINEAR_KINDS,
                quantization=spec,
                fsdp=True,
            )
        )
    seen = [str(w.message) for w in caught] + [
        r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
    ]
    assert any(
        "postprocess" in w.lower().replace("-", "").replace("_", "").replace(" ", "") for w in seen
    ), f"the post-process device was dropped without a warning naming it: {seen}"
    # Judged by what happened, not by the plan the report carries: nothing was deferred.
    load = plan.checkpoint_load_device
    assert all(
        t.device.type == load.type and load.index in (None, t.device.index)
        for t in module.parameters()
    )
