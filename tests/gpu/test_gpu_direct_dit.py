"""DG-5 on a real device: direct mode adopts the tensors it read onto CUDA, and its peak device
memory is the model plus one tensor in flight.

The model is large enough (about 128 MiB of float32) that the bound means something: a loader that
kept the whole state dict on the device beside the model would peak near twice the model.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
import torch
from pytest_mock import MockerFixture
from torch import nn

from fakes.dit import DiTConfig, TinyDiT, write_dit_checkpoint
from fakes.layers import (
    LINEAR_KINDS,
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from reference.kit.seam import DIRECT_DIT, DitRequest, Plan, PlanLike, SeamLoader
from reference.read.checkpoint import TensorReader

pytestmark = pytest.mark.capability(DIRECT_DIT)

# 4 blocks of 8 * 1024^2 float32 weights: 128 MiB. Every tensor is a multiple of 512 bytes (the
# allocator's unit) except two tiny ones, and every large one a multiple of 4 MiB.
CONFIG = DiTConfig(hidden=1024, heads=8, depth=4)
# Allocator rounding: blocks are booked in 512-byte units (the tiny tensors round up by < 512
# bytes each) and a cached large block up to 1 MiB bigger than asked is handed out whole when the
# rest is too small to split (c10 CUDACachingAllocator, kMinBlockSize / kSmallSize); the buffer
# hook's temporaries are a few KiB. 2 MiB covers all of it and is < 2% of the model, far below
# the whole extra state dict (another 128 MiB) that the bound is there to exclude.
SLACK = 2 * 1024**2


def build() -> nn.Module:
    return TinyDiT(CONFIG)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Mapping[str, int]]:
    """The 128 MiB checkpoint, and the byte size of each tensor in it, by name."""
    path, state = write_dit_checkpoint(tmp_path_factory.mktemp("dit"), config=CONFIG)
    return path, {name: t.nbytes for name, t in state.items()}


@pytest.fixture
def direct_plan(gpu_device: torch.device) -> PlanLike:
    return Plan(checkpoint_load_device=gpu_device, load_full_state_dict_on_device=True)


def eligible(module: nn.Module) -> set[str]:
    """Parameters DG-5 must adopt: those of the standard linears that do not override their
    loader (ZC-2..8 all hold on the device for them)."""
    return {
        f"{prefix}.{leaf}"
        for prefix, sub in module.named_modules()
        if isinstance(sub, (ReplicatedLinear, ColumnParallelLinear, RowParallelLinear))
        and not isinstance(sub, MergedColumnParallelLinear)
        for leaf, _ in sub.named_parameters(recurse=False)
    }


def copied_in_any_case(module: nn.Module) -> set[str]:
    """Slots DG-5 lets a loader copy: the merged QKV (its loader is an override, ZC-3), the
    plain-function loader of `pos_embed` (ZC-2) and persistent buffers (not parameters)."""
    merged = {
        f"{prefix}.{leaf}"
        for prefix, sub in module.named_modules()
        if isinstance(sub, MergedColumnParallelLinear)
        for leaf, _ in sub.named_parameters(recurse=False)
    }
    plain_function = {
        name
        for name, param in module.named_parameters()
        if "weight_loader" in param.__dict__ and not hasattr(param.weight_loader, "__self__")
    }
    return merged | plain_function | {name for name, _ in module.named_buffers()}


@pytest.mark.rule("DG-4", "DG-5")
def test_direct_mode_allocates_each_eligible_tensor_once_on_the_device(
    loader: SeamLoader,
    direct_plan: PlanLike,
    gpu_device: torch.device,
    checkpoint: tuple[Path, Mapping[str, int]],
    gpu_figures: Callable[..., None],
) -> None:
    """Judged by what any loader leaves: the device's cumulative allocations during the load.
    Read straight onto the device and adopted, an eligible tensor is allocated there once; a
    copy (or a second read) allocates it twice."""
    path, sizes = checkpoint
    gc.collect()
    torch.cuda.synchronize(gpu_device)
    torch.cuda.reset_accumulated_memory_stats(gpu_device)
    before = torch.cuda.memory_stats(gpu_device)["allocated_bytes.all.allocated"]
    module, _ = loader.load_dit(DitRequest(build, path, plan=direct_plan, kinds=LINEAR_KINDS))
    torch.cuda.synchronize(gpu_device)
    allocated = torch.cuda.memory_stats(gpu_device)["allocated_bytes.all.allocated"] - before
    assert {t.device.type for t in [*module.parameters(), *module.buffers()]} == {"cuda"}
    model = sum(sizes.values())
    may_copy = sum(sizes[name] for name in copied_in_any_case(module) if name in sizes)
    gpu_figures(
        "DG-4/DG-5 device bytes allocated by a direct DiT load",
        {"checkpoint": model, "copies allowed": may_copy, "allocated": allocated},
        f"allocated/checkpoint {allocated / model:.3f}; bound checkpoint + copies allowed + slack",
    )
    assert allocated <= model + may_copy + SLACK, (
        f"{allocated} bytes allocated on the device for a {model}-byte checkpoint: eligible"
        " tensors were copied or read more than once"
    )


@pytest.mark.rule("DG-5")
@pytest.mark.reference_only("it spies on the reference's reader to match each tensor it read")
def test_direct_mode_adopts_the_tensors_it_read_onto_the_device(
    loader: SeamLoader,
    direct_plan: PlanLike,
    gpu_device: torch.device,
    checkpoint: tuple[Path, Mapping[str, int]],
    mocker: MockerFixture,
) -> None:
    path, sizes = checkpoint
    produced: dict[str, list[torch.Tensor]] = {}
    real_read = TensorReader.read

    def read(reader: TensorReader, name: str, *, device: torch.device) -> torch.Tensor:
        tensor = real_read(reader, name, device=device)
        produced.setdefault(name, []).append(tensor)  # kept alive: no address is reused
        return tensor

    mocker.patch.object(TensorReader, "read", autospec=True, side_effect=read)
    module, _ = loader.load_dit(DitRequest(build, path, plan=direct_plan, kinds=LINEAR_KINDS))
    assert {name: len(reads) for name, reads in produced.items()} == dict.fromkeys(sizes, 1)
    assert all(reads[0].device.type == "cuda" for reads in produced.values())
    adopted = eligible(module)
    assert len(adopted) == 4 * 3 * 2 + 2 * 2  # proj, mlp_up, mlp_down per block; patch, head
    for name, param in module.named_parameters():
        assert param.device.type == "cuda", name
        if name in adopted:
            assert param.data_ptr() == produced[name][0].data_ptr(), (
                f"{name}: eligible, but the parameter is a copy of the tensor read onto the device"
            )


@pytest.mark.rule("DG-5")
def test_direct_peak_device_memory_is_the_model_plus_the_largest_tensor(
    loader: SeamLoader,
    direct_plan: PlanLike,
    gpu_device: torch.device,
    checkpoint: tuple[Path, Mapping[str, int]],
    gpu_figures: Callable[..., None],
) -> None:
    path, sizes = checkpoint
    largest = max(sizes.values())
    gc.collect()  # measure from a clean state: nothing of an earlier test left to free or reuse
    torch.cuda.synchronize(gpu_device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(gpu_device)
    before = torch.cuda.memory_allocated(gpu_device)

    module, _ = loader.load_dit(DitRequest(build, path, plan=direct_plan, kinds=LINEAR_KINDS))
    torch.cuda.synchronize(gpu_device)
    peak = torch.cuda.max_memory_allocated(gpu_device) - before
    held = torch.cuda.memory_allocated(gpu_device) - before

    tensors = {t.untyped_storage().data_ptr(): t for t in [*module.parameters(), *module.buffers()]}
    assert {t.device.type for t in tensors.values()} == {"cuda"}
    model = sum(t.untyped_storage().nbytes() for t in tensors.values())
    assert model >= 128 * 1024**2  # the bound is meaningful only for a model of this size
    gpu_figures(
        "DG-5 direct DiT load on CUDA",
        {"model": model, "largest tensor": largest, "peak": peak, "held after": held},
        f"peak/model {peak / model:.3f}; bound model + largest + {SLACK // 1024**2} MiB slack",
    )
    assert held <= model + SLACK, "the load left device memory allocated beyond the model"
    assert peak <= model + largest + SLACK, (
        f"peak {peak} bytes > model {model} + largest tensor {largest} + slack {SLACK}"
    )
