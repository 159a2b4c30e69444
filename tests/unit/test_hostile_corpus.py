"""CKPT-4 on hostile inputs: every entry of fakes/hostile.py, on every loading path
and the CLI. The entries whose config.json sizes a build past its checkpoint (`SIZING_CASES`)
are CKPT-6's, judged by its bound in test_ckpt_bounds.py (the CLI runs them here, as the
reference's own).

Each attempt runs in a child process (`isolated_with`, reference.kit.isolated) with a deadline
and a data limit, and reports how far its resident memory rose during the call. Every attempt
must end in one refusal of a documented type (a ValueError; a MemoryError where construction
asks for terabytes), on one printable line of bounded length that names the file at fault,
within `DEADLINE` seconds and `PEAK_BOUND` bytes of memory growth; and no file may change. An
entry that is well formed enough to load (`may_load`) is judged on the shape of its refusal
only, if there is one. The command-line runs are the reference's own (`reference_only`): exit 2
and one line on stderr.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fakes.checkpoints import write_checkpoint
from fakes.corpus_models import corpus_pipeline
from fakes.corrupt import small_state
from fakes.hostile import (
    PIPELINE_CASES,
    SIZING_CASES,
    WEIGHT_CASES,
    Hostile,
    write_pipeline_case,
    write_weight_case,
)
from reference.kit.isolated import Attempt, isolated_call
from reference.kit.judging.guards import Seal, sealing
from reference.kit.judging.load_paths import (
    CAPABILITY,
    CHECKPOINT_PATHS,
    PIPELINE_COMPONENTS,
    load_on_path,
    load_with_a_shard_swapped_for_a_pipe,
)

from .command import run_reference, run_reference_with_a_shard_swapped_for_a_pipe

DEADLINE = 15.0
"""Seconds one attempt's call may take (the child's start is not counted)."""
PEAK_BOUND = 512 * 1024**2
"""Bytes one attempt's resident memory may rise by during the call: a loader that reads a
device file, a sparse index or a header bomb into memory goes far past it."""
CLI_IN_UNIT = frozenset({"name-with-control-characters", "a-thousand-unknown-names"})
LINE_BOUND = 2000
"""Characters a refusal may take: a thousand names are cut, not listed."""

ON_EVERY_PATH = [
    pytest.param(p, marks=pytest.mark.capability(CAPABILITY[p]))
    for p in (*CHECKPOINT_PATHS, *PIPELINE_COMPONENTS)
]
IN_PIPELINES = [
    pytest.param(c, marks=pytest.mark.capability(CAPABILITY[c])) for c in PIPELINE_COMPONENTS
]

sealed = pytest.fixture(autouse=True)(sealing)


def assert_refused_well(result: Attempt, hostile: Hostile) -> None:
    """One refusal of a documented type, one printable bounded line naming the file, in bounded
    time and memory."""
    if result.outcome == "returned" and hostile.may_load:
        return
    assert result.outcome == "raised", f"the loader {result.outcome}: {result.message}"
    types = ("ValueError", "MemoryError") if hostile.memory else ("ValueError",)
    assert any(result.raised(t) for t in types), (result.error_types, result.message)
    message = result.message
    assert message.isprintable(), f"the refusal carries control characters: {message!r}"
    message.encode("utf-8")  # no lone surrogates: printable anywhere
    assert len(message) <= LINE_BOUND, f"a refusal of {len(message)} characters"
    assert any(name in message for name in hostile.names), (
        f"the refusal names none of {hostile.names}: {message}"
    )
    if result.peak_bytes is not None:
        assert result.peak_bytes <= PEAK_BOUND, (
            f"memory rose by {result.peak_bytes / 2**20:.0f} MiB during the attempt: {message}"
        )


def target_for(path: str, tmp_path: Path, write: Callable[[Path], Hostile]) -> tuple[Path, Hostile]:
    """The hostile entry written where `path` reads it: a checkpoint folder, or a corpus
    pipeline's emptied component folder (the pipeline's root is then the target)."""
    if path in PIPELINE_COMPONENTS:
        root = tmp_path / "pipeline"
        hostile = write(corpus_pipeline(root, emptied=path))
        return root, hostile
    hostile = write(tmp_path / "ckpt")
    return hostile.path, hostile


@pytest.mark.rule("CKPT-4")
@pytest.mark.parametrize("case", sorted(WEIGHT_CASES))
@pytest.mark.parametrize("path", ON_EVERY_PATH)
def test_hostile_weights_are_refused_in_one_line_in_bounded_time_and_memory(
    isolated_with: Callable[..., Attempt],
    runtime_device: torch.device,
    tmp_path: Path,
    sealed: Seal,
    *,
    path: str,
    case: str,
) -> None:
    sealed.add(tmp_path)
    target, hostile = target_for(path, tmp_path, lambda f: write_weight_case(case, f))
    sealed.add(tmp_path)
    result = isolated_with(
        load_on_path, path, target, runtime_device=runtime_device, deadline=DEADLINE
    )
    assert_refused_well(result, hostile)


@pytest.mark.rule("CKPT-4")
@pytest.mark.parametrize("case", sorted(set(PIPELINE_CASES) - SIZING_CASES))
@pytest.mark.parametrize("component", IN_PIPELINES)
def test_hostile_pipeline_files_are_refused_in_one_line_in_bounded_time_and_memory(
    isolated_with: Callable[..., Attempt],
    runtime_device: torch.device,
    tmp_path: Path,
    sealed: Seal,
    *,
    component: str,
    case: str,
) -> None:
    root = corpus_pipeline(tmp_path / "pipeline")
    hostile = write_pipeline_case(case, root, component)
    sealed.add(tmp_path)
    result = isolated_with(
        load_on_path, component, root, runtime_device=runtime_device, deadline=DEADLINE
    )
    assert_refused_well(result, hostile)


@pytest.mark.rule("CKPT-4")
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes need a POSIX system")
@pytest.mark.parametrize("path", ON_EVERY_PATH)
def test_a_shard_swapped_for_a_pipe_after_its_check_is_refused_not_waited_on(
    isolated_with: Callable[..., Attempt],
    runtime_device: torch.device,
    tmp_path: Path,
    sealed: Seal,
    path: str,
) -> None:
    """The second of two shards is replaced by a named pipe between the header check and the
    read (another process at work): refused naming that shard, within the deadline, on every
    path; a blocking open of the pipe waits for a writer that never comes."""
    if path in PIPELINE_COMPONENTS:
        target = tmp_path / "pipeline"
        folder = corpus_pipeline(target, emptied=path)
        write_checkpoint(small_state(), folder, shards=2)
    else:
        folder = tmp_path / "ckpt"
        target = write_checkpoint(small_state(), folder, shards=2)
    *others, shard = sorted(folder.glob("*.safetensors"))
    for kept in others:  # the pipe itself is never read, so never sealed
        sealed.add(kept)
    result = isolated_with(
        load_with_a_shard_swapped_for_a_pipe,
        path,
        target,
        shard=shard,
        runtime_device=runtime_device,
        deadline=DEADLINE,
    )
    assert result.outcome == "raised", f"the loader {result.outcome}: {result.message}"
    assert result.raised("ValueError"), (result.error_types, result.message)
    assert shard.name in result.message, f"the refusal does not name {shard.name}: {result.message}"


# --- the command line: exit 2, one line on stderr ------------------------------------------------


def _command(root: Path) -> tuple[str, ...]:
    models = "fakes.corpus_models"
    return ("load", str(root), "--models", models, "--dit-cpu-offload")


def assert_command_refused(result: Attempt, hostile: Hostile) -> None:
    assert result.outcome == "returned", f"the command {result.outcome}: {result.message}"
    ran = result.value
    if hostile.may_load and ran.returncode == 0:
        return
    assert ran.returncode == 2, (ran.returncode, ran.stderr)
    assert ran.stdout == "", "a table was printed: something looked loaded"
    (line,) = ran.stderr.splitlines()
    assert line.startswith("error: "), line
    assert line.isprintable(), repr(line[:200])
    assert len(line) <= LINE_BOUND, f"a line of {len(line)} characters"
    assert any(name in line for name in hostile.names), (hostile.names, line)
    if result.peak_bytes is not None:
        assert result.peak_bytes <= PEAK_BOUND, f"{result.peak_bytes / 2**20:.0f} MiB: {line}"


CLI_WEIGHT_CASES = [
    pytest.param(case, marks=() if case in CLI_IN_UNIT else pytest.mark.long)
    for case in sorted(WEIGHT_CASES)
]
"""Every weight case on the command line; in the unit tier only those that test what the line
itself must do (escape control characters, stay short), the rest in `tox -e selftest` (the
same inputs reach the same loaders through the pipeline paths above in the unit tier)."""


@pytest.mark.internal
@pytest.mark.reference_only("runs the reference's own command line")
@pytest.mark.parametrize("case", CLI_WEIGHT_CASES)
@pytest.mark.parametrize("component", PIPELINE_COMPONENTS)
def test_the_command_line_refuses_hostile_weights(
    tmp_path: Path, sealed: Seal, component: str, case: str
) -> None:
    root = tmp_path / "pipeline"
    hostile = write_weight_case(case, corpus_pipeline(root, emptied=component))
    sealed.add(tmp_path)
    result = isolated_call(run_reference, *_command(root), hide_cuda=True, deadline=DEADLINE)
    assert_command_refused(result, hostile)


@pytest.mark.internal
@pytest.mark.reference_only("runs the reference's own command line")
@pytest.mark.parametrize("case", sorted(PIPELINE_CASES))
@pytest.mark.parametrize("component", PIPELINE_COMPONENTS)
def test_the_command_line_refuses_hostile_pipeline_files(
    tmp_path: Path, sealed: Seal, component: str, case: str
) -> None:
    root = corpus_pipeline(tmp_path / "pipeline")
    hostile = write_pipeline_case(case, root, component)
    sealed.add(tmp_path)
    result = isolated_call(run_reference, *_command(root), hide_cuda=True, deadline=DEADLINE)
    assert_command_refused(result, hostile)


@pytest.mark.internal
@pytest.mark.reference_only("runs the reference's own command line")
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes need a POSIX system")
@pytest.mark.parametrize("component", PIPELINE_COMPONENTS)
def test_the_command_line_refuses_a_shard_swapped_for_a_pipe_after_its_check(
    tmp_path: Path, sealed: Seal, component: str
) -> None:
    root = tmp_path / "pipeline"
    folder = corpus_pipeline(root, emptied=component)
    write_checkpoint(small_state(), folder, shards=2)
    *others, shard = sorted(folder.glob("*.safetensors"))
    for kept in others:
        sealed.add(kept)
    result = isolated_call(
        run_reference_with_a_shard_swapped_for_a_pipe,
        *_command(root),
        shard=shard,
        deadline=DEADLINE,
    )
    assert_command_refused(result, Hostile("shard-swapped-for-a-pipe", root, (shard.name,)))
