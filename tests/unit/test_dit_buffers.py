"""VAE-9 on the DiT path: a non-persistent buffer that a meta build leaves on meta.

`HookedRotaryDiT` computes each block's rotary frequencies on the device of the block's own
parameters, so under a meta build they are on meta whatever the build does with buffers, and
its `rebuild_buffers(device)` hook, on `blocks.<i>.rotary` (below the root's children),
recomputes them. A loader that runs such hooks loads the constructed values; one that does not
must refuse naming the buffer right after the meta build, before any tensor data is read.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from fakes.dit import DiTConfig, HookedRotaryDiT, write_dit_checkpoint
from reference.kit.judging.evidence import (
    DataReads,
    data_bytes,
    evidence_missing,
    safetensors_files,
)
from reference.kit.judging.judge import assert_computed_alike, loaded_or_refused
from reference.kit.judging.load_paths import CAPABILITY, load_built
from reference.kit.seam import SeamLoader

pytestmark = pytest.mark.rule("VAE-9")

BIG = DiTConfig(hidden=512, heads=8, depth=3)
"""Tens of MiB of tensor data: a read of them stands out from headers and bookkeeping."""
BUFFERS = tuple(f"blocks.{i}.rotary.freqs" for i in range(BIG.depth))


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=pytest.mark.capability(CAPABILITY[p]))
        for p in ("dit-adopt", "dit-direct")
    ],
)
def test_a_dit_buffer_its_hook_rebuilds_loads_or_is_refused_before_reading(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, path: str
) -> None:
    """Catches a DiT loader that runs no `rebuild_buffers` hook (or only the root's or its
    children's) and finds the buffers on meta only once every tensor was read, or hands them
    out on meta, or fills them with `torch.empty`'s garbage."""
    reason = evidence_missing()
    if reason is not None:
        pytest.skip(reason)
    checkpoint, _ = write_dit_checkpoint(tmp_path, config=BIG)
    data = data_bytes(*safetensors_files(checkpoint))
    build = functools.partial(HookedRotaryDiT, BIG)
    with DataReads() as reads:
        loaded, refused = loaded_or_refused(
            lambda: load_built(loader, path, checkpoint, build=build, runtime_device=runtime_device)
        )
    if refused is not None:
        assert any(name in str(refused) for name in BUFFERS), f"names no buffer: {refused}"
        reads.assert_no_data_read(data)
        return
    assert loaded is not None
    ordinary = HookedRotaryDiT(BIG)
    for name in BUFFERS:
        buffer = loaded.get_buffer(name)
        assert not buffer.is_meta, f"{name} is still on meta after the load"
        expected = ordinary.get_buffer(name)
        assert_computed_alike(buffer.to("cpu"), expected, what=f"buffer {name}")
