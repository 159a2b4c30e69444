"""CKPT-4: every bad checkpoint, on every loading path, ends in one clear error.

The corpus (fakes/corrupt.py) is broken from one valid base that the corpus models fit
exactly (fakes/corpus_models.py), so a load of an entry can only fail for being
corrupt. Each entry goes down every path of reference/kit/judging/load_paths.py: the DiT with
adoption, the DiT in direct mode, the VAE stream, and a pipeline's transformer and VAE components.
Every load must raise one error naming the file and the entry, on one line (or, where an either-or
rule lets a loader refuse another way, the refusal of that branch: a folder of unindexed files
refused naming them, CKPT-2); never hang, return a model, or leave a model built from the bad input
alive. Checkpoints that are well formed but belong to another model are refused naming the tensor
instead. The load paths name no error type beyond ValueError; `inspect_checkpoint` and
`read_checkpoint_tensor` raise the Protocol's CheckpointError. No test writes to a checkpoint file
it sealed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from fakes.checkpoints import write_checkpoint
from fakes.corpus_models import corpus_pipeline, mark, survivors
from fakes.corrupt import CASES, BadCheckpoint, small_state, write_bad_checkpoint
from reference.errors import CheckpointError
from reference.kit.judging.guards import Seal, failure_of, sealing
from reference.kit.judging.judge import assert_names
from reference.kit.judging.load_paths import (
    CAPABILITY,
    CHECKPOINT_PATHS,
    PIPELINE_COMPONENTS,
    load_checkpoint,
    load_component,
)
from reference.kit.seam import SeamLoader
from reference.read.checkpoint import open_checkpoint

ON_CHECKPOINTS = [
    pytest.param(p, marks=pytest.mark.capability(CAPABILITY[p])) for p in CHECKPOINT_PATHS
]
IN_PIPELINES = [
    pytest.param(c, marks=pytest.mark.capability(CAPABILITY[c])) for c in PIPELINE_COMPONENTS
]


# Every checkpoint file a test hands a loader is hashed before the load and checked after.
sealed = pytest.fixture(autouse=True)(sealing)


def assert_one_clear_error(
    error: BaseException,
    *,
    file: str,
    entries: tuple[str | None, ...],
    bad: BadCheckpoint | None = None,
) -> None:
    """A refusal (a ValueError: the load paths name no other type) naming `file` and one of
    `entries` (where a fault can be told from either side, naming either conforms), on one
    line. Where the loader raises the Protocol's CheckpointError, its `file` and `entry` must
    say the same. Where `bad` falls under an either-or rule (`BadCheckpoint.or_refused_naming`),
    a refusal of the other branch conforms instead: it names each of those files, and a
    CheckpointError blames the folder or one of them."""
    assert isinstance(error, ValueError), f"{type(error).__name__}: {error}"
    message = str(error)
    assert "\n" not in message, message
    if bad is not None and bad.refused_the_other_way(error):
        named_files = sum(len(f) for f in bad.or_refused_naming)
        assert len(message) > named_files + 8, f"the problem is not stated: {message}"
        if isinstance(error, CheckpointError):
            assert Path(error.file).name in bad.blamed_the_other_way, message
            assert error.entry is None or error.entry in message, message
        return
    if bad is not None and bad.or_refused_naming:
        assert file in message, (
            f"the refusal names neither {file!r} nor each of {bad.or_refused_naming}: {message}"
        )
    assert_names(error, file)
    named = [e for e in entries if e is None or e in message]
    assert named, f"the refusal names none of {entries}: {message}"
    assert len(message) > len(file) + len(named[0] or "") + 8, (
        f"the problem is not stated: {message}"
    )
    if isinstance(error, CheckpointError):
        assert Path(error.file).name == file, message
        assert error.entry in entries, message


def expected_in_folder(bad: BadCheckpoint, folder: Path) -> tuple[str, tuple[str | None, ...]]:
    """File and entries a load of the whole folder names: a missing file leaves a folder
    without weights, and the folder is at fault."""
    return (folder.name, (None,)) if bad.case == "missing-file" else (bad.file, bad.entries)


# --- the corpus on every path --------------------------------------------------------------------


@pytest.mark.rule("CKPT-4")
@pytest.mark.parametrize("path", ON_CHECKPOINTS)
def test_valid_base_of_the_corpus_loads_on_every_path(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, sealed: Seal, path: str
) -> None:
    state = small_state()
    checkpoint = write_checkpoint(state, tmp_path)
    sealed.add(tmp_path)
    module = load_checkpoint(path, loader, checkpoint, runtime_device=runtime_device)
    got = module.state_dict()
    assert set(got) == set(state)
    for name, tensor in state.items():
        assert (got[name].dtype, got[name].shape) == (tensor.dtype, tensor.shape), name
        if not got[name].is_meta:
            assert torch.equal(got[name].cpu(), tensor), name


@pytest.mark.rule("CKPT-4")
@pytest.mark.parametrize("component", IN_PIPELINES)
def test_valid_corpus_pipeline_loads(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    sealed: Seal,
    component: str,
) -> None:
    # the pipeline's own weights are valid: only what a test writes into it can break a load
    root = corpus_pipeline(tmp_path)
    sealed.add(root)
    module = load_component(loader, root, component, runtime_device=runtime_device)
    assert set(module.state_dict()) == set(small_state())


@pytest.mark.rule("CKPT-4")
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("path", ON_CHECKPOINTS)
def test_corrupt_checkpoint_is_one_clear_error_on_every_path(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    sealed: Seal,
    *,
    path: str,
    case: str,
) -> None:
    bad = write_bad_checkpoint(case, tmp_path / "ckpt")
    sealed.add(tmp_path)
    since = mark()
    error = failure_of(
        lambda: load_checkpoint(path, loader, bad.path, runtime_device=runtime_device)
    )
    assert_one_clear_error(error, file=bad.file, entries=bad.entries, bad=bad)
    assert survivors(since) == [], "a model built from the bad checkpoint is still alive"


@pytest.mark.rule("CKPT-4")
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("component", IN_PIPELINES)
def test_corrupt_component_weights_are_one_clear_error_in_a_pipeline(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    sealed: Seal,
    *,
    component: str,
    case: str,
) -> None:
    folder = corpus_pipeline(tmp_path, emptied=component)
    bad = write_bad_checkpoint(case, folder)
    sealed.add(tmp_path)
    since = mark()
    error = failure_of(
        lambda: load_component(loader, tmp_path, component, runtime_device=runtime_device)
    )
    file, entries = expected_in_folder(bad, folder)
    assert_one_clear_error(error, file=file, entries=entries, bad=bad)
    assert survivors(since) == [], "a model built from the bad checkpoint is still alive"


@pytest.mark.internal
@pytest.mark.reference_only("the reference's wording")
@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_messages_say_what_is_wrong(tmp_path: Path, sealed: Seal, case: str) -> None:
    """The reference's wording for each corpus entry (other loaders word it their own way)."""
    bad = write_bad_checkpoint(case, tmp_path / "ckpt")
    sealed.add(tmp_path)
    with pytest.raises(CheckpointError) as caught:
        open_checkpoint(bad.path)
    assert bad.words in caught.value.problem


