"""The ordinary way's fill of a meta build (`reference.place.materialise`), a pipeline's or the
one a component loaded alone makes: slots made real in place, and a real build wherever a meta
tensor would be left behind."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
import safetensors.torch
import torch

from fakes.pipelines import FakeComponent, PipelineDiT, write_pipeline
from fakes.vae import StandardVAE, TiedVAE, UnrebuiltBufferVAE, VAEConfig
from reference.load.loaders import VAELoader
from reference.load.pipeline import load_pipeline
from reference.place.build import build_on_meta
from reference.place.materialise import materialise_slots, meta_leftovers
from reference.place.modules import find_slots
from reference.request.args import ServerArgs
from reference.request.model_index import ModelRegistry, read_pipeline

pytestmark = pytest.mark.internal

CPU = torch.device("cpu")


class ViewKeepingVAE(StandardVAE):
    """Keeps a view of a parameter as an attribute: a meta build leaves the view on meta."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        self.shift_view = self.latent_shift.detach().view(-1)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        z = z * self._latent(self.latent_scale) + self._latent(self.shift_view)
        out: torch.Tensor = self.decoder(z.to(self.decode_dtype))
        return out.float()


def test_a_meta_build_is_made_real_in_place_with_its_ties() -> None:
    module = build_on_meta(TiedVAE, component="vae")
    slots = find_slots(module)
    objects = {name: slot.tensor for name, slot in slots.by_name.items()}
    flags = {name: slot.tensor.requires_grad for name, slot in slots.by_name.items()}
    assert meta_leftovers(module, slots) == ()
    materialise_slots(slots)
    held = dict(module.named_parameters(remove_duplicate=False))
    held |= dict(module.named_buffers(remove_duplicate=False))
    for name, tensor in objects.items():
        assert held[name] is tensor, name  # the same object, now real
        assert tensor.device == CPU, name
        assert tensor.requires_grad == flags[name], name
    assert held["decoder.block.conv1.weight"] is held["encoder.block.conv1.weight"]


def test_leftovers_name_a_buffer_and_a_view_left_on_meta() -> None:
    unrebuilt = build_on_meta(UnrebuiltBufferVAE, component="vae")
    assert meta_leftovers(unrebuilt, find_slots(unrebuilt)) == ("decoder.temporal.freqs",)
    viewing = build_on_meta(ViewKeepingVAE, component="vae")
    assert meta_leftovers(viewing, find_slots(viewing)) == ("shift_view",)


class BuildRecordingVAE(StandardVAE):
    """Records the device its parameters were made on, once per construction."""

    builds: ClassVar[list[str]] = []

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        type(self).builds.append(self.latent_shift.device.type)


def _vae_pipeline(tmp_path: Path, cls: type[StandardVAE]) -> tuple[Path, ModelRegistry]:
    components = {
        "transformer": FakeComponent(PipelineDiT, {"hidden": 32, "depth": 2}, seed=2),
        "vae": FakeComponent(cls, seed=5),
    }
    root = write_pipeline(tmp_path, components)
    registry = ModelRegistry()
    for component in components.values():
        registry.register(component.cls)
    return root, registry


ARGS = ServerArgs(runtime_device=CPU, vae_precision=torch.float32)


def _load_vae(root: Path, registry: ModelRegistry, way: str) -> torch.nn.Module:
    if way == "alone":
        spec = read_pipeline(root).component("vae")
        return VAELoader(registry=registry).load(spec, ARGS).module
    return {item.name: item.module for item in load_pipeline(root, ARGS, registry=registry)}["vae"]


@pytest.mark.parametrize("way", ["alone", "whole"])
def test_a_vae_without_a_direct_request_fills_one_meta_build(tmp_path: Path, way: str) -> None:
    root, registry = _vae_pipeline(tmp_path, BuildRecordingVAE)
    BuildRecordingVAE.builds.clear()  # writing the pipeline built it for real
    _load_vae(root, registry, way)
    assert BuildRecordingVAE.builds == ["meta"]  # no real build initialising its parameters


@pytest.mark.parametrize("way", ["alone", "whole"])
def test_a_vae_that_would_keep_a_meta_view_is_built_for_real(tmp_path: Path, way: str) -> None:
    root, registry = _vae_pipeline(tmp_path, ViewKeepingVAE)
    vae = _load_vae(root, registry, way)
    ordinary = ViewKeepingVAE()
    ordinary.load_state_dict(
        safetensors.torch.load_file(root / "vae" / "diffusion_pytorch_model.safetensors")
    )
    latent = torch.randn(1, 4, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(vae.decode(latent), ordinary.eval().decode(latent))  # type: ignore[operator]
