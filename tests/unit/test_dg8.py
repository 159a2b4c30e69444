"""DG-8: direct mode stages through a bounded host area, never the state dict.

Host memory growth during a direct DiT load (or a VAE stream onto CUDA) stays within a stated
staging area plus one tensor. The suite grants any loader `STAGING_ALLOWANCE` as its staging
area and loads a model four times larger, so a loader that stages the state dict (or any share
of it that grows with the model) passes the bound. Where the destination is host memory (the
CPU tier's direct device, `cpu`), the model itself is host memory: the bound there is the
model's bytes plus the staging area plus one tensor, measured in a fresh process warmed by the
same kind of load on a small model (SPEC, "Memory is the load's own"). Onto CUDA the model is on
the device: the bound is the staging area plus one tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fakes.dit import DiTConfig, write_dit_checkpoint
from fakes.vae import StandardVAE, VAEConfig
from fakes.vae_checkpoints import write_vae_checkpoint
from reference.kit.isolated import Attempt
from reference.kit.judging.evidence import data_bytes, evidence_missing, safetensors_files
from reference.kit.judging.load_paths import direct_device as device_for_direct_mode
from reference.kit.judging.load_paths import direct_load_host_growth
from reference.kit.seam import DIRECT_DIT, VAE_STREAM, SeamLoader, VaeRequest
from reference.report.memory import PeakSampler

MIB = 1024**2
# The staging area the suite grants a loader: buffers of a stated size, whatever the model.
STAGING_ALLOWANCE = 32 * MIB
# About 128 MiB of fp32 weights (four blocks of 8 * hidden**2 floats): four staging areas.
LARGE = DiTConfig(hidden=1024, heads=8, depth=4)
# Host bookkeeping of a load beside its tensors (module objects, headers, thread stacks).
HOST_SLACK = 4 * MIB


@pytest.mark.rule("DG-8")
@pytest.mark.capability(DIRECT_DIT)
def test_direct_dit_host_growth_stays_within_the_staging_area_plus_one_tensor(
    loader: SeamLoader,
    runtime_device: torch.device,
    isolated_with: Callable[..., Attempt],
    tmp_path: Path,
) -> None:
    """A direct DiT load's peak host anonymous growth, in a warmed fresh process: within the
    staging allowance plus the largest tensor (plus the model's bytes where the device is the
    CPU, whose tensors are host memory)."""
    reason = evidence_missing()
    if reason is not None:
        pytest.skip(reason)
    device = device_for_direct_mode(runtime_device)
    path, state = write_dit_checkpoint(tmp_path / "large", config=LARGE, shards=2)
    largest = max(t.nbytes for t in state.values())
    del state
    data = data_bytes(*safetensors_files(path))
    assert data >= 4 * STAGING_ALLOWANCE, "the model must dwarf the staging area"
    small, _ = write_dit_checkpoint(tmp_path / "warm")
    result = isolated_with(
        direct_load_host_growth,
        path,
        LARGE,
        device,
        deadline=120,
        warm=(direct_load_host_growth, (small, DiTConfig(), device), {}),
    )
    assert result.outcome == "returned", f"the direct load {result.outcome}: {result.message}"
    growth, devices, _ = result.value
    assert set(devices) == {device.type}, f"state left on {devices}"
    on_host = data if device.type == "cpu" else 0
    bound = on_host + STAGING_ALLOWANCE + largest + HOST_SLACK
    assert growth <= bound, (
        f"host anonymous memory grew {growth} bytes during a direct load of a {data}-byte"
        f" checkpoint onto {device}; the bound is {bound} (model on the host {on_host}, staging"
        f" {STAGING_ALLOWANCE}, one tensor {largest}): the load staged more than a bounded area"
    )


@pytest.mark.rule("DG-8")
@pytest.mark.capability(VAE_STREAM)
def test_vae_stream_onto_cuda_host_growth_stays_within_the_staging_area_plus_one_tensor(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    """A VAE streamed onto CUDA: host growth within the staging allowance plus one tensor."""
    if runtime_device.type != "cuda":
        pytest.skip("a VAE stream onto the CPU keeps its tensors in host memory: the gpu tier")
    config = VAEConfig(hidden=256)
    torch.manual_seed(0)
    state = {k: v.detach().clone() for k, v in StandardVAE(config).state_dict().items()}
    path = write_vae_checkpoint(state, tmp_path)
    largest = max(t.nbytes for t in state.values())
    data = data_bytes(*safetensors_files(path))
    del state
    with PeakSampler() as host:
        module, _ = loader.load_vae(
            VaeRequest(lambda: StandardVAE(config), path, device=runtime_device)
        )
    assert {t.device.type for t in module.state_dict().values()} == {"cuda"}
    bound = STAGING_ALLOWANCE + largest + HOST_SLACK
    assert host.anon_growth <= bound, (
        f"host anonymous memory grew {host.anon_growth} bytes streaming a {data}-byte VAE onto"
        f" {runtime_device}; the bound is {bound} (staging {STAGING_ALLOWANCE}, one tensor"
        f" {largest})"
    )
