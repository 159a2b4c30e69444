"""OUT-1: a loaded DiT or VAE comes back ready for inference, on every path.

Every build below returns its module in training mode, as `nn.Module` constructs it: a loader
must hand it back in eval mode (as `from_pretrained` does), with no parameter and no buffer left
on `meta`. Paths: the DiT's full-state load under CPU offload and resident, direct (GPU tier),
the VAE stream, and pipeline components (`transformer`, `transformer_2`, `vae`, `video_vae`,
resident and under `--dit-cpu-offload`); single files and sharded checkpoints.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from fakes.dit import TinyDiT, write_dit_checkpoint
from fakes.layers import LINEAR_KINDS
from fakes.pipelines import FakeComponent, PipelineDiT, PipelineVAE, write_pipeline
from fakes.platform import FakePlatform
from fakes.vae import StandardVAE, VAEConfig, randomized_state
from fakes.vae_checkpoints import write_vae_checkpoint
from reference.kit.judging.load_paths import MODEL_CLASSES, direct_device
from reference.kit.seam import (
    DIRECT_DIT,
    PIPELINES,
    VAE_STREAM,
    ZERO_COPY,
    ComponentRequest,
    DitRequest,
    Plan,
    SeamLoader,
    ServingOptions,
    VaeRequest,
)

CPU = torch.device("cpu")
LAYOUTS = {"single": 1, "sharded": 3}
NO_CUDA = FakePlatform(cuda=False)
OUT_1 = pytest.mark.rule("OUT-1")


def assert_ready_for_inference(module: nn.Module) -> None:
    training = sorted(name or "(root)" for name, sub in module.named_modules() if sub.training)
    assert not training, f"expected eval mode (as from_pretrained); still training: {training[:5]}"
    on_meta = [
        name for name, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta
    ]
    assert not on_meta, f"left on meta: {on_meta[:5]}"


def built_training(cls: type[nn.Module]) -> nn.Module:
    module = cls()
    assert module.training
    return module


@OUT_1
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(
    "way",
    [
        pytest.param("offload", marks=pytest.mark.capability(ZERO_COPY)),
        pytest.param("resident", marks=pytest.mark.capability(ZERO_COPY)),
        pytest.param("direct", marks=pytest.mark.capability(DIRECT_DIT)),
    ],
)
@pytest.mark.parametrize("component", ["transformer", "transformer_2"])
def test_a_loaded_dit_is_ready_for_inference(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    *,
    way: str,
    layout: str,
    component: str,
) -> None:
    path, _ = write_dit_checkpoint(tmp_path, shards=LAYOUTS[layout])
    plan = {
        "offload": lambda: Plan(CPU),
        "resident": lambda: Plan(runtime_device),
        "direct": lambda: Plan(direct_device(runtime_device), load_full_state_dict_on_device=True),
    }[way]()
    module, _ = loader.load_dit(
        DitRequest(
            lambda: built_training(TinyDiT),
            path,
            plan=plan,
            kinds=LINEAR_KINDS,
            component=component,
        )
    )
    assert_ready_for_inference(module)


@OUT_1
@pytest.mark.capability(VAE_STREAM)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_streamed_vae_is_ready_for_inference(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, layout: str
) -> None:
    state = dict(randomized_state(StandardVAE(VAEConfig()), seed=1))
    path = write_vae_checkpoint(state, tmp_path, shards=LAYOUTS[layout])
    module, _ = loader.load_vae(
        VaeRequest(
            lambda: built_training(StandardVAE), path, device=runtime_device, component="video_vae"
        )
    )
    assert_ready_for_inference(module)


COMPONENTS = {
    "transformer": FakeComponent(PipelineDiT, {"hidden": 32, "depth": 2}, seed=2),
    "transformer_2": FakeComponent(PipelineDiT, {"hidden": 32, "depth": 1}, shards=2, seed=3),
    "vae": FakeComponent(PipelineVAE, {}, seed=4),
    "video_vae": FakeComponent(PipelineVAE, {}, shards=2, seed=5),
}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pipeline(tmp_path_factory.mktemp("out"), COMPONENTS)


@OUT_1
@pytest.mark.capability(PIPELINES)
@pytest.mark.parametrize("offload", [False, True], ids=["resident", "dit-cpu-offload"])
@pytest.mark.parametrize("component", list(COMPONENTS))
def test_a_pipeline_component_is_ready_for_inference(
    loader: SeamLoader,
    runtime_device: torch.device,
    pipeline: Path,
    component: str,
    offload: bool,
) -> None:
    args = loader.make_server_args(
        ServingOptions(runtime_device=runtime_device, dit_cpu_offload=offload)
    )
    module = loader.load_pipeline_component(
        ComponentRequest(pipeline, component, args, platform=NO_CUDA, models=MODEL_CLASSES)
    )
    assert_ready_for_inference(module)
