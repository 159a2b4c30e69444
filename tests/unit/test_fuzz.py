"""CKPT-4 fuzzing, mid-stream truncation, and checkpoint files that are never written (ZC-13).

Property: a valid checkpoint with one mutation either opens and reads back exactly what its files
say (bit-exactly the original state when the mutation is harmless) or raises `CheckpointError`
naming a file of the checkpoint; never another exception. The properties reach the loader through
the adapter (`inspect_checkpoint`, `read_checkpoint_tensor`); tests of the reference's own
tensor reader across file changes are internal. The unit tier runs a small derandomized sample;
HYPOTHESIS_PROFILE=fuzz runs many more (see fakes/fuzz.py).

What the reader cannot defend: a CPU tensor it returned is a view of a memory map, so a file
truncated *while* such a view is alive (or between the size check and the copy of a device read)
makes the next touch of the lost pages a SIGBUS. Every read checks the file's size first, so a
file truncated before a tensor is read gives a clear error instead.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import struct
import tempfile
from pathlib import Path

import pytest
import torch

# hypothesis comes with the [test] extra; a runner with only the GPU tier's packages skips these.
pytest.importorskip("hypothesis", reason="property-based tests need hypothesis ([test] extra)")

from hypothesis import event, given
from hypothesis import strategies as st

from fakes.checkpoints import write_checkpoint
from fakes.fuzz import (
    FUZZ_SETTINGS,
    checkpoints,
    mutate,
    pairs_or_none,
    same_meaning,
    write,
)
from reference.errors import CheckpointError
from reference.kit.judging.judge import refusal
from reference.kit.seam import CHECKPOINT_SAFETY, SeamLoader
from reference.read.checkpoint import TensorReader, open_checkpoint

CPU = torch.device("cpu")
CODES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
# A flipped header byte can turn "F32" into "U32": known to torch builds that have it.
CODES.update(
    {
        c: getattr(torch, n)
        for c, n in (("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64"))
        if hasattr(torch, n)
    }
)


def raw_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().to(CPU).contiguous().reshape(-1).view(torch.uint8)
    return bytes(flat.numpy().tobytes())


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def invert_in_place(tensor: torch.Tensor) -> bytes:
    """Flip every bit of `tensor` in place; returns the bytes it held before."""
    old = raw_bytes(tensor)
    tensor.reshape(-1).view(torch.uint8).bitwise_not_()
    assert raw_bytes(tensor) == bytes(255 - b for b in old)
    return old


def mixed_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {
        "a.weight": torch.randn(4, 3, generator=g),
        "a.bias": torch.randn(4, generator=g).to(torch.bfloat16),
        "b.index": torch.arange(5, dtype=torch.int64),
        "c.flag": torch.tensor([True, False, True]),
        "d.scale": torch.randn(2, 2, generator=g).to(torch.float8_e4m3fn),
        "e.empty": torch.empty(0, 3),
    }


def read_all(loader: SeamLoader, path: Path, device: torch.device) -> dict[str, torch.Tensor]:
    """Every tensor at `path`, read through the adapter and checked against its listing."""
    listed = loader.inspect_checkpoint(path)
    got = {name: loader.read_checkpoint_tensor(path, name, device=device) for name in listed}
    for name, tensor in got.items():
        assert (tensor.dtype, tuple(tensor.shape)) == tuple(listed[name]), name
        assert tensor.device.type == device.type, name
    return got


def assert_says_what_files_say(got: dict[str, torch.Tensor], folder: Path) -> None:
    """Every tensor read equals its file's bytes at the header's offsets; ranges are disjoint."""
    index = next(iter(folder.glob("*.index.json")), None)
    files = sorted(folder.glob("*.safetensors"))
    if index is not None:
        weight_map = dict(pairs_or_none(index.read_bytes()) or [])["weight_map"]
        assert isinstance(weight_map, tuple)
        assert set(got) == {name for name, _ in weight_map}
        files = sorted({folder / str(shard) for _, shard in weight_map})
    seen: set[str] = set()
    for file in files:
        raw = file.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        pairs = pairs_or_none(raw[8 : 8 + n])
        assert pairs is not None
        keys = [k for k, _ in pairs if k != "__metadata__"]
        assert len(set(keys)) == len(keys), f"{file.name}: duplicate names accepted"
        spans = []
        for name, value in pairs:
            if name == "__metadata__":
                continue
            entry = dict(value)  # type: ignore[call-overload]
            begin, end = entry["data_offsets"]
            tensor = got[name]
            assert tensor.dtype == CODES[entry["dtype"]]
            assert list(tensor.shape) == entry["shape"]
            assert raw_bytes(tensor) == raw[8 + n + begin : 8 + n + end]
            spans.append((begin, end))
            seen.add(name)
        spans.sort()
        nonempty = [span for span in spans if span[0] < span[1]]
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(nonempty))
    assert seen == set(got)


@pytest.mark.rule("CKPT-2", "ZC-13")
@pytest.mark.capability(CHECKPOINT_SAFETY)
@FUZZ_SETTINGS
@given(drawn=checkpoints())
def test_valid_checkpoints_read_back_bit_exactly_and_stay_unwritten(
    loader: SeamLoader,
    runtime_device: torch.device,
    drawn: tuple[dict[str, torch.Tensor], int, dict[str, str]],
) -> None:
    state, shards, metadata = drawn
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ckpt"
        path = write(state, folder, shards, metadata)
        hashes = digests(folder)
        for where, device in ((path, runtime_device), (folder, CPU)):
            got = read_all(loader, where, device)
            assert set(got) == set(state)
            for name, tensor in got.items():
                assert (tensor.dtype, tensor.shape) == (state[name].dtype, state[name].shape)
                assert tensor.device.type == device.type
                assert invert_in_place(tensor) == raw_bytes(state[name])
        assert digests(folder) == hashes


@pytest.mark.rule("CKPT-4")
@pytest.mark.capability(CHECKPOINT_SAFETY)
@FUZZ_SETTINGS
@given(drawn=checkpoints(), data=st.data())
def test_mutated_checkpoint_reads_exactly_or_names_the_file(
    loader: SeamLoader,
    runtime_device: torch.device,
    drawn: tuple[dict[str, torch.Tensor], int, dict[str, str]],
    data: st.DataObject,
) -> None:
    state, shards, metadata = drawn
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ckpt"
        path = write(state, folder, shards, metadata)
        before = {p.name: p.read_bytes() for p in folder.iterdir()}
        mutation = mutate(data, folder)
        after = {p.name: p.read_bytes() for p in folder.iterdir()}
        harmless = after.keys() == before.keys() and all(
            same_meaning(before[n], after[n], index=n.endswith(".json")) for n in after
        )
        hashes = digests(folder)
        error: CheckpointError | None = None
        where = data.draw(st.sampled_from([path, folder]))
        try:
            loader.inspect_checkpoint(where)
        except CheckpointError as caught:
            error = caught
        if error is not None:
            event(f"{mutation.kind}: refused")
            assert not harmless, f"harmless {mutation.kind} edit refused: {error}"
            assert Path(error.file).name in str(error), str(error)
            if shards == 1:
                assert error.file == str(mutation.file)
            else:
                assert Path(error.file).parent == folder
                assert Path(error.file).name in before
        else:
            event(f"{mutation.kind}: {'harmless' if harmless else 'changed'}, opened")
            got = read_all(loader, where, runtime_device)
            assert_says_what_files_say(got, folder)
            if harmless:
                assert set(got) == set(state)
                for name, tensor in got.items():
                    assert raw_bytes(tensor) == raw_bytes(state[name])
        assert digests(folder) == hashes


@pytest.mark.internal
@pytest.mark.reference_only("the reference's own reader")
@pytest.mark.parametrize("when", ["before-the-map", "after-the-map", "restored-before-the-map"])
def test_shard_cut_after_open_fails_the_read_naming_file_and_tensor(
    tmp_path: Path, runtime_device: torch.device, when: str
) -> None:
    """A shard cut after its header was read fails the read of a tensor past the cut; before
    the shard is mapped, any change (cut, or cut and written back) fails every read of it: the
    file mapped must be the file validated."""
    state = mixed_state()
    checkpoint = open_checkpoint(write_checkpoint(state, tmp_path, shards=2))
    reader = TensorReader(checkpoint)
    shard = checkpoint.files[0]
    names = [name for name in reader if checkpoint.tensors[name].file == shard]
    first, last = names[0], names[-1]
    assert checkpoint.tensors[last].nbytes > 0
    original = shard.read_bytes()
    if when == "after-the-map":
        assert raw_bytes(reader.read(first, device=runtime_device)) == raw_bytes(state[first])
    os.truncate(shard, checkpoint.tensors[last].end - 1)
    if when == "restored-before-the-map":
        shard.write_bytes(original)
    hashes = digests(tmp_path)
    with pytest.raises(CheckpointError) as caught:
        reader.read(last, device=runtime_device)
    assert (caught.value.file, caught.value.entry) == (str(shard), last)
    assert str(caught.value).startswith(f"{shard} [{last}]: ")
    words = "changed since its header" if when.startswith("restored") else "was truncated"
    assert words in caught.value.problem
    if when == "before-the-map":  # intact bytes of a changed file are refused too
        with pytest.raises(CheckpointError, match="changed since its header was read"):
            reader.read(first, device=runtime_device)
    assert digests(tmp_path) == hashes  # the failed read wrote nothing


@pytest.mark.internal
@pytest.mark.reference_only("the reference's own reader")
def test_shard_removed_after_open_fails_the_read_naming_it(
    tmp_path: Path, runtime_device: torch.device
) -> None:
    checkpoint = open_checkpoint(write_checkpoint(mixed_state(), tmp_path, shards=2))
    shard = checkpoint.files[1]
    name = next(n for n, info in checkpoint.tensors.items() if info.file == shard)
    shard.unlink()
    with pytest.raises(CheckpointError, match="can no longer be read") as caught:
        TensorReader(checkpoint).read(name, device=runtime_device)
    assert (caught.value.file, caught.value.entry) == (str(shard), name)


@pytest.mark.rule("CKPT-4")
@pytest.mark.capability(CHECKPOINT_SAFETY)
def test_path_through_a_file_is_one_clear_error(loader: SeamLoader, tmp_path: Path) -> None:
    inner = write_checkpoint(mixed_state(), tmp_path) / "model.safetensors"
    error = refusal(lambda: loader.inspect_checkpoint(inner), str(inner), error=CheckpointError)
    assert isinstance(error, CheckpointError)
    assert (error.file, error.entry) == (str(inner), None)


@pytest.mark.rule("ZC-13", "CKPT-5")
@pytest.mark.capability(CHECKPOINT_SAFETY)
def test_in_place_writes_to_read_tensors_never_reach_the_files(
    loader: SeamLoader, tmp_path: Path, runtime_device: torch.device
) -> None:
    state = mixed_state()
    path = write_checkpoint(state, tmp_path, shards=2)
    hashes = digests(tmp_path)
    for device in dict.fromkeys([CPU, runtime_device]):
        for name, tensor in read_all(loader, path, device).items():
            assert invert_in_place(tensor) == raw_bytes(state[name])
    for name, tensor in read_all(loader, path, CPU).items():  # a fresh read sees the files
        assert raw_bytes(tensor) == raw_bytes(state[name])
    assert digests(tmp_path) == hashes


@pytest.mark.internal
@pytest.mark.reference_only("the reference's own reader")
def test_reference_cpu_reads_are_views_of_a_private_map(tmp_path: Path) -> None:
    """Why the test above means something for the reference: a CPU read is a view of the whole
    file's map, so a write to it lands on the mapped pages (private: the file never sees it)."""
    state = mixed_state()
    path = write_checkpoint(state, tmp_path)
    checkpoint = open_checkpoint(path)
    reader = TensorReader(checkpoint)
    tensors = {name: reader.read(name, device=CPU) for name in reader}
    storages = {t.untyped_storage().data_ptr() for t in tensors.values()}
    assert len(storages) == 1
    assert next(iter(tensors.values())).untyped_storage().nbytes() == path.stat().st_size
    before = digests(tmp_path)
    for tensor in tensors.values():
        invert_in_place(tensor)
    reader.close()
    assert digests(tmp_path) == before
