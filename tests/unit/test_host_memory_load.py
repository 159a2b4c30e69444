"""Loads refused before they allocate past the host's memory (the reference's preflight).

`host_bytes` is the seam: the bytes the host has available, read from `MemAvailable` (or the
cgroup's limit) by default; a test passes a small budget instead of a checkpoint larger than
the machine. A CPU copy of every tensor is refused from the headers, before the model is built;
copies among adopted tensors are refused at the copy that would pass the budget; adoption
itself allocates nothing and loads within any budget; a streamed VAE is refused after its
preflight, before any tensor is read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fakes.bench import BenchShapes, write_bench_checkpoints
from fakes.checkpoints import write_checkpoint
from fakes.corpus_models import CorpusDiT, CorpusVAE, mark, survivors
from fakes.corrupt import small_state
from fakes.layers import LINEAR_KINDS
from reference.errors import HostMemoryError
from reference.load.dit import DiTOptions, load_dit
from reference.load.vae import VAEOptions, load_vae
from reference.request.plan import WeightLoadPlan

pytestmark = pytest.mark.internal

CPU = torch.device("cpu")
OFFLOAD = WeightLoadPlan(checkpoint_load_device=CPU)


def test_a_copy_of_every_tensor_beyond_the_host_is_refused_before_the_build(
    tmp_path: Path,
) -> None:
    path = write_checkpoint(small_state(), tmp_path)
    since = mark()
    with pytest.raises(HostMemoryError) as caught:
        load_dit(
            CorpusDiT,
            path,
            plan=OFFLOAD,
            kinds=LINEAR_KINDS,
            options=DiTOptions(adopt=False, host_bytes=64),
        )
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
        load_dit(
            CorpusDiT, path, plan=OFFLOAD, kinds=LINEAR_KINDS, options=DiTOptions(host_bytes=4)
        )
    module, report = load_dit(
        CorpusDiT, path, plan=OFFLOAD, kinds=LINEAR_KINDS, options=DiTOptions(host_bytes=8)
    )
    assert report.copied.bytes == 8
    assert torch.equal(module.norm.weight, torch.ones(4, dtype=torch.bfloat16))


def test_adoption_loads_within_any_budget(tmp_path: Path) -> None:
    shapes = BenchShapes.for_bytes(1 << 20)
    dit, _ = write_bench_checkpoints(tmp_path, shapes)
    _, report = load_dit(
        shapes.dit, dit, plan=OFFLOAD, kinds=LINEAR_KINDS, options=DiTOptions(host_bytes=0)
    )
    assert report.copied.bytes == 0
    assert report.adopted.bytes > 0


def test_a_streamed_vae_beyond_the_host_is_refused_before_any_read(tmp_path: Path) -> None:
    path = write_checkpoint(small_state(), tmp_path)
    with pytest.raises(HostMemoryError) as caught:
        load_vae(CorpusVAE, path, device=CPU, options=VAEOptions(host_bytes=100))
    message = str(caught.value)
    assert message.startswith("vae: streaming every tensor into the CPU model needs 168 bytes")
    assert "--component-direct-gpu-weight-loading.vae" in message
    _, report = load_vae(CorpusVAE, path, device=CPU, options=VAEOptions(host_bytes=168))
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
    from reference.place.host_memory import allocation_guard

    with allocation_guard("transformer", budget=GIB):
        assert factory(16).numel() == 256  # n x n elements, well within the budget
        assert torch.empty(1 << 40, device="meta").is_meta  # meta allocates nothing
        with pytest.raises(HostMemoryError, match=r"^transformer: constructing the model"):
            factory(1 << 18)  # 2**36 elements: 256 GiB or more, refused before allocating


def test_a_table_derived_from_small_tensors_is_refused_before_it_is_computed() -> None:
    """`torch.outer` of two small tensors asks no factory for its result: the guard learns its
    size on meta copies of its inputs and refuses it before it runs, naming the config key."""
    from reference.place.host_memory import allocation_guard

    positions = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB, made outside the guard
    freqs = torch.ones(1 << 12)
    config = {"rope_max_seq_len": 1 << 20, "heads": 4, "flag": True}
    with allocation_guard("transformer", budget=GIB, config=config):
        small = torch.outer(positions[:8], freqs[:8])  # 256 B: runs
        assert small.shape == (8, 8)
        with pytest.raises(HostMemoryError, match=r"\[1048576, 4096\].*rope_max_seq_len=1048576"):
            torch.outer(positions, freqs)  # 16 GiB: refused before it is computed


def test_views_and_in_place_ops_cost_nothing_and_ops_meta_cannot_run_are_let_through() -> None:
    from reference.place.host_memory import allocation_guard

    base = torch.zeros(1 << 20)
    with allocation_guard("vae", budget=1 << 20):  # 1 MiB: less than `base` itself
        assert base.expand(1 << 20, 1 << 20).shape[0] == 1 << 20  # a view: no allocation
        base.mul_(2)  # in place
        assert base.view(-1, 2).shape == (1 << 19, 2)
        assert torch.nonzero(base[:4]).numel() == 0  # data-dependent: runs as it is


def test_the_budget_is_what_the_checkpoint_explains_and_never_more_than_the_host() -> None:
    from reference.place.host_memory import TABLE_FLOOR, construction_budget

    assert construction_budget(checkpoint_bytes=None, ordinary=True, available=5) == 5
    assert construction_budget(checkpoint_bytes=10, ordinary=False, available=GIB * 64) == (
        TABLE_FLOOR
    )
    big = 8 * GIB
    assert construction_budget(checkpoint_bytes=big, ordinary=False, available=GIB * 64) == big
    assert construction_budget(checkpoint_bytes=big, ordinary=True, available=GIB * 64) == (5 * big)
    assert construction_budget(checkpoint_bytes=big, ordinary=True, available=GIB) == GIB


def test_the_keys_named_are_those_that_size_the_widest_dimension() -> None:
    from reference.place.host_memory import sizing_keys

    config = {"base_dim": 96, "z_dim": 16, "heads": 4, "name": "x", "norm": True, "scale": 1.5}
    assert sizing_keys(config, (384, 384, 3, 3, 3)) == ["base_dim=96"]  # 4 x base_dim
    assert sizing_keys(config, (16, 4)) == ["z_dim=16", "heads=4"]
    assert sizing_keys(config, ()) == []


def test_available_memory_is_the_lower_of_meminfo_and_the_cgroup_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Platform facts from files: MemAvailable in kB, and cgroup v2's limit minus its use."""
    from reference.place import host_memory

    meminfo, cgroup = tmp_path / "meminfo", tmp_path / "cgroup"
    cgroup.mkdir()
    meminfo.write_text("MemTotal: 8000 kB\nMemAvailable: 4000 kB\n")
    (cgroup / "memory.max").write_text("3000000\n")
    (cgroup / "memory.current").write_text("1000000\n")
    monkeypatch.setattr(host_memory, "MEMINFO", meminfo)
    monkeypatch.setattr(host_memory, "CGROUP", cgroup)
    assert host_memory.available_host_bytes() == 2_000_000  # the cgroup's room, under 4000 kB
    (cgroup / "memory.max").write_text("max\n")
    assert host_memory.available_host_bytes() == 4_096_000
    meminfo.write_text("MemAvailable: lots\n")
    assert host_memory.available_host_bytes() is None  # neither is known: no check


