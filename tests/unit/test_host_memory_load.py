"""Loads refused before they allocate past the host's memory (the reference's preflight).

`host_bytes` is the seam: the bytes the host has available, read from `MemAvailable` (or the
cgroup's limit) by default; a test passes a small budget instead of a checkpoint larger than
the machine. A CPU copy of every tensor is refused from the headers, before the model is built;
copies among adopted tensors are refused at the copy that would pass the budget; adoption
itself allocates nothing and loads within any budget; a streamed VAE is refused after its
preflight, before any tensor is read.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from reference.dit import load_dit
from reference.errors import HostMemoryError
from reference.kit.fakes.bench import BenchShapes, write_bench_checkpoints
from reference.kit.fakes.checkpoints import write_checkpoint
from reference.kit.fakes.corpus_models import CorpusDiT, CorpusVAE, mark, survivors
from reference.kit.fakes.corrupt import small_state
from reference.kit.fakes.layers import LINEAR_KINDS
from reference.plan import WeightLoadPlan
from reference.vae import load_vae

pytestmark = pytest.mark.internal

CPU = torch.device("cpu")
OFFLOAD = WeightLoadPlan(checkpoint_load_device=CPU)


def test_a_copy_of_every_tensor_beyond_the_host_is_refused_before_the_build(
    tmp_path: Path,
) -> None:
    path = write_checkpoint(small_state(), tmp_path)
    since = mark()
    with pytest.raises(HostMemoryError) as caught:
        load_dit(CorpusDiT, path, plan=OFFLOAD, kinds=LINEAR_KINDS, adopt=False, host_bytes=64)
    message = str(caught.value)
    assert message.startswith("transformer: copying every tensor needs 168 bytes")
    assert "64 available" in message
    assert "--dit-cpu-offload" in message
    assert survivors(since) == [], "the model was built before the refusal"


def test_a_copy_among_adopted_tensors_is_refused_at_the_copy_that_passes_the_budget(
    tmp_path: Path,
) -> None:
    # norm.weight in float32 for a bf16 slot: converted, so copied (8 bytes); the rest adopted
    path = write_checkpoint(small_state() | {"norm.weight": torch.ones(4)}, tmp_path)
    with pytest.raises(HostMemoryError, match=r"copying 'norm\.weight'"):
        load_dit(CorpusDiT, path, plan=OFFLOAD, kinds=LINEAR_KINDS, host_bytes=4)
    module, report = load_dit(CorpusDiT, path, plan=OFFLOAD, kinds=LINEAR_KINDS, host_bytes=8)
    assert report.copied.bytes == 8
    assert torch.equal(module.norm.weight, torch.ones(4, dtype=torch.bfloat16))


def test_adoption_loads_within_any_budget(tmp_path: Path) -> None:
    shapes = BenchShapes.for_bytes(1 << 20)
    dit, _ = write_bench_checkpoints(tmp_path, shapes)
    _, report = load_dit(shapes.dit, dit, plan=OFFLOAD, kinds=LINEAR_KINDS, host_bytes=0)
    assert report.copied.bytes == 0
    assert report.adopted.bytes > 0


def test_a_streamed_vae_beyond_the_host_is_refused_before_any_read(tmp_path: Path) -> None:
    path = write_checkpoint(small_state(), tmp_path)
    with pytest.raises(HostMemoryError) as caught:
        load_vae(CorpusVAE, path, device=CPU, host_bytes=100)
    message = str(caught.value)
    assert message.startswith("vae: streaming every tensor into the CPU model needs 168 bytes")
    assert "--component-direct-gpu-weight-loading.vae" in message
    _, report = load_vae(CorpusVAE, path, device=CPU, host_bytes=168)
    assert report.streamed.bytes == 168


GIB = 1 << 30
FACTORIES: dict[str, Callable[[int], torch.Tensor]] = {
    "eye": torch.eye,
    "eye-rectangular": lambda n: torch.eye(n, n),
    "arange": lambda n: torch.arange(n * n),
    "full": lambda n: torch.full((n, n), 1.0),
    "zeros": lambda n: torch.zeros(n, n),
}


@pytest.mark.parametrize("factory", FACTORIES.values(), ids=FACTORIES.keys())
def test_the_construction_guard_refuses_a_factory_call_beyond_its_budget_before_it_allocates(
    factory: Callable[[int], torch.Tensor],
) -> None:
    from reference.host_memory import allocation_guard

    with allocation_guard("transformer", budget=GIB):
        assert factory(16).numel() == 256  # n x n elements, well within the budget
        assert torch.empty(1 << 40, device="meta").is_meta  # meta allocates nothing
        with pytest.raises(HostMemoryError, match=r"^transformer: constructing the model"):
            factory(1 << 18)  # 2**36 elements: 256 GiB or more, refused before allocating
