"""Real diffusers VAEs, streamed from diffusers' own folder layout and checked against diffusers'
own `from_pretrained`: every state entry and a decode bit-identical.

Needs the diffusers extra; without it these tests skip (test_diffusers_cli.py checks the error
a user gets instead). Only local folders written into tmp_path are read: no hub access.
"""

from __future__ import annotations

import importlib
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # read once when huggingface_hub is imported

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

from fakes.diffusers_vaes import (
    IMAGE_KL,
    IMAGE_TINY,
    VIDEO_COGVIDEOX,
    VIDEO_COSMOS,
    VIDEO_WAN,
    DiffusersVAE,
    write_diffusers_pipeline,
    write_diffusers_vae,
)
from reference.extras import install_hint
from reference.kit.seam import (
    PIPELINES,
    VAE_STREAM,
    ComponentRequest,
    SeamLoader,
    ServingOptions,
    VaeRequest,
)
from reference.request.platform import SYSTEM

EXTRA = f"needs the diffusers extra: {install_hint('diffusers')}"
INDEX = "diffusion_pytorch_model.safetensors.index.json"


@pytest.fixture(scope="module")
def diffusers() -> ModuleType:
    module = pytest.importorskip("diffusers", reason=EXTRA)
    module.utils.logging.set_verbosity_error()
    module.utils.logging.disable_progress_bar()
    return module


def model_class(diffusers: ModuleType, vae: DiffusersVAE) -> Any:
    if not hasattr(diffusers, vae.class_name):
        pytest.skip(f"diffusers {diffusers.__version__} has no {vae.class_name}")
    return vae.model_class()


def from_pretrained(cls: Any, folder: Path, device: torch.device) -> nn.Module:
    """diffusers' own load of `folder` (local files only), on `device`."""
    module: nn.Module = cls.from_pretrained(str(folder), low_cpu_mem_usage=False)
    return module.to(device).eval()


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8)


def assert_same_vae(
    loaded: nn.Module, expected: nn.Module, latents: torch.Tensor, device: torch.device
) -> None:
    """Every state entry bit-identical (names, dtypes, bytes), and a decode bit-identical."""
    got, want = loaded.state_dict(), expected.state_dict()
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert got[name].device.type == device.type, name
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(bits(got[name]), bits(tensor)), name
    with torch.no_grad():
        actual: Any = loaded.eval()
        reference: Any = expected
        decoded = reference.decode(latents).sample
        assert torch.isfinite(decoded).all()
        assert decoded.abs().sum() > 0
        assert torch.equal(bits(actual.decode(latents).sample), bits(decoded))


CASES = [
    pytest.param(IMAGE_KL, False, None, id="image-AutoencoderKL"),
    pytest.param(IMAGE_KL, True, torch.bfloat16, id="image-AutoencoderKL-sharded-bf16-file"),
    pytest.param(VIDEO_WAN, True, None, id="video-AutoencoderKLWan-sharded"),
    pytest.param(VIDEO_COGVIDEOX, True, None, id="video-AutoencoderKLCogVideoX-sharded"),
    pytest.param(IMAGE_TINY, False, None, id="image-AutoencoderTiny"),
]


@pytest.mark.capability(VAE_STREAM)
@pytest.mark.rule("VAE-1", "VAE-2", "VAE-3", "VAE-7", "VAE-8", "VAE-13")
@pytest.mark.parametrize(("vae", "sharded", "file_dtype"), CASES)
def test_diffusers_vae_streams_bit_identically_to_from_pretrained(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    *,
    diffusers: ModuleType,
    vae: DiffusersVAE,
    sharded: bool,
    file_dtype: torch.dtype | None,
) -> None:
    cls = model_class(diffusers, vae)
    folder = tmp_path / "vae"
    config = write_diffusers_vae(folder, vae, sharded=sharded, dtype=file_dtype)
    shards = sorted(folder.glob("*.safetensors"))
    assert (folder / INDEX).exists() == sharded
    assert len(shards) > 1 if sharded else len(shards) == 1
    built_on: list[set[str]] = []

    def build() -> nn.Module:
        module: nn.Module = cls.from_config(config)
        built_on.append({t.device.type for t in module.state_dict().values()})
        return module

    module, report = loader.load_vae(
        VaeRequest(build, folder, device=runtime_device, config=config)
    )

    assert built_on == [{"meta"}]
    expected = from_pretrained(cls, folder, runtime_device)
    assert sorted(r.name for r in report.records) == sorted(expected.state_dict())
    assert {r.how for r in report.records} == {"streamed"}
    # A bfloat16 file fills the float32 slots the config builds, as diffusers' own load does.
    assert {t.dtype for t in module.state_dict().values()} == {torch.float32}
    assert_same_vae(module, expected, vae.sample_latents(runtime_device), runtime_device)