def test_a_guard_without_a_known_budget_checks_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from reference.place import host_memory

    monkeypatch.setattr(host_memory, "available_host_bytes", lambda: None)
    with host_memory.allocation_guard("vae"):
        assert torch.empty(1 << 10).numel() == 1 << 10


def _ops() -> dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    return {
        "outer": torch.outer,
        "div-scalar": lambda a, b: a / 3.0,
        "rpow": lambda a, b: 10000.0 ** (a / 64),
        "broadcast-product": lambda a, b: a[:, None] * b[None, :],
        "cos": lambda a, b: a.cos(),
        "float": lambda a, b: a.double().float(),
        "to": lambda a, b: a.to(torch.bfloat16),
        "cat": lambda a, b: torch.cat([a[:, None], a[:, None]], dim=-1),
        "stack": lambda a, b: torch.stack([b, b], dim=1),
        "repeat": lambda a, b: b.repeat(3, 2),
        "repeat_interleave": lambda a, b: torch.outer(a, b).repeat_interleave(2, dim=1),
        "clone": lambda a, b: b.clone(),
    }


@pytest.mark.parametrize("op", _ops().values(), ids=_ops().keys())
def test_the_shape_arithmetic_sizes_a_derived_table_at_least_as_meta_does(
    op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> None:
    """The guard sizes known ops without running them on meta; its count is never below the
    bytes meta gives for the same call, and the shape it names is the result's."""
    from reference.place.host_memory import allocation_guard

    a, b = torch.arange(96, dtype=torch.float32), torch.ones(5)
    with allocation_guard("transformer", budget=GIB):
        expected = op(a, b)
    shape = re.escape(str(list(expected.shape)))
    with (
        allocation_guard("transformer", budget=expected.nbytes - 1),
        pytest.raises(HostMemoryError, match=shape),
    ):
        op(a, b)


def test_one_mode_watches_nested_guards_each_against_its_own_budget() -> None:
    from reference.place.host_memory import allocation_guard

    modes = torch.overrides._get_current_function_mode_stack()  # type: ignore[no-untyped-call]
    with allocation_guard("outer", budget=GIB), allocation_guard("inner", budget=1 << 12):
        inside = torch.overrides._get_current_function_mode_stack()  # type: ignore[no-untyped-call]
        assert len(inside) == len(modes) + 1
        with pytest.raises(HostMemoryError, match=r"^inner: "):
            torch.outer(torch.ones(64), torch.ones(64))  # 16 KiB: past the inner budget only
        assert torch.outer(torch.ones(16), torch.ones(16)).numel() == 256
