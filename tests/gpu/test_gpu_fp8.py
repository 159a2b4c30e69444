"""FP8-2 and FP8-6 on a real device: an offloaded component is quantized on CUDA and reaches the
CPU only afterwards, holding exactly the bits the device produced.

The expected values come from a reference copy of the model, loaded ordinarily on the same device
and processed by the same quant methods there; nothing is taken from the loader's own report.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pytest_mock import MockerFixture
from safetensors.torch import load_file
from torch import nn

from fakes.dit import DiTConfig, TinyDiT, write_dit_checkpoint
from fakes.layers import LINEAR_KINDS
from fakes.quant import LinearMethod, OnlineFp8LinearMethod, OnlineMxfp4LinearMethod
from reference.kit.seam import FP8_DEFER, DitRequest, Plan, PlanLike, SeamLoader
from reference.request.quantization import QuantizationSpec

pytestmark = pytest.mark.capability(FP8_DEFER)

CONFIG = DiTConfig(hidden=256, heads=4, depth=2)
QUANTIZED_LAYERS = 4 * CONFIG.depth  # qkv, proj, mlp_up, mlp_down in each block
ONLINE = [
    pytest.param(QuantizationSpec("fp8"), OnlineFp8LinearMethod, id="fp8"),
    pytest.param(QuantizationSpec("mxfp4"), OnlineMxfp4LinearMethod, id="mxfp4"),
]


def offloaded_plan(loader: SeamLoader, device: torch.device, spec: QuantizationSpec) -> PlanLike:
    """The plan of a CPU-offloaded component quantized online (DEV-2, FP8-1, PLAN-2): loaded
    and processed on the device, the offload deferred; the plans tests pin its derivation."""
    del loader, spec
    return Plan(
        checkpoint_load_device=device, weight_postprocess_device=device, defer_cpu_offload=True
    )


def processed_on(device: torch.device, spec: QuantizationSpec, path: Path) -> nn.Module:
    """The reference: built on `device`, loaded ordinarily, each layer processed there."""
    with torch.device(device):
        model = TinyDiT(CONFIG, quantization=spec)
    model.load_state_dict(load_file(path))
    with torch.no_grad():
        for layer in model.modules():
            if isinstance(getattr(layer, "quant_method", None), LinearMethod):
                layer.quant_method.process_weights_after_loading(layer)
    return model


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(-1).view(torch.uint8)


@pytest.mark.rule("FP8-2", "FP8-6")
@pytest.mark.parametrize(("spec", "method"), ONLINE)
def test_quantized_on_the_device_then_offloaded_with_the_same_bits(
    loader: SeamLoader,
    gpu_device: torch.device,
    tmp_path: Path,
    *,
    mocker: MockerFixture,
    spec: QuantizationSpec,
    method: type[LinearMethod],
) -> None:
    path, written = write_dit_checkpoint(tmp_path, config=CONFIG)
    plan = offloaded_plan(loader, gpu_device, spec)
    assert plan.checkpoint_load_device.type == "cuda"
    assert plan.defer_cpu_offload is True
    reference = processed_on(gpu_device, spec, path)  # before any spy is in place
    checkpoint = {name: tensor.cpu() for name, tensor in dict(written).items()}
    events: list[tuple[str, str, bool]] = []
    real_process, real_apply = method.process_weights_after_loading, TinyDiT._apply

    def process(self: LinearMethod, layer: nn.Module) -> None:
        weight = layer.weight.detach()
        # Loaded first: the weight it processes holds a checkpoint tensor's values already.
        loaded = any(
            torch.equal(weight.cpu(), t) for t in checkpoint.values() if t.shape == weight.shape
        )
        events.append(("process", weight.device.type, loaded))
        real_process(self, layer)  # type: ignore[arg-type]

    def move(module: TinyDiT, fn: object, recurse: bool = True) -> TinyDiT:
        held = ",".join(sorted({p.device.type for p in module.parameters()}))
        events.append(("move", held, True))  # where the weights are when the move starts
        return real_apply(module, fn, recurse)  # type: ignore[arg-type]

    mocker.patch.object(method, "process_weights_after_loading", autospec=True, side_effect=process)
    mocker.patch.object(TinyDiT, "_apply", autospec=True, side_effect=move)
    module, _ = loader.load_dit(
        DitRequest(
            lambda: TinyDiT(CONFIG, quantization=spec),
            path,
            plan=plan,
            kinds=LINEAR_KINDS,
            quantization=spec,
        )
    )

    kinds = [kind for kind, _, _ in events]
    assert kinds == ["process"] * QUANTIZED_LAYERS + ["move"]  # load, process, then offload once
    assert {where for kind, where, _ in events if kind == "process"} == {"cuda"}
    assert all(loaded for _, _, loaded in events), "processing ran before the weights were loaded"
    assert events[-1][:2] == ("move", "cuda")  # the weights were on the device until the move
    layers = [m for m in module.modules() if isinstance(getattr(m, "quant_method", None), method)]
    assert len(layers) == QUANTIZED_LAYERS
    assert [[d.type for d in layer.quant_method.runs] for layer in layers] == [["cuda"]] * len(
        layers
    )

    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    assert {t.device.type for t in state.values()} == {"cpu"}
    expected = {**dict(reference.named_parameters()), **dict(reference.named_buffers())}
    assert set(state) == set(expected)
    for name, tensor in expected.items():
        assert state[name].dtype == tensor.dtype, name
        assert torch.equal(bits(state[name]), bits(tensor.cpu())), name
    assert module.blocks[0].qkv.weight.dtype != torch.float32  # processing changed the weights
