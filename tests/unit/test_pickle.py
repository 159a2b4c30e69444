"""CKPT-1: pickle checkpoints are refused without being unpickled, on every path.

Each pickle (fakes/pickles.py) holds traps: unpickling one creates a marker file.
Every path (reference/kit/judging/load_paths.py, and the adapter's own checkpoint inspection) is
handed each pickle; the load must be refused naming the file, or, for a pickle lying beside valid
safetensors, succeed from the safetensors alone. Either way the marker must not exist afterwards:
nothing from a checkpoint ran.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fakes.corpus_models import corpus_pipeline
from fakes.corrupt import small_state
from fakes.pickles import PICKLE_CASES, PickleCase, write_pickle_case
from reference.errors import CheckpointError
from reference.kit.judging.guards import Seal, failure_of, sealing
from reference.kit.judging.load_paths import (
    CAPABILITY,
    CHECKPOINT_PATHS,
    PIPELINE_COMPONENTS,
    load_checkpoint,
    load_component,
)
from reference.kit.seam import CHECKPOINT_SAFETY, SeamLoader

pytestmark = pytest.mark.rule("CKPT-1")

ON_CHECKPOINTS = [
    pytest.param(p, marks=pytest.mark.capability(CAPABILITY[p])) for p in CHECKPOINT_PATHS
]
IN_PIPELINES = [
    pytest.param(c, marks=pytest.mark.capability(CAPABILITY[c])) for c in PIPELINE_COMPONENTS
]


# Every checkpoint file a test hands a loader is hashed before the load and checked after.
sealed = pytest.fixture(autouse=True)(sealing)


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    """Where a trap leaves its mark; it must not exist when the test ends."""
    path = tmp_path / "unpickled.txt"
    yield path
    assert not path.exists(), "a pickle from the checkpoint was unpickled: its code ran"


def judge(
    case: PickleCase,
    load: object,
    *,
    error: type[Exception] = ValueError,
    or_named: tuple[str, ...] = (),
) -> None:
    """A pickle is refused naming its file (or the folder or index that offers only pickles,
    `case.or_named`, or any of `or_named`); beside safetensors, the load succeeds without it.

    Loads refuse with a ValueError (no rule names another type); the adapter's checkpoint
    methods with the Protocol's CheckpointError, whose `file` is what it names.
    """
    if case.file is None:
        assert load is not None
        return
    names = (*case.names, *or_named)
    assert isinstance(load, error), f"{type(load).__name__}: {load}"
    assert any(name in str(load) for name in names), f"names none of {names}: {load}"
    if isinstance(load, CheckpointError):
        assert Path(load.file).name in names, str(load)


@pytest.mark.parametrize("case", sorted(PICKLE_CASES))
@pytest.mark.parametrize("path", ON_CHECKPOINTS)
def test_pickle_is_never_unpickled_on_any_loading_path(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    sealed: Seal,
    marker: Path,
    *,
    path: str,
    case: str,
) -> None:
    written = write_pickle_case(case, tmp_path / "ckpt", marker=marker)
    sealed.add(tmp_path / "ckpt")

    def load() -> object:
        return load_checkpoint(path, loader, written.path, runtime_device=runtime_device)

    judge(written, load() if written.file is None else failure_of(load))


@pytest.mark.parametrize("case", sorted(PICKLE_CASES))
@pytest.mark.parametrize("component", IN_PIPELINES)
def test_pickle_in_a_pipeline_is_never_unpickled(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    sealed: Seal,
    marker: Path,
    *,
    component: str,
    case: str,
) -> None:
    root = tmp_path / "pipeline"
    written = write_pickle_case(case, corpus_pipeline(root, emptied=component), marker=marker)
    sealed.add(root)

    def load() -> object:
        return load_component(loader, root, component, runtime_device=runtime_device)

    # Handed the pipeline, a loader finds the component's folder offering only pickles (a
    # pickle, a folder of them, an index naming one): naming that folder conforms (CKPT-1) as
    # naming the file does. A pickle named `.safetensors` is a corrupt safetensors file instead.
    folder = () if case == "pickle-named-safetensors" else (component,)
    judge(written, load() if written.file is None else failure_of(load), or_named=folder)


@pytest.mark.capability(CHECKPOINT_SAFETY)
@pytest.mark.parametrize("case", sorted(PICKLE_CASES))
def test_inspection_and_reads_never_unpickle(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    sealed: Seal,
    *,
    marker: Path,
    case: str,
) -> None:
    written = write_pickle_case(case, tmp_path / "ckpt", marker=marker)
    sealed.add(tmp_path / "ckpt")
    if written.file is None:
        assert set(loader.inspect_checkpoint(written.path)) == set(small_state())
        tensor = loader.read_checkpoint_tensor(written.path, "proj.bias", device=runtime_device)
        assert torch.equal(tensor.cpu(), small_state()["proj.bias"])
        return
    inspected = failure_of(lambda: loader.inspect_checkpoint(written.path))
    judge(written, inspected, error=CheckpointError)
    read = failure_of(
        lambda: loader.read_checkpoint_tensor(written.path, "proj.bias", device=runtime_device)
    )
    judge(written, read, error=CheckpointError)