@pytest.mark.capability(PIPELINES)
@pytest.mark.parametrize(
    "direct",
    [
        pytest.param(False, marks=pytest.mark.rule("ADM-6"), id="ordinary"),
        pytest.param(True, marks=pytest.mark.rule("VAE-1", "VAE-13"), id="direct"),
    ],
)
@pytest.mark.parametrize("vae", [IMAGE_KL, VIDEO_WAN], ids=lambda v: v.class_name)
def test_pipeline_vae_named_by_diffusers_loads_like_from_pretrained(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    *,
    diffusers: ModuleType,
    vae: DiffusersVAE,
    direct: bool,
) -> None:
    """model_index.json says ["diffusers", "<Class>"]: the pipeline's VAE loader builds that class
    from config.json and loads its sharded weights (streamed when the flag asks)."""
    if direct and runtime_device.type != "cuda":
        pytest.skip(
            "the direct flag needs a CUDA runtime device (ADM-2); on CPU the same streaming runs"
            " through load_vae (test_diffusers_vae_streams_bit_identically_to_from_pretrained)"
        )
    cls = model_class(diffusers, vae)
    root = write_diffusers_pipeline(tmp_path, vae, sharded=True)
    args = loader.make_server_args(
        ServingOptions(
            runtime_device=runtime_device, component_direct_gpu_weight_loading={"vae": direct}
        )
    )
    module = loader.load_pipeline_component(ComponentRequest(root, "vae", args, platform=SYSTEM))
    # The state and the decode are judged, not the class: a loader may build its own
    # implementation of the named class (SPEC, "State, not identity").
    expected = from_pretrained(cls, root / "vae", runtime_device)
    assert_same_vae(module, expected, vae.sample_latents(runtime_device), runtime_device)


@pytest.mark.capability(VAE_STREAM)
@pytest.mark.rule("VAE-1", "VAE-13")
@pytest.mark.reference_only("pins the reference's own diffusers resolution")
def test_reference_resolution_streams_the_named_class_on_the_runtime_device(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, diffusers: ModuleType
) -> None:
    """What the reference's VAE loader runs for an admitted direct request, on any device: the
    class model_index.json names, built from config.json on meta, then streamed."""
    from reference.load.loaders import VAELoader
    from reference.request.model_index import read_pipeline

    root = write_diffusers_pipeline(tmp_path, VIDEO_WAN, sharded=True)
    spec = read_pipeline(root).component("vae")
    build = VAELoader().model_builder(spec)
    module, report = loader.load_vae(
        VaeRequest(build, spec.folder, device=runtime_device, config=spec.config)
    )
    assert report.events[0] == "build on meta"
    expected = from_pretrained(VIDEO_WAN.model_class(), spec.folder, runtime_device)
    assert_same_vae(module, expected, VIDEO_WAN.sample_latents(runtime_device), runtime_device)


# The meta builds by diffusers version, kept for the process: the selftest tier runs this file
# once per broken VAE loader in one process, and the builds took 2 s a run.
_META_VAES: dict[str, Mapping[str, nn.Module]] = {}


@pytest.fixture(scope="module")
def meta_vaes(diffusers: ModuleType) -> Mapping[str, nn.Module]:
    """Every VAE class diffusers ships that builds from its defaults, built on meta, by class
    name (built once per process: the tests only read them)."""
    version = str(diffusers.__version__)
    if version not in _META_VAES:
        _META_VAES[version] = _build_meta_vaes(diffusers)
    return _META_VAES[version]


