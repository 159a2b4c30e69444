"""FP8-2 for every transformer of a pipeline, on a real device: under `--dit-cpu-offload` and
online FP8, `transformer` and Wan 2.2's `transformer_2` are each loaded and quantized on CUDA,
and reach the CPU only afterwards (load -> process -> offload). Only a device shows it: on a CPU
runtime device the offload moves nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pytest_mock import MockerFixture
from torch import nn

from fakes.pipelines import MODEL_CLASSES, FakeComponent, PipelineDiT, write_pipeline
from fakes.quant import OnlineFp8LinearMethod
from reference.kit.seam import PIPELINES, ComponentRequest, SeamLoader, ServingOptions
from reference.request.platform import SYSTEM
from reference.request.quantization import QuantizationSpec

pytestmark = [pytest.mark.capability(PIPELINES), pytest.mark.rule("FP8-2")]

DIT = {"hidden": 256, "heads": 4, "depth": 2}


@pytest.mark.parametrize("component", ["transformer", "transformer_2"])
def test_every_offloaded_transformer_is_quantized_on_the_device_then_offloaded(
    loader: SeamLoader,
    gpu_device: torch.device,
    tmp_path: Path,
    mocker: MockerFixture,
    component: str,
) -> None:
    """Catches a loader that defers the offload of `transformer` alone: Wan 2.2's second DiT
    is then processed on the CPU, or left on the device."""
    root = write_pipeline(
        tmp_path,
        {
            "transformer": FakeComponent(PipelineDiT, DIT, seed=1),
            "transformer_2": FakeComponent(PipelineDiT, DIT, seed=2),
        },
    )
    args = loader.make_server_args(
        ServingOptions(
            runtime_device=gpu_device, dit_cpu_offload=True, quantization=QuantizationSpec("fp8")
        )
    )
    processed_on: list[str] = []
    real = OnlineFp8LinearMethod.process_weights_after_loading

    def process(self: OnlineFp8LinearMethod, layer: nn.Module) -> None:
        processed_on.append(layer.weight.device.type)
        real(self, layer)

    mocker.patch.object(
        OnlineFp8LinearMethod, "process_weights_after_loading", autospec=True, side_effect=process
    )
    module = loader.load_pipeline_component(
        ComponentRequest(root, component, args, platform=SYSTEM, models=MODEL_CLASSES)
    )
    assert processed_on, f"{component}: no layer was quantized"
    assert set(processed_on) == {"cuda"}, f"{component}: quantized on {sorted(set(processed_on))}"
    held = {t.device.type for t in [*module.parameters(), *module.buffers()]}
    assert held == {"cpu"}, f"{component}: left on {sorted(held)} after the deferred offload"
