"""VAE checkpoint writers: single file, sharded with an index, and one defect each.

The writers produce real safetensors files through `fakes/checkpoints.py:
write_checkpoint`. What a loader read from them is judged from outside
(`reference/kit/judging/evidence.py: DataReads`), never by spying on a loader's reader.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from fakes.checkpoints import INDEX_NAME, write_checkpoint

__all__ = [
    "DEFECTS",
    "UNKNOWN_NAME",
    "DefectiveCheckpoint",
    "write_defective_vae_checkpoint",
    "write_vae_checkpoint",
]

DEFECTS = ("duplicate", "unknown", "missing", "wrong_shape", "dtype")
UNKNOWN_NAME = "decoder.ghost.weight"


@dataclass(frozen=True)
class DefectiveCheckpoint:
    """A written checkpoint with one defect.

    Attributes:
        path: what a loader is given (the single file or the index).
        defect: one of DEFECTS.
        name: the tensor at fault.
    """

    path: Path
    defect: str
    name: str


def write_vae_checkpoint(
    state: Mapping[str, torch.Tensor],
    folder: Path,
    *,
    shards: int = 1,
    metadata: Mapping[str, str] | None = None,
    metadata_in: Sequence[int] | None = None,
) -> Path:
    """A single file (`shards=1`) or shards plus an index; returns the path to load from.
    `metadata_in`: the shards carrying `metadata` (default every one)."""
    return write_checkpoint(
        state, folder, shards=shards, metadata=metadata, metadata_in=metadata_in
    )


def _conv_weight(state: Mapping[str, torch.Tensor]) -> str:
    return next(n for n, t in state.items() if t.ndim == 5 and t.dtype == torch.float32)


def _write_duplicate(state: Mapping[str, torch.Tensor], folder: Path, name: str) -> Path:
    # Two shards that both hold `name`; the index places it in the first.
    names = list(state)
    halves = [names[0::2], names[1::2]]
    weight_map: dict[str, str] = {}
    for i, half in enumerate(halves):
        stem = f"vae-{i + 1:05d}-of-00002"
        part = {n: state[n] for n in half} | {name: state[name]}
        write_checkpoint(part, folder, stem=stem)
        weight_map.update({n: f"{stem}.safetensors" for n in half})
    index = folder / INDEX_NAME
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


def write_defective_vae_checkpoint(
    defect: str,
    state: Mapping[str, torch.Tensor],
    folder: Path,
    *,
    shards: int = 2,
    name: str | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> DefectiveCheckpoint:
    """Write `state` with one defect, on the tensor `name` (a parameter or a persistent buffer;
    by default the first name for duplicate, the last for missing, a float32 Conv3d weight for
    wrong_shape and dtype).

    duplicate: the name in two shards (always sharded); unknown: an extra tensor no slot takes
    (`name` defaults to UNKNOWN_NAME); missing: the tensor dropped; wrong_shape: the tensor
    reshaped (same bytes); dtype: the tensor stored as `dtype` (a loader converts it back).

    Raises:
        ValueError: for an unknown defect.
    """
    folder.mkdir(parents=True, exist_ok=True)
    tensors = dict(state)
    if defect == "duplicate":
        name = name or next(iter(tensors))
        return DefectiveCheckpoint(_write_duplicate(tensors, folder, name), defect, name)
    if defect == "unknown":
        name = name or UNKNOWN_NAME
        tensors[name] = torch.zeros(2)
    elif defect == "missing":
        name = name or list(tensors)[-1]
        del tensors[name]
    elif defect == "wrong_shape":
        name = name or _conv_weight(tensors)
        t = tensors[name]
        tensors[name] = t.reshape(t.shape[0], -1) if t.ndim > 2 else t.reshape(1, -1)
    elif defect == "dtype":
        name = name or _conv_weight(tensors)
        tensors[name] = tensors[name].to(dtype)
    else:
        raise ValueError(f"unknown defect {defect!r}; known: {', '.join(DEFECTS)}")
    return DefectiveCheckpoint(write_checkpoint(tensors, folder, shards=shards), defect, name)
