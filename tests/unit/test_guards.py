"""The bad-input tests' own instruments can fail: the seal, `failure_of`, `survivors`, traps."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from fakes.checkpoints import write_checkpoint
from fakes.corpus_models import CorpusDiT, CorpusVAE, mark, survivors, while_building
from fakes.corrupt import small_state
from fakes.guards import Seal, failure_of
from fakes.pickles import Trap

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
