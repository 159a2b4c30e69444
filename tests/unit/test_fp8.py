"""FP8: online quantization and deferred CPU offload."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from pytest_mock import MockerFixture

from fakes.checkpoints import write_checkpoint
from fakes.dit import TinyDiT, dit_state, write_dit_checkpoint
from fakes.layers import LINEAR_KINDS, ColumnParallelLinear
from fakes.quant import (
    LinearMethod,
    OnlineFp8LinearMethod,
    OnlineMxfp4LinearMethod,
    SerializedFp8LinearMethod,
    UnquantizedLinearMethod,
    quant_method_factory,
)
from reference.errors import QuantizationLoadError
from reference.kit.judging.judge import refusal
from reference.kit.seam import (
    FP8_DEFER,
    PLANS,
    DitRequest,
    OffloadOptions,
    Plan,
    PlanLike,
    SeamLoader,
)
from reference.request.quantization import QuantizationSpec


@pytest.mark.rule("FP8-1")
@pytest.mark.capability(PLANS)
@pytest.mark.parametrize(
    ("quantization", "expected"),
    [
        (QuantizationSpec("fp8"), True),
        (QuantizationSpec("mxfp4"), True),
        (QuantizationSpec("fp8", serialized=True), False),
        (QuantizationSpec("mxfp4", serialized=True), False),
        (None, False),
    ],
    ids=str,
)
def test_requires_device_weight_processing(
    loader: SeamLoader, quantization: QuantizationSpec | None, expected: bool
) -> None:
    """Online fp8/mxfp4 need the device; None and plain serialized checkpoints do not. Serialized
    modelopt_fp8 and methods upstream's registry does not hold (gguf is read from its files, not
    registered) are left free: upstream answers True / raises."""
    assert loader.requires_device_weight_processing(quantization) is expected


@pytest.mark.rule("FP8-1")
@pytest.mark.reference_only("the reference's answers where the rule leaves the choice free")
@pytest.mark.parametrize(
    "quantization",
    [
        QuantizationSpec("FP8", serialized=True),
        QuantizationSpec("modelopt_fp8", serialized=True),
        QuantizationSpec("gguf"),
        QuantizationSpec("awq"),
    ],
    ids=str,
)
def test_reference_answers_false_for_other_methods(quantization: QuantizationSpec) -> None:
    from reference.request.quantization import requires_device_weight_processing

    assert requires_device_weight_processing(quantization) is False
    assert requires_device_weight_processing(QuantizationSpec("FP8")) is True


@pytest.mark.rule("FP8-1")
@pytest.mark.reference_only("checks the reference's own QuantizationSpec")
def test_quantization_spec_needs_a_method() -> None:
    with pytest.raises(ValueError, match="method"):
        QuantizationSpec("")


# --- FP8-2..6: processing on the device, deferred offload, no fallback ---------------------------

ONLINE = [
    pytest.param(QuantizationSpec("fp8"), OnlineFp8LinearMethod, id="fp8"),
    pytest.param(QuantizationSpec("mxfp4"), OnlineMxfp4LinearMethod, id="mxfp4"),
]
QUANTIZED_LAYERS = 4 * 2  # qkv, proj, mlp_up, mlp_down in each of the 2 blocks


@contextmanager
def warned(caplog: pytest.LogCaptureFixture) -> Iterator[list[str]]:
    """Warnings issued meanwhile, as Python warnings or as WARNING log records (upstream logs)."""
    seen: list[str] = []
    caplog.clear()
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield seen
    seen.extend(str(w.message) for w in caught)
    seen.extend(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


def is_on(device: torch.device, wanted: torch.device) -> bool:
    return device.type == wanted.type and wanted.index in (None, device.index)


def quantized_offload_plan(
    loader: SeamLoader, runtime_device: torch.device, spec: QuantizationSpec
) -> PlanLike:
    """The plan of a CPU-offloaded component under online `spec`: it loads and is processed on
    the runtime device (DEV-2, FP8-1), and its offload waits (PLAN-2). The plan rules are the
    `plans` capability's own tests; this is the plan they pin, as the suite's value."""
    del loader, spec
    return Plan(
        checkpoint_load_device=runtime_device,
        weight_postprocess_device=runtime_device,
        defer_cpu_offload=True,
    )


def names_the_override(warning: str) -> bool:
    """Whether a warning names the post-process device override (FP8-4)."""
    text = warning.lower().replace("-", "").replace("_", "").replace(" ", "")
    return "postprocess" in text


@dataclass
class Timeline:
    """What the spies saw, in order, and each layer's weights right after its processing."""

    events: list[tuple[object, ...]] = field(default_factory=list)
    processed: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a loader that really shards under FSDP hands its layers DTensors."""
    full = getattr(tensor, "full_tensor", None)
    return full() if callable(full) else tensor


def watch(
    mocker: MockerFixture, method: type[LinearMethod], state: dict[str, torch.Tensor]
) -> Timeline:
    """Spy on the fake's weight processing and on the move of the TinyDiT."""
    timeline = Timeline()
    real_process, real_apply = method.process_weights_after_loading, TinyDiT._apply

    def process(self: LinearMethod, layer: torch.nn.Module) -> None:
        weight = whole(layer.weight.detach())
        loaded = any(
            torch.equal(weight.cpu(), t) for t in state.values() if t.shape == weight.shape
        )
        timeline.events.append(("process", weight.device, loaded))
        real_process(self, layer)  # type: ignore[arg-type]
        timeline.processed[id(layer)] = (
            whole(layer.weight.detach()).cpu().clone(),
            whole(layer.weight_scale.detach()).cpu().clone(),
        )

    def move(module: TinyDiT, fn: object, recurse: bool = True) -> TinyDiT:
        # Only a move that changes where a tensor sits is an event (FP8-2): moving the module
        # to the device it is already on changes nothing.
        dtypes = {block.qkv.weight.dtype for block in module.blocks}  # type: ignore[union-attr]
        before = [t.device for t in [*module.parameters(), *module.buffers()]]
        result = real_apply(module, fn, recurse)  # type: ignore[arg-type]
        after = [t.device for t in [*module.parameters(), *module.buffers()]]
        if before != after:
            timeline.events.append(("move", dtypes))
        return result

    mocker.patch.object(method, "process_weights_after_loading", autospec=True, side_effect=process)
    mocker.patch.object(TinyDiT, "_apply", autospec=True, side_effect=move)
    return timeline


