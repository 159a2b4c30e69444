"""The suite's own instruments can fail: the seal, `failure_of`, `survivors`, traps, `refusal`,
the read evidence and the reworded loader."""

from __future__ import annotations

import gc
import mmap
import os
import pickle
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from fakes.checkpoints import write_checkpoint
from fakes.corpus_models import CorpusDiT, CorpusVAE, mark, survivors, while_building
from fakes.corrupt import small_state
from fakes.pickles import Trap
from fakes.reworded import reworded_error, without_reasons
from reference.errors import CheckpointError, StateMismatchError
from reference.kit.judging.evidence import DataReads, data_bytes, evidence_missing
from reference.kit.judging.file_maps import file_position, maps_missing
from reference.kit.judging.guards import Seal, failure_of
from reference.kit.judging.judge import refusal
from reference.place.adopt import Verdict
from reference.place.records import TensorRecord
from reference.report.summary import LoadReport
from reference.request.plan import WeightLoadPlan

pytestmark = pytest.mark.internal


def test_seal_reports_changed_and_vanished_files_only(tmp_path: Path) -> None:
    write_checkpoint(small_state(), tmp_path, shards=2)
    seal = Seal()
    seal.add(tmp_path)
    assert len(seal.hashes) == 3
    assert seal.broken() == []
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(index.read_text() + " ")
    (tmp_path / "model-00001-of-00002.safetensors").unlink()
    assert sorted(seal.broken()) == [
        f"{tmp_path / 'model-00001-of-00002.safetensors'}: gone",
        f"{index}: bytes changed",
    ]
    seal.add(index)  # a test's own edit is sealed again
    assert seal.broken() == [f"{tmp_path / 'model-00001-of-00002.safetensors'}: gone"]


