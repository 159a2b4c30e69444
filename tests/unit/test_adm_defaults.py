"""ADM-6: with no direct-loading flag set, every component loads as it would without the feature.

The pipeline holds a VAE that only an ordinary build can load (nothing rebuilds its
non-persistent buffer after a meta build), so a loader that streams a VAE nobody asked to stream
fails here instead of passing unnoticed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import safetensors.torch
import torch

from fakes.pipelines import (
    FakeComponent,
    FakeVocoder,
    PipelineDiT,
    PipelineVAE,
    write_pipeline,
)
from fakes.platform import FakePlatform
from fakes.vae import UnrebuiltBufferVAE, VAEConfig
from reference.kit.judging.judge import tensor_named
from reference.kit.seam import (
    ADMISSION,
    PIPELINES,
    ComponentRequest,
    Precisions,
    SeamLoader,
    ServingOptions,
)

pytestmark = pytest.mark.rule("ADM-6")

NO_CUDA = FakePlatform(cuda=False)


class OrdinaryOnlyVAE(UnrebuiltBufferVAE):
    """The VAE fake with a non-persistent buffer that only its own `__init__` computes."""

    def __init__(self, *, frames: int = 4) -> None:
        super().__init__(VAEConfig(frames=frames))


COMPONENTS = {
    "transformer": FakeComponent(PipelineDiT, {"hidden": 32, "depth": 2}, seed=2),
    "vae": FakeComponent(OrdinaryOnlyVAE, seed=3),
    "video_vae": FakeComponent(PipelineVAE, shards=2, seed=4),
    "vocoder": FakeComponent(FakeVocoder, {"channels": 4, "upsample": 2}, seed=1),
}
MODELS_BY_NAME = {c.cls.__name__: c.cls for c in COMPONENTS.values()}
"""The classes this pipeline names, handed to the loader through the seam."""


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pipeline(tmp_path_factory.mktemp("defaults"), COMPONENTS)


def weights(folder: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        state.update(safetensors.torch.load_file(file))
    return state


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu().reshape(-1).view(torch.uint8)


@pytest.mark.capability(ADMISSION)
def test_without_a_flag_no_gate_refuses(
    loader: SeamLoader, runtime_device: torch.device, pipeline_dir: Path
) -> None:
    # Every option that would refuse a direct request is set; nothing asks for one.
    args = loader.make_server_args(
        ServingOptions(
            runtime_device=runtime_device,
            dit_cpu_offload=True,
            dit_layerwise_offload=True,
            component_cpu_offload={"vae": True},
            fsdp_inference=True,
            tp_size=2,
        )
    )
    loader.admit(pipeline_dir, args, platform=NO_CUDA)


@pytest.mark.capability(PIPELINES)
@pytest.mark.parametrize("name", list(COMPONENTS))
def test_without_a_flag_each_component_loads_as_an_ordinary_build(
    loader: SeamLoader, runtime_device: torch.device, pipeline_dir: Path, name: str
) -> None:
    # The precision the ordinary build has (fp32), handed over: defaults are PREC-1's to judge.
    as_built = Precisions(dit=torch.float32, vae=torch.float32)
    args = loader.make_server_args(
        ServingOptions(runtime_device=runtime_device, precisions=as_built)
    )
    module = loader.load_pipeline_component(
        ComponentRequest(pipeline_dir, name, args, platform=NO_CUDA, models=MODELS_BY_NAME)
    )
    spec = COMPONENTS[name]
    ordinary = spec.cls(**spec.config)
    ordinary.load_state_dict(weights(pipeline_dir / name))
    loaded = module.state_dict()
    assert set(loaded) == set(ordinary.state_dict())
    for key, tensor in ordinary.state_dict().items():
        assert loaded[key].device.type == runtime_device.type, key
        assert loaded[key].dtype == tensor.dtype, key
        assert torch.equal(bits(loaded[key]), bits(tensor)), key
    # Every buffer's value, non-persistent ones too (as construction made them), by name:
    # whether a buffer is still a buffer (not re-registered as a parameter) is ZC-15's to judge.
    for key, buffer in ordinary.named_buffers():
        torch.testing.assert_close(tensor_named(module, key).cpu(), buffer)