@pytest.mark.rule("FP8-2", "FP8-3")
@pytest.mark.capability(FP8_DEFER)
@pytest.mark.parametrize(("spec", "method"), ONLINE)
def test_offloaded_online_quantized_dit_loads_processes_then_offloads(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    *,
    mocker: MockerFixture,
    spec: QuantizationSpec,
    method: type[LinearMethod],
) -> None:
    path, state = write_dit_checkpoint(tmp_path)
    plan = quantized_offload_plan(loader, runtime_device, spec)
    assert plan.checkpoint_load_device == plan.weight_postprocess_device == runtime_device
    assert plan.defer_cpu_offload is True
    timeline = watch(mocker, method, dict(state))
    loader.load_dit(
        DitRequest(
            lambda: TinyDiT(quantization=spec),
            path,
            plan=plan,
            kinds=LINEAR_KINDS,
            quantization=spec,
        )
    )
    kinds = [event[0] for event in timeline.events]
    # load -> process -> offload. On a CPU runtime device the offload to CPU moves nothing, so
    # it is no event (FP8-2); the GPU tier sees it.
    offload = ["move"] if runtime_device.type != "cpu" else []
    assert kinds == ["process"] * QUANTIZED_LAYERS + offload, (
        f"expected each layer processed on the device, then one offload; got {kinds}"
    )
    for _, device, loaded in timeline.events[:QUANTIZED_LAYERS]:
        assert is_on(device, runtime_device)  # type: ignore[arg-type]
        assert loaded, "processing ran before the weights were loaded"
    if offload:
        quantized_dtype = torch.float8_e4m3fn if spec.method == "fp8" else torch.uint8
        assert timeline.events[-1] == ("move", {quantized_dtype})


