"""The reference's post-load steps one by one (reference.place.postload): buffers, processing, FSDP.

The loader-level rules (FP8-2..5, CKPT-5) are judged for every loader in test_fp8.py and
test_zc_loads.py; these tests call the reference's own step functions, or its `load_dit`, to pin
what those steps do with their arguments, and their exact messages.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from fakes.dit import TinyDiT, write_dit_checkpoint
from fakes.layers import LINEAR_KINDS
from fakes.quant import UnquantizedLinearMethod
from reference.errors import QuantizationLoadError
from reference.load import dit
from reference.place.postload import process_weights
from reference.request.plan import CPU, WeightLoadPlan, effective_plan
from reference.request.quantization import QuantizationSpec

pytestmark = pytest.mark.reference_only("calls the reference's own post-load steps directly")

ACCEL = torch.device("cuda", 0)  # plans are values: no device is touched to build one
FP8 = QuantizationSpec("fp8")


@pytest.mark.rule("FP8-4")
def test_fsdp_drops_a_resident_post_process_device() -> None:
    plan = WeightLoadPlan(checkpoint_load_device=ACCEL, weight_postprocess_device=ACCEL)
    with pytest.warns(UserWarning, match="FSDP inference is on") as seen:
        kept = effective_plan(plan, fsdp=True, component="transformer")
    assert kept == WeightLoadPlan(checkpoint_load_device=ACCEL)
    assert str(seen[0].message) == (
        "transformer: FSDP inference is on, so the weight post-process device override (cuda:0)"
        " and the deferred CPU offload are dropped; FSDP places and offloads the weights itself"
    )


@pytest.mark.rule("FP8-5")
def test_quantization_without_a_quantized_layer_is_worded(tmp_path: Path) -> None:
    path, _ = write_dit_checkpoint(tmp_path)
    with pytest.raises(QuantizationLoadError) as caught:
        dit.load_dit(
            TinyDiT,
            path,
            plan=WeightLoadPlan(checkpoint_load_device=CPU),
            kinds=LINEAR_KINDS,
            quantization=FP8,
        )
    assert str(caught.value) == (
        "transformer: quantization 'fp8' was requested but no layer uses a quantized method;"
        " refusing to return an unquantized model. Build the model with the quantization config"
        " applied to its linear layers"
    )


class Failing:
    """A quant method whose processing fails."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        raise RuntimeError("scale overflow")


@pytest.mark.rule("FP8-5")
def test_a_failed_layer_is_worded() -> None:
    module = nn.Sequential(nn.Linear(2, 2))
    setattr(module[0], "quant_method", Failing())  # noqa: B010
    with pytest.raises(QuantizationLoadError) as caught:
        process_weights(module, quantization=FP8, kinds=LINEAR_KINDS, component="transformer")
    assert str(caught.value) == (
        "transformer: fp8 weight processing failed in layer '0' (scale overflow); no unquantized"
        " fallback is attempted. Fix the checkpoint or drop the quantization request"
    )
    assert isinstance(caught.value.__cause__, RuntimeError)


@pytest.mark.rule("FP8-5")
def test_unquantized_layers_are_processed_and_counted() -> None:
    module = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.ReLU())
    for layer in (module[0], module[1]):
        setattr(layer, "quant_method", UnquantizedLinearMethod())  # noqa: B010
    assert process_weights(module, quantization=None, kinds=LINEAR_KINDS, component="t") == 2
