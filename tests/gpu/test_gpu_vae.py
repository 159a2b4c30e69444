"""VAE-1 and VAE-13 on a real device: streaming onto CUDA keeps host memory bounded, and the
streamed VAE equals an ordinary load.

Host memory is the process's anonymous resident memory (reference.report.memory): a full CPU state
dict, or any copy of the checkpoint in process memory, would show there. Views of the file's mapping
are file-backed and do not. The VAE weighs about 110 MiB; its largest tensor 27 MiB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from fakes.vae import StandardVAE, VAEConfig
from fakes.vae_checkpoints import write_vae_checkpoint
from reference.kit.seam import VAE_STREAM, SeamLoader, VaeRequest
from reference.report.memory import PeakSampler

pytestmark = pytest.mark.capability(VAE_STREAM)

CONFIG = VAEConfig(hidden=512, groups=8)  # four 512x512x3x3x3 Conv3d weights of 27 MiB each
# Growth a streaming load may show once CUDA is initialised and a first streamed load has run
# (so kernels, the driver's pinned staging buffers and allocator bookkeeping already exist):
# Python objects, per-tensor records, the sampler's own thread. Stated, not measured.
SLACK = 16 * 1024**2
FACTOR = 2  # one tensor in flight, plus one converted copy of it


def state_of(config: VAEConfig, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v.detach().clone() for k, v in StandardVAE(config).state_dict().items()}


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu().reshape(-1).view(torch.uint8)


def release_freed_host_memory() -> None:
    """Hand freed heap memory back to the OS (glibc's malloc_trim), so that a load reusing it
    shows as growth instead of hiding in memory this process had already touched."""
    gc.collect()
    libc = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None
    if trim is not None:
        trim(0)


def stream(
    loader: SeamLoader, config: VAEConfig, path: Path, device: torch.device
) -> tuple[nn.Module, PeakSampler]:
    release_freed_host_memory()
    with PeakSampler() as sampler:
        module, _ = loader.load_vae(VaeRequest(lambda: StandardVAE(config), path, device=device))
        torch.cuda.synchronize(device)
    return module, sampler


@pytest.mark.rule("VAE-1", "VAE-13")
def test_streaming_onto_cuda_keeps_host_memory_bounded_and_equals_an_ordinary_load(
    loader: SeamLoader,
    gpu_device: torch.device,
    tmp_path: Path,
    gpu_figures: Callable[..., None],
) -> None:
    small = VAEConfig()
    stream(loader, small, write_vae_checkpoint(state_of(small, 0), tmp_path / "warm"), gpu_device)
    state = state_of(CONFIG, 1)
    path = write_vae_checkpoint(state, tmp_path / "vae")
    total = sum(t.nbytes for t in state.values())
    largest = max(t.nbytes for t in state.values())
    bound = FACTOR * largest + SLACK
    assert total > bound  # a full state dict in host memory would break the bound

    module, sampler = stream(loader, CONFIG, path, gpu_device)
    gpu_figures(
        "VAE-1 streamed VAE onto CUDA",
        {
            "checkpoint": total,
            "largest tensor": largest,
            "host anon growth": sampler.anon_growth,
            "host file-backed growth": sampler.file_growth,
        },
        f"bound {FACTOR} x largest + {SLACK // 1024**2} MiB",
    )
    assert sampler.anon_growth <= bound, (
        f"host anonymous memory grew {sampler.anon_growth} bytes while streaming; bound {bound}"
    )

    ordinary = StandardVAE(CONFIG)
    ordinary.load_state_dict(state)
    ordinary = ordinary.to(gpu_device).eval()
    loaded = module.state_dict()
    assert {t.device.type for t in loaded.values()} == {"cuda"}
    assert set(loaded) == set(state)
    for name, tensor in ordinary.state_dict().items():
        assert loaded[name].dtype == tensor.dtype, name
        assert torch.equal(bits(loaded[name]), bits(tensor)), name
    video = torch.randn(1, 3, 4, 8, 8, generator=torch.Generator().manual_seed(2)).to(gpu_device)
    with torch.no_grad():
        expected = ordinary(video)
        actual = module.eval()(video)
    assert expected.abs().sum() > 0
    assert torch.equal(actual, expected)
