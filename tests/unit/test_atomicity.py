"""CKPT-5, ZC-12, ZC-13: a load returns a complete component or raises; files are never written.

A failure in the middle of a load (a shard cut after its header was read, a post-load step that
fails) must leave the caller with nothing: no module returned, none reachable through the error,
none alive at all once the error is gone (the corpus models are tracked weakly). Every checkpoint
file is sealed by its hash before the load and checked after every test, including writes to the
loaded parameters; parameters never alias each other unless the model ties them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from pytest_mock import MockerFixture
from torch import nn

from fakes.checkpoints import write_checkpoint
from fakes.corpus_models import (
    CorpusDiT,
    corpus_pipeline,
    mark,
    survivors,
    while_building,
)
from fakes.corrupt import small_state, write_bad_checkpoint
from fakes.layers import LINEAR_KINDS, ReplicatedLinear
from reference.errors import CheckpointError
from reference.kit.judging.guards import Seal, failure_of, sealing
from reference.kit.judging.judge import assert_names
from reference.kit.judging.load_paths import (
    CAPABILITY,
    CHECKPOINT_PATHS,
    PIPELINE_COMPONENTS,
    direct_device,
    load_checkpoint,
    load_component,
)
from reference.kit.seam import (
    CHECKPOINT_SAFETY,
    DIRECT_DIT,
    FP8_DEFER,
    ZERO_COPY,
    DitRequest,
    Plan,
    PlanLike,
    SeamLoader,
    StateRequest,
)
from reference.read.checkpoint import TensorReader
from reference.read.staging import StagingReader
from reference.request.quantization import QuantizationSpec

PATHS = [
    pytest.param(p, marks=pytest.mark.capability(CAPABILITY[p]))
    for p in (*CHECKPOINT_PATHS, *PIPELINE_COMPONENTS)
]
CUT_SHARD = "model-00002-of-00002.safetensors"  # holds proj.bias, the last tensor read


# Every checkpoint file a test hands a loader is hashed before the load and checked after.
sealed = pytest.fixture(autouse=True)(sealing)


def load_on(
    path: str,
    loader: SeamLoader,
    tmp_path: Path,
    runtime_device: torch.device,
    *,
    shards: int = 2,
) -> tuple[Path, Callable[[], object]]:
    """Write the corpus base in `shards` files for `path` and return (its folder, the load)."""
    if path in PIPELINE_COMPONENTS:
        folder = corpus_pipeline(tmp_path, emptied=path)
        write_checkpoint(small_state(), folder, shards=shards)
        return folder, lambda: load_component(loader, tmp_path, path, runtime_device=runtime_device)
    folder = tmp_path / "ckpt"
    index = write_checkpoint(small_state(), folder, shards=shards)
    return folder, lambda: load_checkpoint(path, loader, index, runtime_device=runtime_device)


def cutter(shard: Path, seal: Seal) -> Callable[[], None]:
    """Cuts the last byte off `shard` once, the first time a model is built, and re-seals it:
    another process truncating the file after its header was read."""
    done = threading.Event()

    def cut() -> None:
        if not done.is_set():
            done.set()
            os.truncate(shard, shard.stat().st_size - 1)
            seal.add(shard)

    return cut


# --- a failure in the middle of a load (CKPT-5) --------------------------------------------------


@pytest.mark.rule("CKPT-4", "CKPT-5")
@pytest.mark.parametrize("path", PATHS)
def test_shard_cut_during_the_load_leaves_nothing_behind(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, sealed: Seal, path: str
) -> None:
    folder, load = load_on(path, loader, tmp_path, runtime_device)
    sealed.add(tmp_path)
    since = mark()
    with while_building(cutter(folder / CUT_SHARD, sealed)):
        error = failure_of(load)
    assert isinstance(error, ValueError), f"{type(error).__name__}: {error}"
    assert_names(error, CUT_SHARD, "proj.bias")
    assert survivors(since) == [], "the half-loaded model is still reachable"


@pytest.mark.internal
@pytest.mark.reference_only("spies on the reference's own reader")
@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=pytest.mark.capability(CAPABILITY[p]))
        for p in ("dit-adopt", "dit-direct", "vae-stream", "transformer")
    ],
)
def test_reference_cut_lands_after_the_first_tensors_were_read(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    sealed: Seal,
    *,
    mocker: MockerFixture,
    path: str,
) -> None:
    """For the reference the cut above is mid-stream: headers read, two tensors in, one fails.
    A direct load reads through the staging reader, whose threads read ahead of the caller:
    the cut they find is raised by the caller's next read, up to proj.bias; onto the CPU, where
    the files are cached, the reader maps them when it is made (to copy out of the maps), and
    the map's check finds the cut then, before any read."""
    folder, load = load_on(path, loader, tmp_path, runtime_device)
    sealed.add(tmp_path)
    reads = mocker.spy(StagingReader if path == "dit-direct" else TensorReader, "read")
    with while_building(cutter(folder / CUT_SHARD, sealed)):
        error = failure_of(load)
    names = [c.args[1] for c in reads.call_args_list]
    expected = ["proj.weight", "norm.weight", "proj.bias"]
    assert names == (expected[: len(names)] if path == "dit-direct" else expected), names
    assert isinstance(reads.spy_exception if names else error, CheckpointError)