@pytest.mark.rule("FP8-6")
@pytest.mark.capability(FP8_DEFER)
@pytest.mark.parametrize(("spec", "method"), ONLINE)
def test_after_deferral_everything_is_on_cpu_bit_exact(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    *,
    mocker: MockerFixture,
    spec: QuantizationSpec,
    method: type[LinearMethod],
) -> None:
    path, state = write_dit_checkpoint(tmp_path)
    timeline = watch(mocker, method, dict(state))
    module, _ = loader.load_dit(
        DitRequest(
            lambda: TinyDiT(quantization=spec),
            path,
            plan=quantized_offload_plan(loader, runtime_device, spec),
            kinds=LINEAR_KINDS,
            quantization=spec,
        )
    )
    assert {t.device.type for t in [*module.parameters(), *module.buffers()]} == {"cpu"}
    layers = [m for m in module.modules() if isinstance(getattr(m, "quant_method", None), method)]
    assert len(layers) == len(timeline.processed) == QUANTIZED_LAYERS
    for layer in layers:
        weight, scale = timeline.processed[id(layer)]
        assert torch.equal(layer.weight.view(torch.uint8), weight.view(torch.uint8))
        assert torch.equal(layer.weight_scale.view(torch.uint8), scale.view(torch.uint8))
    assert torch.equal(module.get_parameter("final_norm.weight"), state["final_norm.weight"])


@pytest.mark.rule("FP8-3")
@pytest.mark.capability(FP8_DEFER)
@pytest.mark.parametrize(
    ("spec", "offload", "layerwise", "expected"),
    [
        (QuantizationSpec("fp8"), True, True, (True, True)),
        (QuantizationSpec("fp8"), True, False, (True, False)),
        (QuantizationSpec("mxfp4"), True, True, (True, True)),
        (QuantizationSpec("modelopt_fp8", serialized=True), True, True, (False, True)),
        (QuantizationSpec("modelopt_fp8", serialized=True), True, False, (False, False)),
        (QuantizationSpec("modelopt_fp8", serialized=True), False, True, (False, True)),
        (QuantizationSpec("fp8", serialized=True), True, True, (True, True)),
        (None, True, True, (True, True)),
        (None, False, False, (False, False)),
    ],
    ids=str,
)
def test_only_serialized_modelopt_fp8_switches_component_offload_off(
    loader: SeamLoader,
    spec: QuantizationSpec | None,
    *,
    offload: bool,
    layerwise: bool,
    expected: tuple[bool, bool],
) -> None:
    options = OffloadOptions(component_cpu_offload=offload, layerwise_offload=layerwise)
    result = loader.offload_for_quantization(options, spec)
    assert (result.component_cpu_offload, result.layerwise_offload) == expected


