"""DG-4, DG-5: direct loading of a DiT onto its device.

Direct mode needs a non-CPU load device (PLAN-3). In the CPU tier that device is `meta`: tensors
carry no data there, but where each read lands, what is adopted and why are all observable. The
gpu tier reruns these tests on CUDA, where values, device `data_ptr` identity and peak memory are
checked too. The truth table of the direct-mode predicate (DG-5 with ZC-2..8) is in test_zc.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import safetensors.torch
import torch
from pytest_mock import MockerFixture
from torch import nn

from fakes.dit import TinyDiT, rotary_freqs, write_dit_checkpoint
from fakes.layers import (
    LINEAR_KINDS,
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from reference.adapter import DIRECT_DIT, LoaderAdapter, PlanLike
from reference.checkpoint import TensorReader, open_checkpoint

pytestmark = pytest.mark.capability(DIRECT_DIT)

CPU = torch.device("cpu")
NEEDS_DATA = (
    "needs a device that holds data; the CPU tier's direct device is meta (the gpu tier runs this)"
)


@pytest.fixture
def direct_device(runtime_device: torch.device) -> torch.device:
    """Where direct mode loads: the runtime device, or `meta` when that is the CPU."""
    return runtime_device if runtime_device.type != "cpu" else torch.device("meta")


@pytest.fixture
def direct_plan(loader: LoaderAdapter, direct_device: torch.device) -> PlanLike:
    return loader.plan_for_component(
        checkpoint_load_device=direct_device,
        needs_device_weight_postprocess=False,
        component_cpu_offload=False,
        load_full_state_dict_on_device=True,
    )


def on_device(module: nn.Module) -> set[torch.device]:
    return {t.device for t in [*module.parameters(), *module.buffers()]}


def is_on(device: torch.device, wanted: torch.device) -> bool:
    return device.type == wanted.type and wanted.index in (None, device.index)


def standard_linear_params(module: nn.Module) -> set[str]:
    return {
        f"{prefix}.{leaf}"
        for prefix, sub in module.named_modules()
        if isinstance(sub, (ReplicatedLinear, ColumnParallelLinear, RowParallelLinear))
        and not isinstance(sub, MergedColumnParallelLinear)
        for leaf, _ in sub.named_parameters(recurse=False)
    }


@pytest.mark.rule("DG-4")
def test_direct_plan_loads_on_the_runtime_device(
    direct_plan: PlanLike, direct_device: torch.device
) -> None:
    assert direct_plan.checkpoint_load_device == direct_device
    assert direct_plan.load_full_state_dict_on_device is True
    assert direct_plan.defer_cpu_offload is False


@pytest.mark.rule("DG-4")
@pytest.mark.parametrize("shards", [1, 3])
def test_direct_mode_reads_each_tensor_once_straight_onto_the_device(
    loader: LoaderAdapter,
    direct_plan: PlanLike,
    direct_device: torch.device,
    tmp_path: Path,
    *,
    mocker: MockerFixture,
    shards: int,
) -> None:
    path, state = write_dit_checkpoint(tmp_path, shards=shards)
    reads = mocker.spy(TensorReader, "read")
    whole_file = [mocker.spy(safetensors.torch, f) for f in ("load_file", "load")]
    module, report = loader.load_dit(TinyDiT, path, plan=direct_plan, kinds=LINEAR_KINDS)
    assert [spy.call_count for spy in whole_file] == [0, 0]  # whatever reader the loader uses
    assert all(is_on(device, direct_device) for device in on_device(module))
    assert report.plan.load_full_state_dict_on_device is True
    if not reads.call_count:
        pytest.skip("the loader does not read through reference.checkpoint.TensorReader")
    assert sorted(c.args[1] for c in reads.call_args_list) == sorted(state)
    assert {c.kwargs["device"] for c in reads.call_args_list} == {direct_device}


@pytest.mark.rule("DG-5")
def test_direct_mode_adopts_the_eligible_tensors_on_the_device(
    loader: LoaderAdapter, direct_plan: PlanLike, tmp_path: Path
) -> None:
    path, state = write_dit_checkpoint(tmp_path)
    module, report = loader.load_dit(TinyDiT, path, plan=direct_plan, kinds=LINEAR_KINDS)
    adopted = {r.name for r in report.records if r.how == "adopted"}
    assert adopted == standard_linear_params(module)
    assert all(not module.get_parameter(name).requires_grad for name in adopted)
    rules = {reason.split(":")[0] for reason in report.refusals.values()}
    assert rules == {"ZC-2", "ZC-3"}  # never ZC-1 / DG-5: every tensor is on the load device
    assert report.copied[0] == len(state) - len(adopted)


@pytest.mark.rule("DG-4")
def test_direct_mode_values_equal_the_checkpoint(
    loader: LoaderAdapter, direct_plan: PlanLike, direct_device: torch.device, tmp_path: Path
) -> None:
    if direct_device.type == "meta":
        pytest.skip(f"values {NEEDS_DATA}")
    path, state = write_dit_checkpoint(tmp_path, dtype=torch.bfloat16)
    module, _ = loader.load_dit(TinyDiT, path, plan=direct_plan, kinds=LINEAR_KINDS)
    for name, tensor in module.state_dict().items():
        assert torch.equal(tensor.cpu(), state[name].float()), name
    # recomputed on the device: equal to construction up to the last bit of pow on that device
    torch.testing.assert_close(module.freqs.cpu(), rotary_freqs(module.config.hidden))


@pytest.mark.rule("DG-5")
def test_direct_adoption_keeps_the_device_tensor(
    loader: LoaderAdapter, direct_plan: PlanLike, direct_device: torch.device
) -> None:
    if direct_device.type == "meta":
        pytest.skip(f"data_ptr identity {NEEDS_DATA}")
    tensors = {"0.weight": torch.randn(4, 3, device=direct_device)}
    with torch.device("meta"):
        module = nn.Sequential(ReplicatedLinear(3, 4, bias=False))
    report = loader.load_full_state(module, tensors.items(), plan=direct_plan, kinds=LINEAR_KINDS)
    assert report.adopted[0] == 1
    assert module[0].weight.data_ptr() == tensors["0.weight"].data_ptr()


def allocated(nbytes: int) -> int:
    """Bytes the CUDA caching allocator books for a tensor of `nbytes` (512-byte blocks)."""
    return -(-nbytes // 512) * 512


@pytest.mark.rule("DG-5")
def test_direct_peak_memory_is_model_plus_one_tensor(
    loader: LoaderAdapter, direct_plan: PlanLike, direct_device: torch.device, tmp_path: Path
) -> None:
    if direct_device.type != "cuda":
        pytest.skip("peak device memory needs torch.cuda memory statistics (the gpu tier)")
    path, _ = write_dit_checkpoint(tmp_path)
    torch.cuda.synchronize(direct_device)
    torch.cuda.reset_peak_memory_stats(direct_device)
    before = torch.cuda.memory_allocated(direct_device)
    module, _ = loader.load_dit(TinyDiT, path, plan=direct_plan, kinds=LINEAR_KINDS)
    torch.cuda.synchronize(direct_device)
    peak = torch.cuda.max_memory_allocated(direct_device) - before
    model = sum(allocated(t.nbytes) for t in [*module.parameters(), *module.buffers()])
    largest = max(allocated(i.nbytes) for i in open_checkpoint(path).tensors.values())
    assert peak <= model + largest, (peak, model, largest)
