"""Kept for adopters who import the seam from here: its home is `reference.kit.seam`."""

from reference.kit.seam import (
    ADMISSION,
    ALL_CAPABILITIES,
    CHECKPOINT_SAFETY,
    CLI_ARGS,
    DIRECT_DIT,
    FP8_DEFER,
    PIPELINES,
    PLANS,
    TENSOR_PARALLEL,
    VAE_STREAM,
    ZERO_COPY,
    LoaderAdapter,
    PlanLike,
)

__all__ = [
    "ADMISSION",
    "ALL_CAPABILITIES",
    "CHECKPOINT_SAFETY",
    "CLI_ARGS",
    "DIRECT_DIT",
    "FP8_DEFER",
    "PIPELINES",
    "PLANS",
    "TENSOR_PARALLEL",
    "VAE_STREAM",
    "ZERO_COPY",
    "LoaderAdapter",
    "PlanLike",
]
