"""The diffusers adapter (reference/kit/adapters/diffusers.py): it converts types only.

Suite-internal: these tests check the adapter itself (its declared capabilities, that a real
diffusers VAE loads through it exactly as diffusers' own `from_pretrained` loads it, that
diffusers' errors are converted, not replaced), not any loader's conformance. They need
diffusers and accelerate (diffusers' meta-device path); without them they skip.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # read once when huggingface_hub is imported

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from fakes.diffusers_vaes import IMAGE_KL, write_diffusers_vae
from reference.errors import CheckpointError
from reference.kit.seam import ALL_CAPABILITIES, CHECKPOINT_SAFETY, VAE_STREAM, VaeRequest
from reference.request.quantization import QuantizationSpec

pytestmark = pytest.mark.internal

CPU = torch.device("cpu")
NEEDS = "needs the diffusers extra, which brings accelerate (diffusers' meta-device path)"


@pytest.fixture(scope="module")
def adapter() -> Any:
    pytest.importorskip("diffusers", reason=NEEDS)
    pytest.importorskip("accelerate", reason=NEEDS)
    from reference.kit.adapters.diffusers import DiffusersLoader

    importlib.import_module("diffusers").utils.logging.set_verbosity_error()
    return DiffusersLoader()


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8)


def test_reference_imports_it_without_diffusers(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("diffusers", "accelerate"):
        monkeypatch.setitem(sys.modules, name, None)  # an import of it now fails
    module = importlib.reload(importlib.import_module("reference.kit.adapters.diffusers"))
    assert module.DiffusersLoader.capabilities == frozenset({VAE_STREAM, CHECKPOINT_SAFETY})
    assert module.DiffusersLoader.capabilities <= ALL_CAPABILITIES
    with pytest.raises(ImportError, match="needs the diffusers extra, which brings accelerate"):
        module.DiffusersLoader()


@pytest.mark.parametrize("sharded", [False, True], ids=["single-file", "sharded"])
def test_a_diffusers_vae_loads_bit_identically_to_from_pretrained(
    adapter: Any, tmp_path: Path, sharded: bool
) -> None:
    cls = IMAGE_KL.model_class()
    config = write_diffusers_vae(tmp_path / "vae", IMAGE_KL, seed=3, sharded=sharded)
    built: list[nn.Module] = []

    def build() -> nn.Module:
        built.append(cls.from_config(config))
        return built[-1]

    module, report = adapter.load_vae(
        VaeRequest(build, tmp_path / "vae", device=CPU, config=config)
    )
    expected = cls.from_pretrained(str(tmp_path / "vae"))  # accelerate present: the meta path

    assert built == [module]
    assert not module.training
    got, want = module.state_dict(), expected.state_dict()
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(bits(got[name]), bits(tensor)), name
    assert sorted(r.name for r in report.records) == sorted(want)
    assert report.component == "vae"
    latents = IMAGE_KL.sample_latents(CPU)
    with torch.no_grad():
        assert torch.equal(module.decode(latents).sample, expected.decode(latents).sample)


def test_checkpoint_reads_are_diffusers_reader_results(adapter: Any, tmp_path: Path) -> None:
    state = {"a.weight": torch.randn(3, 2), "b.index": torch.arange(4)}
    path = tmp_path / "model.safetensors"
    save_file(state, str(path))
    assert dict(adapter.inspect_checkpoint(tmp_path)) == {
        n: (t.dtype, tuple(t.shape)) for n, t in state.items()
    }
    assert torch.equal(
        adapter.read_checkpoint_tensor(path, "b.index", device=CPU), state["b.index"]
    )
    with pytest.raises(CheckpointError) as caught:
        adapter.read_checkpoint_tensor(path, "ghost.weight", device=CPU)
    assert (caught.value.file, caught.value.entry) == (str(path), "ghost.weight")


def test_diffusers_errors_are_converted_not_replaced(adapter: Any, tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    with pytest.raises(CheckpointError) as caught:
        adapter.inspect_checkpoint(path)
    assert (caught.value.file, caught.value.entry) == (str(path), None)
    assert isinstance(caught.value.__cause__, OSError)  # diffusers' own load_state_dict error
    assert "OSError" in caught.value.problem


def test_load_vae_passes_diffusers_refusals_through_and_declines_what_it_lacks(
    adapter: Any, tmp_path: Path
) -> None:
    config = write_diffusers_vae(tmp_path / "vae", IMAGE_KL)
    cls = IMAGE_KL.model_class()
    with pytest.raises(ValueError, match="Unknown quantization type, got fp8"):
        adapter.load_vae(
            VaeRequest(
                lambda: cls.from_config(config),
                tmp_path / "vae",
                device=CPU,
                quantization=QuantizationSpec("fp8"),
            )
        )
    with pytest.raises(NotImplementedError, match="decode_dtype"):
        adapter.load_vae(
            VaeRequest(
                lambda: cls.from_config(config),
                tmp_path / "vae",
                device=CPU,
                decode_dtype=torch.bfloat16,
            )
        )