def _build_meta_vaes(diffusers: ModuleType) -> Mapping[str, nn.Module]:
    # Imported by name: diffusers' lazy modules offer a subpackage as an attribute only once
    # something imported it, which depends on the order tests run in.
    package = importlib.import_module("diffusers.models.autoencoders")
    classes = {
        name: obj
        for name, obj in vars(package).items()
        if isinstance(obj, type) and issubclass(obj, diffusers.ModelMixin)
    }
    built: dict[str, nn.Module] = {}
    for name, cls in sorted(classes.items()):
        try:
            with torch.device("meta"):
                built[name] = cls()
        except Exception:  # needs constructor arguments, or a library diffusers lacks here
            continue
    return built


@pytest.mark.capability(VAE_STREAM)
@pytest.mark.rule("VAE-2", "VAE-3", "VAE-5", "VAE-6")
def test_diffusers_vae_classes_use_the_standard_state_dict_abi(
    loader: SeamLoader, meta_vaes: Mapping[str, nn.Module]
) -> None:
    """Every VAE class diffusers ships (that builds from its defaults) passes the ABI rules on a
    meta build: no overrides or user hooks on any submodule, no ties, keys equal the slots."""
    refused = {}
    for name, module in meta_vaes.items():
        try:
            assert loader.vae_state_slots(module)
        except ValueError as exc:
            refused[name] = str(exc)
    assert {"AutoencoderKL", "AutoencoderKLWan", "AutoencoderKLCogVideoX"} <= set(meta_vaes)
    assert refused == {}


def non_persistent(module: nn.Module) -> dict[str, torch.Tensor]:
    state = module.state_dict(keep_vars=True)
    return {name: t for name, t in module.named_buffers() if name not in state}


@pytest.mark.capability(VAE_STREAM)
@pytest.mark.rule("VAE-9")
@pytest.mark.parametrize("sharded", [False, True], ids=["single-file", "sharded"])
def test_diffusers_vae_with_buffers_computed_in_init_streams_without_edits(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    *,
    diffusers: ModuleType,
    sharded: bool,
) -> None:
    """AutoencoderKLCosmos computes index ranges (torch.arange) in __init__ as non-persistent
    buffers, beside wavelet filters, and has no hook to rebuild them: a build with `meta` as
    the default device leaves the ranges on meta. A class the user does not own must load
    without edits: each buffer holds what diffusers' own construction gives it, and the decode
    is bit-identical."""
    cls = model_class(diffusers, VIDEO_COSMOS)
    folder = tmp_path / "vae"
    config = write_diffusers_vae(folder, VIDEO_COSMOS, sharded=sharded)
    with torch.device("meta"):
        on_meta = non_persistent(cls.from_config(config))
    arange = ("encoder.patch_embed._arange", "decoder.unpatch_embed._arange")
    assert all(on_meta[name].is_meta for name in arange)  # the state the rule must change

    module, report = loader.load_vae(
        VaeRequest(lambda: cls.from_config(config), folder, device=runtime_device, config=config)
    )

    expected = from_pretrained(cls, folder, runtime_device)
    buffers, wanted = non_persistent(module), non_persistent(expected)
    assert set(buffers) == set(wanted) == set(on_meta)
    for name, tensor in wanted.items():
        assert not buffers[name].is_meta, name
        assert buffers[name].device.type == runtime_device.type, name
        assert buffers[name].dtype == tensor.dtype, name
        assert torch.equal(bits(buffers[name]), bits(tensor)), name
    assert {r.how for r in report.records} == {"streamed"}
    assert_same_vae(module, expected, VIDEO_COSMOS.sample_latents(runtime_device), runtime_device)


@pytest.mark.rule("VAE-1", "VAE-9")
@pytest.mark.reference_only("the reference's own meta build, on every diffusers VAE class")
def test_reference_meta_build_of_every_diffusers_vae_keeps_only_its_buffers_real(
    meta_vaes: Mapping[str, nn.Module],
) -> None:
    from reference.place.build import build_on_meta

    with_buffers = []
    for name, built in meta_vaes.items():
        module = build_on_meta(type(built), component=name)
        assert all(t.is_meta for t in module.state_dict().values()), name
        buffers = non_persistent(module)
        assert not any(t.is_meta for t in buffers.values()), name
        with_buffers += [name] if buffers else []
    assert "AutoencoderKLCosmos" in with_buffers