@pytest.mark.rule("CKPT-5", "FP8-5")
@pytest.mark.capability(ZERO_COPY, FP8_DEFER)
def test_failure_after_every_tensor_is_in_leaves_nothing_behind(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    sealed: Seal,
    offload_plan: PlanLike,
) -> None:
    # every slot is filled, then post-load processing refuses: quantization was asked for, but
    # the model was built without it
    checkpoint = write_checkpoint(small_state(), tmp_path)
    sealed.add(tmp_path)
    since = mark()
    error = failure_of(
        lambda: loader.load_dit(
            DitRequest(
                CorpusDiT,
                checkpoint,
                plan=offload_plan,
                kinds=LINEAR_KINDS,
                quantization=QuantizationSpec("fp8"),
            )
        )
    )
    # FP8-5 names no error type: the load must raise (failure_of), naming what was asked for.
    assert_names(error, "fp8")
    assert survivors(since) == [], "the loaded-but-refused model is still reachable"


# --- checkpoint files are never written (ZC-13, CKPT-5) ------------------------------------------


@pytest.mark.capability(CHECKPOINT_SAFETY)
@pytest.mark.rule("ZC-13", "CKPT-5")
@pytest.mark.parametrize("shards", [1, 2], ids=["one-file", "sharded"])
@pytest.mark.parametrize("path", PATHS)
def test_writing_to_every_loaded_tensor_leaves_the_files_unchanged(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    sealed: Seal,
    *,
    path: str,
    shards: int,
) -> None:
    """Catches a loader that maps a checkpoint shared instead of copy-on-write, for one-file
    checkpoints (the common case) as for shards: a write to an adopted parameter reaches the
    file."""
    folder, load = load_on(path, loader, tmp_path, runtime_device, shards=shards)
    sealed.add(tmp_path)
    module = load()
    assert isinstance(module, nn.Module)
    state = module.state_dict()
    assert set(state) == set(small_state())
    with torch.no_grad():
        for tensor in state.values():
            tensor.view(-1).view(torch.uint8).bitwise_not_()
    # the seal checks the bytes at teardown; a fresh read sees the files, not the writes
    for name, tensor in small_state().items():
        fresh = loader.read_checkpoint_tensor(folder, name, device=torch.device("cpu"))
        assert torch.equal(fresh, tensor), name


# --- aliasing (ZC-12) ---------------------------------------------------------------------------


class TiedPair(nn.Module):
    """Two standard linears whose weights the model ties: one parameter under two names."""

    def __init__(self) -> None:
        super().__init__()
        self.a = ReplicatedLinear(4, 8, bias=False)
        self.b = ReplicatedLinear(4, 8, bias=False)
        self.b.weight = self.a.weight


