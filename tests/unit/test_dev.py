"""DEV: where the checkpoint lands."""

from __future__ import annotations

import pytest
import torch

from reference.adapter import PLANS, LoaderAdapter
from reference.quantization import QuantizationSpec

pytestmark = pytest.mark.capability(PLANS)

CPU = torch.device("cpu")
RUNTIME = torch.device("cuda", 0)
FP8 = QuantizationSpec("fp8")


@pytest.mark.rule("DEV-1", "DEV-3")
def test_offloaded_unquantized_loads_on_cpu(loader: LoaderAdapter) -> None:
    device = loader.resolve_checkpoint_load_device(
        RUNTIME, component_cpu_offload=True, quantization=None
    )
    assert device == CPU


@pytest.mark.rule("DEV-2", "DEV-3")
@pytest.mark.parametrize(
    "quantization",
    [FP8, QuantizationSpec("fp8", serialized=True), QuantizationSpec("gguf")],
    ids=str,
)
def test_offloaded_quantized_keeps_runtime_device(
    loader: LoaderAdapter, quantization: QuantizationSpec
) -> None:
    device = loader.resolve_checkpoint_load_device(
        RUNTIME, component_cpu_offload=True, quantization=quantization
    )
    assert device == RUNTIME


@pytest.mark.rule("DEV-2", "DEV-3")
@pytest.mark.parametrize("quantization", [None, FP8], ids=str)
def test_resident_loads_on_runtime_device(
    loader: LoaderAdapter, quantization: QuantizationSpec | None
) -> None:
    device = loader.resolve_checkpoint_load_device(
        RUNTIME, component_cpu_offload=False, quantization=quantization
    )
    assert device == RUNTIME


@pytest.mark.rule("DEV-2")
def test_resident_uses_the_given_runtime_device(
    loader: LoaderAdapter, runtime_device: torch.device
) -> None:
    device = loader.resolve_checkpoint_load_device(
        runtime_device, component_cpu_offload=False, quantization=None
    )
    assert device == runtime_device
