"""ADM-6: with no direct-loading flag set, every component loads as it would without the feature.

The pipeline holds a VAE that only an ordinary build can load (nothing rebuilds its
non-persistent buffer after a meta build), so a loader that streams a VAE nobody asked to stream
fails here instead of passing unnoticed.
"""

from __future__ import annotations

from collections.abc import Mapping
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
from fakes.vae import (
    HandleKeepingVAE,
    StandardVAE,
    UnrebuiltBufferVAE,
    VAEConfig,
    ValueReadingVAE,
)
from reference.kit.judging.judge import tensor_named
from reference.kit.seam import (
    ADMISSION,
    PIPELINES,
    WHOLE_PIPELINE,
    ComponentRequest,
    PipelineRequest,
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


def assert_ordinary_state(
    module: torch.nn.Module, ordinary: torch.nn.Module, runtime_device: torch.device
) -> None:
    """`module`'s state is `ordinary`'s (names, dtypes, bits) on the runtime device."""
    loaded = module.state_dict()
    assert set(loaded) == set(ordinary.state_dict())
    for key, tensor in ordinary.state_dict().items():
        assert loaded[key].device.type == runtime_device.type, key
        assert loaded[key].dtype == tensor.dtype, key
        assert torch.equal(bits(loaded[key]), bits(tensor)), key


def loaded_component(
    loader: SeamLoader,
    root: Path,
    name: str,
    *,
    way: str,
    runtime_device: torch.device,
    models: Mapping[str, type[torch.nn.Module]],
) -> torch.nn.Module:
    """Component `name` of the pipeline in `root`, loaded with no flag, alone
    (`load_pipeline_component`) or with the whole pipeline."""
    # The precision the ordinary build has (fp32), handed over: defaults are PREC-1's to judge.
    as_built = Precisions(dit=torch.float32, vae=torch.float32)
    args = loader.make_server_args(
        ServingOptions(runtime_device=runtime_device, precisions=as_built)
    )
    if way == "alone":
        request = ComponentRequest(root, name, args, platform=NO_CUDA, models=models)
        return loader.load_pipeline_component(request)
    whole = loader.load_pipeline(PipelineRequest(root, args=args, platform=NO_CUDA, models=models))
    return whole.components[name]


WAYS = [
    pytest.param("alone", marks=pytest.mark.capability(PIPELINES)),
    pytest.param("whole", marks=pytest.mark.capability(WHOLE_PIPELINE)),
]


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("name", list(COMPONENTS))
def test_without_a_flag_each_component_loads_as_an_ordinary_build(
    loader: SeamLoader, runtime_device: torch.device, pipeline_dir: Path, name: str, way: str
) -> None:
    """Alone (`load_pipeline_component`) and in a whole pipeline (`load_pipeline`): a loader
    may build a component on meta for its checks or its load, but the load must still end as
    the ordinary build does, non-persistent buffers included."""
    module = loaded_component(
        loader, pipeline_dir, name, way=way, runtime_device=runtime_device, models=MODELS_BY_NAME
    )
    spec = COMPONENTS[name]
    ordinary = spec.cls(**spec.config)
    ordinary.load_state_dict(weights(pipeline_dir / name))
    assert_ordinary_state(module, ordinary, runtime_device)
    # Every buffer's value, non-persistent ones too (as construction made them), by name:
    # whether a buffer is still a buffer (not re-registered as a parameter) is ZC-15's to judge.
    for key, buffer in ordinary.named_buffers():
        torch.testing.assert_close(tensor_named(module, key).cpu(), buffer)


def loaded_vae_and_ordinary(
    loader: SeamLoader,
    tmp_path: Path,
    cls: type[StandardVAE],
    *,
    way: str,
    runtime_device: torch.device,
) -> tuple[torch.nn.Module, StandardVAE]:
    """A pipeline whose VAE is a `cls` (beside a DiT) written into `tmp_path`, its VAE loaded
    with no flag (`loaded_component`), and the ordinary build of `cls` holding the same
    checkpoint (construct, `load_state_dict`) on the CPU."""
    components = {
        "transformer": FakeComponent(PipelineDiT, {"hidden": 32, "depth": 2}, seed=2),
        "vae": FakeComponent(cls, seed=5),
    }
    root = write_pipeline(tmp_path, components)
    models = {c.cls.__name__: c.cls for c in components.values()}
    vae = loaded_component(
        loader, root, "vae", way=way, runtime_device=runtime_device, models=models
    )
    ordinary = cls()
    ordinary.load_state_dict(weights(root / "vae"))
    return vae, ordinary


@pytest.mark.parametrize("way", WAYS)
def test_without_a_flag_a_vae_decodes_as_its_ordinary_build(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, way: str
) -> None:
    """A VAE whose construction kept a handle on one of its parameters (`HandleKeepingVAE`)
    decodes as the ordinary build does (construct, `load_state_dict`): a loader that builds
    the default path on meta must fill the parameter objects construction made, not put new
    ones in their slots."""
    vae, ordinary = loaded_vae_and_ordinary(
        loader, tmp_path, HandleKeepingVAE, way=way, runtime_device=runtime_device
    )
    ordinary = ordinary.to(runtime_device).eval()
    generator = torch.Generator().manual_seed(0)
    latent = torch.randn(1, ordinary.config.latent_channels, 2, 4, 4, generator=generator)
    with torch.no_grad():
        expected = ordinary.decode(latent.to(runtime_device))
        got = vae.decode(latent.to(runtime_device))  # type: ignore[operator]
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("way", WAYS)
def test_without_a_flag_a_vae_whose_construction_reads_its_weights_loads(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, way: str
) -> None:
    """A VAE whose construction reads a value of a parameter it made (`ValueReadingVAE`)
    builds the ordinary way, so with no flag it loads, as its ordinary build: a loader that
    builds the default path on meta must build such a class for real."""
    vae, ordinary = loaded_vae_and_ordinary(
        loader, tmp_path, ValueReadingVAE, way=way, runtime_device=runtime_device
    )
    assert_ordinary_state(vae, ordinary, runtime_device)