@pytest.mark.rule("ZC-12")
@pytest.mark.capability(ZERO_COPY)
@pytest.mark.parametrize("names", [("a.weight",), ("a.weight", "b.weight")], ids=["one", "both"])
def test_tied_parameters_load_from_files_as_one(
    loader: SeamLoader,
    tmp_path: Path,
    sealed: Seal,
    offload_plan: PlanLike,
    names: tuple[str, ...],
) -> None:
    weight = torch.randn(8, 4)
    checkpoint = write_checkpoint({n: weight.clone() for n in names}, tmp_path)
    sealed.add(tmp_path)
    module, report = loader.load_dit(
        DitRequest(TiedPair, checkpoint, plan=offload_plan, kinds=LINEAR_KINDS)
    )
    assert isinstance(module, TiedPair)
    assert module.a.weight is module.b.weight
    assert torch.equal(module.a.weight, weight)
    assert report.adopted.tensors + report.copied.tensors == 1


@pytest.mark.rule("ZC-12", "CKPT-4")
@pytest.mark.capability(ZERO_COPY, DIRECT_DIT)
@pytest.mark.parametrize("path", ["dit-adopt", "dit-direct"])
def test_two_names_over_overlapping_bytes_in_a_file_are_refused(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, sealed: Seal, path: str
) -> None:
    bad = write_bad_checkpoint("offsets-overlap", tmp_path / "ckpt")
    sealed.add(tmp_path)
    since = mark()
    error = failure_of(
        lambda: load_checkpoint(path, loader, bad.path, runtime_device=runtime_device)
    )
    assert isinstance(error, ValueError), f"{type(error).__name__}: {error}"
    assert_names(error, bad.file)
    assert any(e in str(error) for e in bad.entries if e), f"names no overlapping tensor: {error}"
    assert survivors(since) == []


def pair() -> nn.Module:
    with torch.device("meta"):
        return nn.ModuleDict(
            {"a": ReplicatedLinear(3, 4, bias=False), "b": ReplicatedLinear(3, 4, bias=False)}
        )


@pytest.mark.rule("ZC-12")
@pytest.mark.capability(DIRECT_DIT)
def test_direct_mode_adopts_shared_or_overlapping_device_bytes_once(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, sealed: Seal
) -> None:
    """Two names fed one tensor, or overlapping views of one storage, on the load device: at
    most one of them becomes that memory, the other holds its values in memory of its own
    (whether either is adopted at all is DG-5's to judge, below)."""
    sealed.add(tmp_path)  # no file is involved: the tensors are handed over in memory
    base = torch.randn(24).to(direct_device(runtime_device))
    feeds = {
        "one-tensor": [("a.weight", base[:12].view(4, 3)), ("b.weight", base[:12].view(4, 3))],
        "overlap": [("a.weight", base[0:12].view(4, 3)), ("b.weight", base[6:18].view(4, 3))],
    }
    for what, tensors in feeds.items():
        module = pair()
        report = loader.load_full_state(
            StateRequest(module, tensors, plan=direct_plan_on(runtime_device), kinds=LINEAR_KINDS)
        )
        assert report.adopted.tensors <= 1, f"{what}: both names adopted the one memory"
        a, b = module.get_parameter("a.weight"), module.get_parameter("b.weight")
        assert torch.equal(b, dict(tensors)["b.weight"]), f"{what}: b.weight's values changed"
        assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr(), (
            f"{what}: a.weight and b.weight share their bytes"
        )


@pytest.mark.rule("DG-5")
@pytest.mark.capability(DIRECT_DIT)
def test_direct_mode_adopts_disjoint_views_of_one_device_storage(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, sealed: Seal
) -> None:
    """Views that share a storage but no byte are each eligible: both are adopted."""
    sealed.add(tmp_path)
    base = torch.randn(24).to(direct_device(runtime_device))
    disjoint = [("a.weight", base[0:12].view(4, 3)), ("b.weight", base[12:24].view(4, 3))]
    report = loader.load_full_state(
        StateRequest(pair(), disjoint, plan=direct_plan_on(runtime_device), kinds=LINEAR_KINDS)
    )
    assert report.adopted.tensors == 2, f"{report.adopted.tensors} of 2 disjoint views adopted"


def direct_plan_on(runtime_device: torch.device) -> Plan:
    """The suite's own direct plan (these tests are marked direct_dit alone: they may not ask
    the loader's plans capability for one)."""
    return Plan(
        checkpoint_load_device=direct_device(runtime_device), load_full_state_dict_on_device=True
    )
