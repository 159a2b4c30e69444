"""CKPT-6: a load is bounded by its checkpoint.

Host memory grows by at most 4 x the checkpoint's bytes + 1 GiB during a load, and a build that
would need more (a config.json, or a build, that sizes a table or a layer far past the weights)
is refused before the allocation, in one line naming the component. A loader may bound the
build any way it likes, or never allocate what the config sizes (a meta build that then refuses
the missing weights conforms too): the bound and the refusal's shape are judged, nothing else.

Every attempt runs in a child process (`isolated_with`, reference.kit.isolated) warmed first by
the same kind of load on a small model (SPEC, "Memory is the load's own"), with a deadline; the
child's data limit (4 GiB) turns an unbounded build into an error that names no component.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fakes.checkpoints import write_checkpoint
from fakes.corpus_models import corpus_pipeline
from fakes.corrupt import small_state
from fakes.hostile import SIZING_CASES, write_pipeline_case
from reference.kit.isolated import Attempt
from reference.kit.judging.guards import Seal, sealing
from reference.kit.judging.load_paths import (
    CAPABILITY,
    CHECKPOINT_PATHS,
    PIPELINE_COMPONENTS,
    load_built,
    load_on_path,
    sized_past,
)

DEADLINE = 15.0
"""Seconds one attempt's call may take (the child's start and its warm-up are not counted)."""
FLOOR = 1 << 30
"""CKPT-6's allowance beyond 4 x the checkpoint's bytes."""
ROPE_POSITIONS = 20_000_000
"""A rotary table of 20 million positions x 32 frequencies: 2.56 GB of float32."""

sealed = pytest.fixture(autouse=True)(sealing)


def bound(folder: Path) -> int:
    """CKPT-6's bound for the checkpoint in `folder`: 4 x its files' bytes + 1 GiB."""
    files = [f for f in folder.iterdir() if f.name.endswith((".safetensors", ".json"))]
    return 4 * sum(f.stat().st_size for f in files) + FLOOR


def assert_bounded(result: Attempt, limit: int, component: str) -> None:
    """Loaded within `limit` bytes of growth, or refused within it: a ValueError or a
    MemoryError, on one printable line naming `component`."""
    if result.peak_bytes is not None:
        assert result.peak_bytes <= limit, (
            f"host memory grew by {result.peak_bytes / 2**20:.0f} MiB during the load, past"
            f" CKPT-6's {limit / 2**20:.0f} MiB ({result.outcome}: {result.message})"
        )
    if result.outcome == "returned":
        return
    assert result.outcome == "raised", f"the loader {result.outcome}: {result.message}"
    assert result.raised("ValueError") or result.raised("MemoryError"), (
        result.error_types,
        result.message,
    )
    assert result.message.isprintable(), repr(result.message[:200])
    assert component in result.message, f"the refusal does not name {component}: {result.message}"


@pytest.mark.rule("CKPT-6")
@pytest.mark.parametrize("case", sorted(SIZING_CASES))
@pytest.mark.parametrize(
    "component",
    [pytest.param(c, marks=pytest.mark.capability(CAPABILITY[c])) for c in PIPELINE_COMPONENTS],
)
def test_a_config_that_sizes_the_build_past_its_checkpoint_is_bounded(
    isolated_with: Callable[..., Attempt],
    runtime_device: torch.device,
    tmp_path: Path,
    sealed: Seal,
    *,
    component: str,
    case: str,
) -> None:
    """A pipeline component whose config.json asks for terabytes, or for gigabytes that no
    host runs out of at once (a 20000-wide VAE layer its checkpoint lacks; a DiT's rotary
    table of 20 million positions, derived with `torch.outer` and `.cos()`), over a checkpoint
    of a few hundred bytes. Catches a loader that constructs the class from its config with no
    bound from the checkpoint: it swaps, is killed for memory, or dies in torch's allocator."""
    warm = corpus_pipeline(tmp_path / "warm")
    root = corpus_pipeline(tmp_path / "pipeline")
    write_pipeline_case(case, root, component)
    sealed.add(tmp_path)
    result = isolated_with(
        load_on_path,
        component,
        root,
        runtime_device=runtime_device,
        deadline=DEADLINE,
        warm=(load_on_path, (component, warm), {"runtime_device": runtime_device}),
    )
    assert_bounded(result, bound(root / component), component)


@pytest.mark.rule("CKPT-6")
@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.capability(CAPABILITY[p])) for p in CHECKPOINT_PATHS],
)
def test_a_build_that_sizes_a_table_past_its_checkpoint_is_bounded(
    isolated_with: Callable[..., Attempt],
    runtime_device: torch.device,
    tmp_path: Path,
    sealed: Seal,
    path: str,
) -> None:
    """The DiT and VAE loads of the seam, handed a build whose `__init__` computes a rotary
    table of 2.56 GB over a checkpoint of a few hundred bytes. Catches a loader whose meta
    build lets construction compute its tables for real, unbounded (a non-persistent buffer
    is not a slot, so no header check sees it)."""
    warm = write_checkpoint(small_state(), tmp_path / "warm")
    checkpoint = write_checkpoint(small_state(), tmp_path / "ckpt")
    sealed.add(tmp_path)
    component = "vae" if path == "vae-stream" else "transformer"
    result = isolated_with(
        load_built,
        path,
        checkpoint,
        build=sized_past(path, ROPE_POSITIONS),
        runtime_device=runtime_device,
        deadline=DEADLINE,
        warm=(
            load_built,
            (path, warm),
            {"build": sized_past(path, 64), "runtime_device": runtime_device},
        ),
    )
    assert_bounded(result, bound(checkpoint.parent), component)
