"""Broken staging: direct DiT loads whose staging reader breaks its ordering or its bound."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fakes.broken.base import BrokenAdapter
from fakes.engine import DelayedEngine
from reference.kit.seam import PlanLike
from reference.load.dit import REFERENCE_DIT_STEPS, DiTSteps
from reference.read.checkpoint import Checkpoint
from reference.read.staging import StagingReader

__all__ = ["RefillsStagingBeforeCopiesEnd", "StagesTheWholeCheckpoint"]

# Two small buffers, so that every checkpoint passes through each buffer about a hundred times
# (at least 256 bytes a buffer: a big checkpoint in 256-byte copies took seconds a load).
FILLS = 256
LEAST_STAGING_BYTES = 256


class _SkipsTheWait(StagingReader):
    """Fills a staging buffer again without waiting for the copies out of it."""

    def _drain(self, buffer: Any) -> None:
        """The copies still pending read whatever the buffer holds when they run."""


def _skipping_reader(checkpoint: Checkpoint, **kwargs: Any) -> StagingReader:
    size = max(LEAST_STAGING_BYTES, checkpoint.total_bytes // FILLS)
    options = replace(kwargs.pop("options"), staging_bytes=size, staging_buffers=2)
    return _SkipsTheWait(checkpoint, options=options, **kwargs)


def _whole_checkpoint_reader(checkpoint: Checkpoint, **kwargs: Any) -> StagingReader:
    options = replace(kwargs.pop("options"), staging_bytes=checkpoint.total_bytes or 1)
    return StagingReader(checkpoint, options=options, **kwargs)


class RefillsStagingBeforeCopiesEnd(BrokenAdapter):
    """Direct mode refills a staging buffer before the copies out of it completed, so a late
    copy reads the next bytes into its tensor (DG-4: the tensors on the device are not the
    files'). Its copies complete late and out of order, as a GPU's do (the kit's
    `DelayedEngine`, seeded): with a copy engine that finishes each copy before returning
    (the CPU's) the defect would never show, on a GPU it shows as rare corrupted weights."""

    name = "broken-refills-staging-before-copies-end"
    breaks = frozenset({"DG-4"})

    def dit_steps(self, plan: PlanLike, *, fsdp: bool) -> DiTSteps:
        if not plan.load_full_state_dict_on_device:
            return REFERENCE_DIT_STEPS
        return replace(REFERENCE_DIT_STEPS, staging=_skipping_reader, engine=DelayedEngine(0))


class StagesTheWholeCheckpoint(BrokenAdapter):
    """Direct mode stages through one buffer as large as the checkpoint: host memory holds the
    state dict on its way to the device (DG-8)."""

    name = "broken-stages-the-whole-checkpoint"
    breaks = frozenset({"DG-8"})
    gpu_only = (
        "onto the CPU the destination is host memory and is its own staging buffer, so no"
        " staging buffer is allocated: only a load onto CUDA stages"
    )

    def dit_steps(self, plan: PlanLike, *, fsdp: bool) -> DiTSteps:
        return replace(REFERENCE_DIT_STEPS, staging=_whole_checkpoint_reader)