@pytest.mark.rule("FP8-4")
@pytest.mark.capability(FP8_DEFER)
def test_fsdp_drops_the_override_with_a_warning_and_never_defers(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    mocker: MockerFixture,
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = QuantizationSpec("fp8")
    path, state = write_dit_checkpoint(tmp_path)
    plan = quantized_offload_plan(loader, runtime_device, spec)
    timeline = watch(mocker, OnlineFp8LinearMethod, dict(state))
    with warned(caplog) as seen:
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
    assert any(names_the_override(w) for w in seen), (
        f"the override was dropped without a warning naming it; warnings: {seen}"
    )
    # Judged by what happened, not by the plan the report carries: processed, never deferred.
    assert [event[0] for event in timeline.events] == ["process"] * QUANTIZED_LAYERS  # no move
    assert all(is_on(p.device, plan.checkpoint_load_device) for p in module.parameters())


@pytest.mark.rule("FP8-4")
@pytest.mark.capability(FP8_DEFER)
def test_fsdp_with_nothing_to_drop_is_silent(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path, _ = write_dit_checkpoint(tmp_path)
    plan = Plan(checkpoint_load_device=runtime_device)
    with warned(caplog) as seen:
        _, report = loader.load_dit(
            DitRequest(TinyDiT, path, plan=plan, kinds=LINEAR_KINDS, fsdp=True)
        )
    assert not any(names_the_override(w) for w in seen), seen  # other warnings are free
    assert (report.plan.weight_postprocess_device, report.plan.defer_cpu_offload) == (None, False)
    assert report.plan.checkpoint_load_device == plan.checkpoint_load_device


@pytest.mark.rule("FP8-5")
@pytest.mark.capability(FP8_DEFER)
def test_failed_quantization_raises_instead_of_falling_back(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    spec = QuantizationSpec("fp8")
    _, state = write_dit_checkpoint(tmp_path / "good")
    bad = dict(state)
    bad["blocks.1.mlp_up.weight"] = bad["blocks.1.mlp_up.weight"].clone()
    bad["blocks.1.mlp_up.weight"][0, 0] = math.inf
    path = write_checkpoint(bad, tmp_path / "bad")
    refusal(
        lambda: loader.load_dit(
            DitRequest(
                lambda: TinyDiT(quantization=spec),
                path,
                plan=quantized_offload_plan(loader, runtime_device, spec),
                kinds=LINEAR_KINDS,
                quantization=spec,
            )
        ),
        "fp8",
        "blocks.1.mlp_up",
        error=Exception,
    )


@pytest.mark.rule("FP8-5")
@pytest.mark.capability(FP8_DEFER)
def test_quantization_requested_but_model_unquantized_raises(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    spec = QuantizationSpec("fp8")
    path, _ = write_dit_checkpoint(tmp_path)
    refusal(
        lambda: loader.load_dit(
            DitRequest(
                TinyDiT,  # ignores the quantization: loading it would be a silent fallback
                path,
                plan=quantized_offload_plan(loader, runtime_device, spec),
                kinds=LINEAR_KINDS,
                quantization=spec,
            )
        ),
        "fp8",
        error=Exception,
    )


@pytest.mark.rule("FP8-5")
@pytest.mark.capability(FP8_DEFER)
@pytest.mark.reference_only("checks the reference's own error class and wording")
def test_reference_raises_quantization_load_error(
    runtime_device: torch.device, tmp_path: Path
) -> None:
    from reference.load.dit import load_dit
    from reference.request.plan import WeightLoadPlan

    spec = QuantizationSpec("fp8")
    path, _ = write_dit_checkpoint(tmp_path)
    with pytest.raises(QuantizationLoadError, match=r"fp8.*was requested but no layer"):
        load_dit(
            TinyDiT,
            path,
            plan=WeightLoadPlan.default(runtime_device),
            kinds=LINEAR_KINDS,
            quantization=spec,
        )


@pytest.mark.internal
@pytest.mark.parametrize(("method", "tolerance"), [("fp8", 0.05), ("mxfp4", 0.3)])
def test_online_quantized_fakes_compute_close_to_the_original(
    method: str, tolerance: float
) -> None:
    state = dit_state()
    original, quantized = TinyDiT(), TinyDiT(quantization=QuantizationSpec(method))
    original.load_state_dict(state)
    quantized.load_state_dict(state)
    for layer in quantized.modules():
        if hasattr(layer, "quant_method"):
            layer.quant_method.process_weights_after_loading(layer)
    assert quantized.blocks[0].qkv.weight.dtype != torch.float32
    x, t = torch.randn(2, 5, 8), torch.tensor([1, 3])
    expected, got = original(x, t), quantized(x, t)
    error = ((got - expected).norm() / expected.norm()).item()
    assert 0 < error < tolerance


@pytest.mark.internal
@pytest.mark.parametrize(
    ("spec", "method"),
    [
        (None, UnquantizedLinearMethod),
        (QuantizationSpec("fp8"), OnlineFp8LinearMethod),
        (QuantizationSpec("fp8", serialized=True), SerializedFp8LinearMethod),
        (QuantizationSpec("modelopt_fp8", serialized=True), SerializedFp8LinearMethod),
        (QuantizationSpec("mxfp4"), OnlineMxfp4LinearMethod),
    ],
    ids=str,
)
def test_fake_quant_methods_by_spec(
    spec: QuantizationSpec | None, method: type[LinearMethod]
) -> None:
    assert quant_method_factory(spec) is method


@pytest.mark.internal
def test_fakes_refuse_what_they_do_not_model() -> None:
    with pytest.raises(ValueError, match="no quant method models"):
        quant_method_factory(QuantizationSpec("mxfp4", serialized=True))
    with pytest.raises(ValueError, match="not a multiple of the block size 32"):
        ColumnParallelLinear(16, 4, quant_method=OnlineMxfp4LinearMethod())
