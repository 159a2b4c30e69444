"""ZC-15: buffers stay buffers, on every path a DiT or a VAE loads by.

After a load every persistent buffer of the module is still a buffer (not a `Parameter`) holding
the checkpoint's value, and every non-persistent buffer holds what construction gave it. Judged
from the module the loader hands back: its registries, its values against the file and against an
ordinary construction. The DiT fixture (`RotaryDiT`) has a persistent buffer (`time_scale`) and a
rotary table computed in `__init__` (`freqs`); the VAE fixture its persistent buffers (a latent
scale, batch-norm statistics). What a VAE's non-persistent buffers hold after streaming is VAE-9's
own question, so the VAE paths here judge the persistent clause.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from fakes.checkpoints import write_checkpoint
from fakes.dit import DiTConfig, RotaryDiT, dit_state
from fakes.layers import LINEAR_KINDS
from fakes.pipelines import (
    FakeComponent,
    PipelineRotaryDiT,
    PipelineVAE,
    write_pipeline,
)
from fakes.platform import FakePlatform
from fakes.vae import StandardVAE, VAEConfig, randomized_state, split_state
from reference.kit.judging.evidence import safetensors_files
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
    StateRequest,
    VaeRequest,
)

CPU = torch.device("cpu")
LAYOUTS = {"single": 1, "sharded": 3}
NO_CUDA = FakePlatform(cuda=False)

ZC15 = pytest.mark.rule("ZC-15")


def file_state(path: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for file in safetensors_files(path):
        state.update(load_file(file))
    return state


def assert_buffers_stay_buffers(
    module: nn.Module,
    constructed: nn.Module,
    checkpoint: dict[str, torch.Tensor],
    *,
    non_persistent: bool,
) -> None:
    """The module's buffers are those construction registered, each still a buffer; persistent
    ones hold the file's values, non-persistent ones (when judged) construction's."""
    _, built_buffers = split_state(constructed)
    persistent = {name for name, _ in constructed.named_buffers()} - set(built_buffers)
    buffers = dict(module.named_buffers())
    parameters = dict(module.named_parameters())
    for name in sorted(persistent):
        assert name in buffers, f"persistent buffer {name} is no longer a buffer"
        assert name not in parameters, f"persistent buffer {name} came back as a Parameter"
        assert not isinstance(buffers[name], nn.Parameter), f"{name} is a Parameter object"
        assert torch.equal(buffers[name].cpu(), checkpoint[name].to(buffers[name].dtype)), (
            f"persistent buffer {name} does not hold the checkpoint's value"
        )
    if not non_persistent:
        return
    for name, value in built_buffers.items():
        assert name in buffers, f"non-persistent buffer {name} is gone"
        assert not buffers[name].is_meta, f"non-persistent buffer {name} was left on meta"
        assert torch.equal(buffers[name].cpu(), value), (
            f"non-persistent buffer {name} does not hold what construction gave it"
        )


def rotary_checkpoint(folder: Path, shards: int) -> tuple[Path, dict[str, torch.Tensor]]:
    state = dit_state(seed=3)
    state["time_scale"] = torch.linspace(0.5, 2.0, state["time_scale"].numel())
    return write_checkpoint(state, folder, shards=shards), state


# --- the DiT's full-state paths ------------------------------------------------------------------


def slots_on_meta(module: nn.Module) -> nn.Module:
    """`module` as a meta build leaves it: parameters and persistent buffers on meta,
    non-persistent buffers real (what construction computed)."""
    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is not None:
                meta = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
                meta.__dict__.update(param.__dict__)
                sub._parameters[name] = meta
        for name, buf in list(sub._buffers.items()):
            if buf is not None and name not in sub._non_persistent_buffers_set:
                sub._buffers[name] = buf.to("meta")
    return module


@ZC15
@pytest.mark.capability(ZERO_COPY)
def test_full_state_load_keeps_buffers_buffers(loader: SeamLoader, tmp_path: Path) -> None:
    """`load_full_state` fills a meta-built module: its persistent buffer becomes a buffer
    holding the file's value, never a Parameter; the rotary table it did not fill is left as
    construction made it."""
    path, _ = rotary_checkpoint(tmp_path, 1)
    module = slots_on_meta(RotaryDiT())
    state = file_state(path)
    loader.load_full_state(StateRequest(module, state.items(), plan=Plan(CPU), kinds=LINEAR_KINDS))
    assert_buffers_stay_buffers(module, RotaryDiT(), state, non_persistent=True)


def load_dit_path(
    loader: SeamLoader, path: Path, way: str, runtime_device: torch.device
) -> nn.Module:
    plans = {
        "offload": lambda: Plan(CPU),
        "resident": lambda: Plan(runtime_device),
        "direct": lambda: Plan(direct_device(runtime_device), load_full_state_dict_on_device=True),
    }
    module, _ = loader.load_dit(DitRequest(RotaryDiT, path, plan=plans[way](), kinds=LINEAR_KINDS))
    return module


DIT_WAYS = [
    pytest.param("offload", marks=pytest.mark.capability(ZERO_COPY)),
    pytest.param("resident", marks=pytest.mark.capability(ZERO_COPY)),
    pytest.param("direct", marks=pytest.mark.capability(DIRECT_DIT)),
]


@ZC15
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("way", DIT_WAYS)
def test_dit_loads_keep_buffers_buffers(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, way: str, layout: str
) -> None:
    path, state = rotary_checkpoint(tmp_path, LAYOUTS[layout])
    module = load_dit_path(loader, path, way, runtime_device)
    assert_buffers_stay_buffers(module, RotaryDiT(), state, non_persistent=True)


# --- the VAE stream ---------------------------------------------------------------------------


@ZC15
@pytest.mark.capability(VAE_STREAM)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_vae_stream_keeps_buffers_buffers(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, layout: str
) -> None:
    config = VAEConfig()
    state = dict(randomized_state(StandardVAE(config), seed=2))
    path = write_checkpoint(state, tmp_path, shards=LAYOUTS[layout])
    module, _ = loader.load_vae(
        VaeRequest(lambda: StandardVAE(config), path, device=runtime_device)
    )
    assert_buffers_stay_buffers(module, StandardVAE(config), state, non_persistent=False)


# --- pipeline components -------------------------------------------------------------------------


DIT = FakeComponent(PipelineRotaryDiT, {"hidden": 32, "depth": 2}, seed=5)
COMPONENTS = {
    "transformer": DIT,
    "transformer_2": FakeComponent(PipelineRotaryDiT, {"hidden": 32, "depth": 1}, shards=2, seed=6),
    "vae": FakeComponent(PipelineVAE, {}, shards=2, seed=7),
}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pipeline(tmp_path_factory.mktemp("buffers"), COMPONENTS)


@ZC15
@pytest.mark.capability(PIPELINES)
@pytest.mark.parametrize("offload", [False, True], ids=["resident", "dit-cpu-offload"])
@pytest.mark.parametrize("component", list(COMPONENTS))
def test_pipeline_components_keep_buffers_buffers(
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
    spec = COMPONENTS[component]
    is_dit = component.startswith("transformer")
    assert_buffers_stay_buffers(
        module, spec.cls(**spec.config), file_state(pipeline / component), non_persistent=is_dit
    )


@pytest.mark.internal
def test_the_fixtures_carry_what_the_rule_judges() -> None:
    _, buffers = split_state(RotaryDiT(DiTConfig()))
    assert set(buffers) == {"freqs"}
    assert "time_scale" in dict(RotaryDiT().named_buffers())
    assert {n for n, _ in StandardVAE().named_buffers()} - set(split_state(StandardVAE())[1])
