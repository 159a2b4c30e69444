"""CKPT-4: never a hang. A file in place of a shard that a naive reader blocks on (a named
pipe) or reads without end (a device file), on the reader's methods and on the load paths.

Each attempt runs in a fresh process that a deadline can kill (the `isolated` fixture,
reference.kit.isolated), whatever the loader: one that blocks fails the test, and the run goes
on. (A thread cannot stop it: safetensors' reader blocks on a pipe holding the GIL.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fakes.blocking import BLOCKING, make_blocking_file
from fakes.corpus_models import CorpusDiT, CorpusVAE
from fakes.layers import LINEAR_KINDS
from reference.kit.isolated import Attempt
from reference.kit.seam import (
    CHECKPOINT_SAFETY,
    VAE_STREAM,
    ZERO_COPY,
    DitRequest,
    Plan,
    VaeRequest,
)


def blocking_shard(kind: str, folder: Path) -> Path:
    """A file named like a shard that a naive open or read blocks on, or reads forever."""
    return make_blocking_file(kind, folder / "model.safetensors")


def assert_refused_in_time(attempt: Attempt, named: str) -> None:
    assert attempt.outcome != "blocked", f"the loader blocked on the file: {attempt.message}"
    assert attempt.outcome == "raised", (
        f"expected a refusal, the loader {attempt.outcome}: {attempt.message}"
    )
    assert attempt.raised("ValueError"), f"raised {attempt.error_types[0]}: {attempt.message}"
    assert named in attempt.message, f"the refusal does not name {named}: {attempt.message}"


@pytest.mark.rule("CKPT-4")
@pytest.mark.capability(CHECKPOINT_SAFETY)
@pytest.mark.parametrize("kind", list(BLOCKING))
@pytest.mark.parametrize("method", ["inspect_checkpoint", "read_checkpoint_tensor"])
def test_a_shard_that_would_block_is_refused_without_blocking(
    isolated: Callable[..., Attempt], tmp_path: Path, kind: str, method: str
) -> None:
    """Each attempt runs in a fresh process a deadline can kill: a loader that blocks on the
    file fails this test, and the run goes on."""
    shard = blocking_shard(kind, tmp_path / "ckpt")
    args = (shard, "a") if method == "read_checkpoint_tensor" else (shard,)
    kwargs = {"device": torch.device("cpu")} if method == "read_checkpoint_tensor" else {}
    result = isolated(method, *args, **kwargs)
    assert_refused_in_time(result, shard.name)
    assert result.raised("CheckpointError"), result.error_types
    assert result.attributes == {"file": str(shard), "entry": None}


@pytest.mark.rule("CKPT-4")
@pytest.mark.parametrize("kind", list(BLOCKING))
@pytest.mark.parametrize(
    "path",
    [
        pytest.param("dit-adopt", marks=pytest.mark.capability(ZERO_COPY)),
        pytest.param("vae-stream", marks=pytest.mark.capability(VAE_STREAM)),
    ],
)
def test_a_shard_that_would_block_stops_no_load(
    isolated: Callable[..., Attempt], tmp_path: Path, kind: str, path: str
) -> None:
    shard = blocking_shard(kind, tmp_path / "ckpt")
    if path == "dit-adopt":
        dit = DitRequest(CorpusDiT, shard, plan=Plan(torch.device("cpu")), kinds=LINEAR_KINDS)
        result = isolated("load_dit", dit)
    else:
        result = isolated("load_vae", VaeRequest(CorpusVAE, shard, device=torch.device("cpu")))
    assert_refused_in_time(result, shard.name)
