"""The reference's post-load steps one by one (reference.postload): buffers, processing, FSDP.

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
from reference import dit
from reference.errors import QuantizationLoadError, StateMismatchError
from reference.plan import CPU, WeightLoadPlan
from reference.postload import effective_plan, process_weights, rebuild_non_persistent_buffers
from reference.quantization import QuantizationSpec

pytestmark = pytest.mark.reference_only("calls the reference's own post-load steps directly")

ACCEL = torch.device("cuda", 0)  # plans are values: no device is touched to build one
FP8 = QuantizationSpec("fp8")


class Hooked(nn.Module):
    """A leaf whose non-persistent buffer its own hook recomputes, recording the device asked."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(4.0), persistent=False)
        self.asked: list[torch.device] = []

    def init_non_persistent_buffers(self, device: torch.device) -> None:
        self.asked.append(device)
        self.table = torch.arange(4.0, device=device)


class Bare(nn.Module):
    """A leaf with a non-persistent buffer and no hook."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(4.0), persistent=False)


class Outer(nn.Module):
    inner: nn.Sequential

    def __init__(self, leaf: type[nn.Module]) -> None:
        super().__init__()
        self.inner = nn.Sequential(leaf())


def built_on_meta(leaf: type[nn.Module]) -> Outer:
    with torch.device("meta"):
        return Outer(leaf)


@pytest.mark.rule("CKPT-5")
def test_each_hook_gets_the_load_device() -> None:
    module = built_on_meta(Hooked)
    rebuild_non_persistent_buffers(module, CPU, component="transformer")
    leaf = module.inner[0]
    assert isinstance(leaf, Hooked)
    assert leaf.asked == [CPU]
    assert torch.equal(leaf.table, torch.arange(4.0))


@pytest.mark.rule("CKPT-5")
def test_buffers_left_on_meta_are_refused_by_full_name() -> None:
    module = built_on_meta(Bare)
    with pytest.raises(StateMismatchError) as caught:
        rebuild_non_persistent_buffers(module, CPU, component="transformer")
    assert str(caught.value) == (
        "transformer: buffer(s) inner.0.table are still on meta after loading; they are not in"
        " the checkpoint, so give their module an init_non_persistent_buffers(device) method"
        " that recomputes them"
    )


@pytest.mark.rule("CKPT-5")
def test_several_buffers_left_on_meta_are_all_named() -> None:
    with torch.device("meta"):
        module = nn.Sequential(Bare(), Bare())
    with pytest.raises(StateMismatchError, match=r"buffer\(s\) 0\.table, 1\.table are still"):
        rebuild_non_persistent_buffers(module, CPU, component="vae")


@pytest.mark.rule("CKPT-5")
def test_a_root_buffer_is_named_without_a_prefix() -> None:
    with torch.device("meta"):
        module = Bare()
    with pytest.raises(StateMismatchError, match=r"buffer\(s\) table are still on meta"):
        rebuild_non_persistent_buffers(module, CPU, component="vae")


@pytest.mark.rule("CKPT-5")
def test_a_meta_target_is_not_checked() -> None:
    """Loading onto `meta` itself (a dry run) leaves meta buffers where they belong."""
    module = built_on_meta(Bare)
    rebuild_non_persistent_buffers(module, torch.device("meta"), component="transformer")
    assert getattr(module.inner[0], "table").is_meta  # noqa: B009


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