@pytest.mark.parametrize("where", ["middle", "start", "end"])
def test_seal_sees_one_byte_written_anywhere_in_a_large_sparse_file(
    tmp_path: Path, where: str
) -> None:
    """A sparse file is sealed by its data only (the corpus's 4 GiB sparse index costs
    nothing): a one-byte write anywhere is still seen, even a zero into a hole."""
    big = tmp_path / "model.safetensors.index.json"
    size = 64 * 1024**2
    with big.open("wb") as f:
        f.truncate(size)
    seal = Seal()
    seal.add(tmp_path)
    assert seal.broken() == []
    offset = {"middle": size // 2, "start": 10, "end": size - 10}[where]
    with big.open("r+b") as f:
        f.seek(offset)
        f.write(b"\x00")  # the same byte: only the write itself shows
    assert seal.broken() == [f"{big}: bytes changed"]


def test_seal_reports_files_created_in_a_sealed_folder(tmp_path: Path) -> None:
    write_checkpoint(small_state(), tmp_path / "ckpt")
    seal = Seal()
    seal.add(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "cache").mkdir()
    (tmp_path / "ckpt" / "cache" / "model.lock").write_bytes(b"")
    (tmp_path / "beside.txt").write_text("outside the sealed folder")
    assert seal.broken() == [f"{tmp_path / 'ckpt' / 'cache' / 'model.lock'}: created after sealing"]


def test_failure_of_returns_the_error_without_its_traceback() -> None:
    def load() -> nn.Module:
        try:
            raise KeyError("inner")
        except KeyError as exc:
            raise ValueError("outer") from exc

    error = failure_of(load)
    assert isinstance(error, ValueError)
    assert error.__traceback__ is None
    assert isinstance(error.__cause__, KeyError)
    assert error.__cause__.__traceback__ is None


def test_failure_of_refuses_a_load_that_returns_a_model() -> None:
    with pytest.raises(AssertionError, match="the load returned CorpusVAE"):
        failure_of(CorpusVAE)


def test_failure_of_refuses_a_load_that_hangs() -> None:
    release = threading.Event()
    try:
        with pytest.raises(AssertionError, match="the load hung"):
            failure_of(lambda: release.wait(30), seconds=0.05)
    finally:
        release.set()


def test_survivors_finds_a_model_an_error_still_holds() -> None:
    def load() -> nn.Module:
        model = CorpusDiT()
        raise ValueError("refused", model)

    since = mark()
    error = failure_of(load)
    assert [type(m) for m in survivors(since)] == [CorpusDiT]
    del error
    assert survivors(since) == []


def test_build_hooks_run_only_inside_their_block() -> None:
    calls: list[str] = []
    with while_building(lambda: calls.append("built")):
        CorpusVAE()
        CorpusDiT()
    CorpusVAE()
    assert calls == ["built", "built"]


@pytest.mark.parametrize("how", ["pickle", "torch.load"])
def test_a_trap_leaves_its_marker_when_unpickled(tmp_path: Path, how: str) -> None:
    """Unpickling a trap creates the marker, so the CKPT-1 tests can fail."""
    marker = tmp_path / "control.txt"
    if how == "pickle":
        pickle.loads(pickle.dumps({"proj.weight": Trap(marker)}))
    else:
        torch.save({"proj.weight": Trap(marker)}, tmp_path / "control.pt")
        torch.load(tmp_path / "control.pt", weights_only=False)
    assert marker.exists()


def test_refusal_needs_the_type_and_every_name() -> None:
    def refuse() -> None:
        raise KeyError("'vae' is unknown")  # a LookupError, not a ValueError

    with pytest.raises(KeyError):
        refusal(refuse, "vae")
    with pytest.raises(AssertionError, match="returned int"):
        refusal(lambda: 1, "vae")
    with pytest.raises(AssertionError, match=r"does not name \['--flag'\]"):
        refusal(lambda: int("vae"), "vae", "--flag")
    error = refusal(lambda: int("vae"), "vae")
    assert isinstance(error, ValueError)


def test_data_reads_see_read_calls_and_touched_pages_but_not_headers(tmp_path: Path) -> None:
    reason = evidence_missing()
    if reason is not None:
        pytest.skip(reason)
    path = write_checkpoint({"w": torch.randn(4 << 20)}, tmp_path)  # 16 MiB of data
    data = data_bytes(path)
    assert data == 16 << 20
    with DataReads() as headers, path.open("rb") as f:
        f.read(4096)
    headers.assert_no_data_read(data)
    assert headers.opened_any([path]) == [str(path)]
    with DataReads() as reads, path.open("rb") as f:
        f.read()
    with pytest.raises(AssertionError, match="bytes were read"):
        reads.assert_no_data_read(data)
    with DataReads() as touches:
        size = path.stat().st_size
        storage = torch.UntypedStorage.from_file(str(path), shared=False, nbytes=size)
        torch.empty(0, dtype=torch.uint8).set_(storage).max()
    with pytest.raises(AssertionError, match="was touched"):
        touches.assert_no_data_read(data)


class _Cycle:
    """An object in a reference cycle: freed only by the cyclic collector."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data
        self.me = self


def test_data_reads_see_touched_pages_though_earlier_garbage_could_be_freed_meanwhile(
    tmp_path: Path,
) -> None:
    """Garbage an earlier call left (a module in a reference cycle) must not be collected
    while a call is watched: its pages freed would hide the pages the call touches."""
    reason = evidence_missing()
    if reason is not None:
        pytest.skip(reason)
    path = write_checkpoint({"w": torch.randn(4 << 20)}, tmp_path)  # 16 MiB of data
    _Cycle(torch.ones(16 << 20))  # 64 MiB, resident, garbage from now on
    with DataReads() as touches:
        # Enough new containers for the collector to run on its own where it may (as a
        # loader's construction makes them), before the pages are touched.
        held = [[] for _ in range(10 * gc.get_threshold()[0])]
        size = path.stat().st_size
        storage = torch.UntypedStorage.from_file(str(path), shared=False, nbytes=size)
        torch.empty(0, dtype=torch.uint8).set_(storage).max()
    del held
    gc.collect()
    with pytest.raises(AssertionError, match="was touched"):
        touches.assert_no_data_read(data_bytes(path))


def test_the_reworded_loader_keeps_types_and_names_but_no_words_or_reasons() -> None:
    original = CheckpointError("ckpt/a.safetensors", "w.weight", "offsets overlap with w.bias")
    new = reworded_error(original)
    assert isinstance(new, CheckpointError)
    assert type(new) is not CheckpointError
    assert (new.file, new.entry) == (original.file, original.entry)
    assert "offsets overlap" not in str(new)
    assert all(word in str(new) for word in str(original).split())
    plain = reworded_error(StateMismatchError("no checkpoint tensor for head.bias"))
    assert type(plain).__mro__[1] is ValueError
    report = LoadReport(
        "transformer",
        WeightLoadPlan(torch.device("cpu")),
        (TensorRecord("w", "copied", 4, "ZC-5"),),
    )
    assert without_reasons((None, report))[1].records[0].reason is None
    assert without_reasons(Verdict(False, "ZC-1: on meta")) == Verdict(False)


def test_file_position_reads_past_a_mapped_path_that_is_not_utf8(tmp_path: Path) -> None:
    """Linux names may be any bytes, and /proc/self/maps prints them raw: a map of a file in a
    folder named in Latin-1 (a loader's own, or a test's not yet collected) must not break the
    judging of every other tensor of the process."""
    if maps_missing() is not None:
        pytest.skip(maps_missing())
    odd = Path(os.fsdecode(os.path.join(os.fsencode(tmp_path), b"ck\xffpt")))
    try:
        odd.mkdir()
    except (OSError, UnicodeError):
        pytest.skip("this filesystem refuses names that are not UTF-8")
    files = [tmp_path / "before.bin", odd / "odd.bin", tmp_path / "after.bin"]
    maps, tensors = [], []
    # Maps of ordinary files on either side of the odd one: whichever way the kernel places
    # them, one lies above it, and finding it walks past the odd line.
    for path in files:
        path.write_bytes(bytes(range(256)) * 64)
        with path.open("rb") as f:
            maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY))
        tensors.append(torch.frombuffer(maps[-1], dtype=torch.uint8)[100:])
    try:
        for path, tensor in zip(files, tensors, strict=True):
            assert file_position(tensor) == (os.path.realpath(path), 100)
        assert file_position(torch.zeros(1 << 20, dtype=torch.uint8)) is None
    finally:
        del tensor
        tensors.clear()
        for mapped in maps:
            mapped.close()
