"""DEV: where the checkpoint lands.

The answer is a device value, so runtime devices are plain values here (no device is touched):
with and without an index (`cuda`, `cuda:0`, `cuda:1`) and `cpu`, each of which must come back
unchanged wherever the runtime device is the answer.
"""

from __future__ import annotations

import pytest
import torch

from reference.kit.seam import PLANS, SeamLoader
from reference.request.quantization import QuantizationSpec

pytestmark = pytest.mark.capability(PLANS)

RUNTIMES = [
    torch.device("cuda"),
    torch.device("cuda", 0),
    torch.device("cuda", 1),
    torch.device("cpu"),
]
# Quantized components whose weights need the device (DEV-2): online and serialized, and a
# method that declares nothing about CPU loading.
NEEDS_DEVICE = [
    QuantizationSpec("fp8"),
    QuantizationSpec("mxfp4"),
    QuantizationSpec("fp8", serialized=True),
    QuantizationSpec("awq", serialized=True),
    QuantizationSpec("gguf", serialized=True, cpu_load_supported=False),
]
# Methods that declare they load on CPU: upstream's GGUF by its own declaration, and any method
# whose spec states the declaration.
LOADS_ON_CPU = [
    QuantizationSpec("gguf", serialized=True),
    QuantizationSpec("awq", serialized=True, cpu_load_supported=True),
]


def is_cpu(device: torch.device) -> bool:
    return torch.device(device).type == "cpu"


@pytest.mark.rule("DEV-1", "DEV-3")
@pytest.mark.parametrize("runtime", RUNTIMES, ids=str)
def test_offloaded_unquantized_loads_on_cpu(loader: SeamLoader, runtime: torch.device) -> None:
    device = loader.resolve_checkpoint_load_device(
        runtime, component_cpu_offload=True, quantization=None
    )
    assert is_cpu(device), f"offloaded, unquantized, runtime {runtime}: loads on {device}"


@pytest.mark.rule("DEV-2", "DEV-3")
@pytest.mark.parametrize("runtime", RUNTIMES[:3], ids=str)
@pytest.mark.parametrize("quantization", NEEDS_DEVICE, ids=str)
def test_offloaded_quantized_keeps_runtime_device(
    loader: SeamLoader, runtime: torch.device, quantization: QuantizationSpec
) -> None:
    device = loader.resolve_checkpoint_load_device(
        runtime, component_cpu_offload=True, quantization=quantization
    )
    assert device == runtime


@pytest.mark.rule("DEV-2", "DEV-3")
@pytest.mark.parametrize("runtime", RUNTIMES[:3], ids=str)
@pytest.mark.parametrize("quantization", LOADS_ON_CPU, ids=str)
def test_offloaded_quantized_method_declaring_cpu_load_loads_on_cpu(
    loader: SeamLoader, runtime: torch.device, quantization: QuantizationSpec
) -> None:
    device = loader.resolve_checkpoint_load_device(
        runtime, component_cpu_offload=True, quantization=quantization
    )
    assert is_cpu(device), f"{quantization} declares CPU loading; it loads on {device}"


@pytest.mark.rule("DEV-2", "DEV-3")
@pytest.mark.parametrize("runtime", RUNTIMES, ids=str)
@pytest.mark.parametrize("quantization", [None, *NEEDS_DEVICE[:2], *LOADS_ON_CPU], ids=str)
def test_resident_loads_on_runtime_device(
    loader: SeamLoader, runtime: torch.device, quantization: QuantizationSpec | None
) -> None:
    device = loader.resolve_checkpoint_load_device(
        runtime, component_cpu_offload=False, quantization=quantization
    )
    assert device == runtime


@pytest.mark.rule("DEV-2")
def test_resident_uses_the_given_runtime_device(
    loader: SeamLoader, runtime_device: torch.device
) -> None:
    device = loader.resolve_checkpoint_load_device(
        runtime_device, component_cpu_offload=False, quantization=None
    )
    assert device == runtime_device


@pytest.mark.internal
def test_quantization_spec_states_cpu_loading() -> None:
    assert QuantizationSpec("gguf").loads_on_cpu
    assert QuantizationSpec("GGUF", serialized=True).loads_on_cpu
    assert not QuantizationSpec("gguf", cpu_load_supported=False).loads_on_cpu
    assert QuantizationSpec("custom", cpu_load_supported=True).loads_on_cpu
    assert not QuantizationSpec("fp8").loads_on_cpu
    with pytest.raises(ValueError, match="cpu_load_supported"):
        QuantizationSpec("gguf", cpu_load_supported=1)  # type: ignore[arg-type]