# --- well formed, but another model's checkpoint: refused naming the tensor ----------------------


def mismatched_state(kind: str) -> dict[str, torch.Tensor]:
    state = small_state()
    if kind == "unknown-name":
        state["extra.weight"] = torch.ones(2)
    elif kind == "missing-name":
        del state["proj.bias"]
    elif kind == "renamed":
        state["proj.weights"] = state.pop("proj.weight")
    elif kind == "wrong-shape":
        state["proj.weight"] = torch.ones(8, 5)
    return state


MISMATCHES = {
    "unknown-name": "extra.weight",
    "missing-name": "proj.bias",
    "renamed": "proj.weights",
    "wrong-shape": "proj.weight",
}


@pytest.mark.rule("CKPT-4", "CKPT-5")
@pytest.mark.parametrize("kind", sorted(MISMATCHES))
@pytest.mark.parametrize("path", ON_CHECKPOINTS)
def test_another_models_checkpoint_is_a_state_mismatch_naming_the_tensor(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    sealed: Seal,
    *,
    path: str,
    kind: str,
) -> None:
    checkpoint = write_checkpoint(mismatched_state(kind), tmp_path)
    sealed.add(tmp_path)
    since = mark()
    error = failure_of(
        lambda: load_checkpoint(path, loader, checkpoint, runtime_device=runtime_device)
    )
    assert isinstance(error, ValueError), f"{type(error).__name__}: {error}"
    assert_names(error, MISMATCHES[kind])
    assert survivors(since) == []


@pytest.mark.rule("CKPT-4", "CKPT-5")
@pytest.mark.parametrize("kind", sorted(MISMATCHES))
@pytest.mark.parametrize("component", IN_PIPELINES)
def test_another_models_weights_in_a_pipeline_are_a_state_mismatch(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    sealed: Seal,
    *,
    component: str,
    kind: str,
) -> None:
    folder = corpus_pipeline(tmp_path, emptied=component)
    write_checkpoint(mismatched_state(kind), folder)
    sealed.add(tmp_path)
    since = mark()
    error = failure_of(
        lambda: load_component(loader, tmp_path, component, runtime_device=runtime_device)
    )
    assert isinstance(error, ValueError), f"{type(error).__name__}: {error}"
    assert_names(error, MISMATCHES[kind])
    assert survivors(since) == []


@pytest.mark.rule("CKPT-4")
@pytest.mark.parametrize("path", ON_CHECKPOINTS)
def test_another_dtype_is_loaded_not_refused(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, sealed: Seal, path: str
) -> None:
    """Another dtype is not corruption: the load goes through holding the file's values. Into
    which dtype they land is ZC-11's (DiT) and VAE-7's (VAE) to judge."""
    state = {n: t.to(torch.float16) for n, t in small_state().items()}
    checkpoint = write_checkpoint(state, tmp_path)
    sealed.add(tmp_path)
    module: nn.Module = load_checkpoint(path, loader, checkpoint, runtime_device=runtime_device)
    for name, tensor in module.state_dict().items():
        if not tensor.is_meta:
            assert torch.equal(tensor.cpu().to(torch.float16), state[name]), name
