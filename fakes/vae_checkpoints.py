"""VAE checkpoint writers (single file, sharded with an index, one defect each) and a read log.

The writers produce real safetensors files through `fakes.checkpoints.write_checkpoint`. The read
log instruments `TensorReader.read` so a test can see how many checkpoint tensors were alive at
each read: streaming must drop one before it asks for the next.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from fakes.checkpoints import INDEX_NAME, write_checkpoint

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
) -> Path:
    """A single file (`shards=1`) or shards plus an index; returns the path to load from."""
    return write_checkpoint(state, folder, shards=shards, metadata=metadata)


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
    defect: str, state: Mapping[str, torch.Tensor], folder: Path, *, shards: int = 2
) -> DefectiveCheckpoint:
    """Write `state` with one defect.

    duplicate: one name in two shards (always sharded); unknown: an extra tensor no slot takes;
    missing: one tensor dropped; wrong_shape: a Conv3d weight flattened to 2-D (same bytes);
    dtype: a float32 Conv3d weight stored as bfloat16 (a loader converts it back).

    Raises:
        ValueError: for an unknown defect.
    """
    folder.mkdir(parents=True, exist_ok=True)
    tensors = dict(state)
    if defect == "duplicate":
        name = next(iter(tensors))
        return DefectiveCheckpoint(_write_duplicate(tensors, folder, name), defect, name)
    if defect == "unknown":
        name = UNKNOWN_NAME
        tensors[name] = torch.zeros(2)
    elif defect == "missing":
        name = list(tensors)[-1]
        del tensors[name]
    elif defect == "wrong_shape":
        name = _conv_weight(tensors)
        tensors[name] = tensors[name].reshape(tensors[name].shape[0], -1)
    elif defect == "dtype":
        name = _conv_weight(tensors)
        tensors[name] = tensors[name].to(torch.bfloat16)
    else:
        raise ValueError(f"unknown defect {defect!r}; known: {', '.join(DEFECTS)}")
    return DefectiveCheckpoint(write_checkpoint(tensors, folder, shards=shards), defect, name)


class ReadLog:
    """Wraps `TensorReader.read` to record what was read and what was still alive.

    Install with `mocker.patch.object(TensorReader, "read", log.wrap(TensorReader.read))`.

    Attributes:
        names: tensor names in read order.
        devices: the device each read asked for.
        alive_at_read: for each read, how many tensors returned earlier were still alive.
    """

    def __init__(self) -> None:
        self.names: list[str] = []
        self.devices: list[torch.device] = []
        self.alive_at_read: list[int] = []
        self._refs: list[weakref.ref[torch.Tensor]] = []

    @property
    def alive(self) -> int:
        """How many tensors returned by `read` are alive now."""
        return sum(ref() is not None for ref in self._refs)

    def wrap(self, read: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def logged(reader: object, name: str, *, device: torch.device) -> torch.Tensor:
            self.alive_at_read.append(self.alive)
            tensor = read(reader, name, device=device)
            self.names.append(name)
            self.devices.append(device)
            self._refs.append(weakref.ref(tensor))
            return tensor

        return logged
