"""Pickle checkpoints that prove it when they are unpickled (CKPT-1).

Unpickling a `Trap` calls `trip(marker)`, which creates the marker file: a loader that unpickled
any of these files, in this process or another, leaves the marker behind. Each case is a way a
pickle can be offered where safetensors is expected.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from fakes.checkpoints import write_checkpoint
from fakes.corrupt import small_state

__all__ = ["PICKLE_CASES", "PickleCase", "Trap", "trap_state", "trip", "write_pickle_case"]


def trip(marker: str) -> None:
    """What an unpickled trap runs: it leaves `marker` on disk."""
    Path(marker).write_text("a checkpoint ran code while it was loaded\n")


class Trap:
    """An object whose unpickling calls `trip(marker)`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[[str], None], tuple[str]]:
        return trip, (str(self.marker),)


def trap_state(marker: Path) -> dict[str, object]:
    """A state dict whose every value is a trap."""
    return {name: Trap(marker) for name in small_state()}


@dataclass(frozen=True)
class PickleCase:
    """One pickle offered to a loader.

    Attributes:
        case: the case's name.
        path: what to hand the loader (file, index or folder).
        file: the file the error must name, or None when the load must succeed (the pickle sits
            beside valid safetensors and is never looked at).
        words: a fragment of the expected message.
        or_named: another file or folder whose naming conforms as well (CKPT-1: a folder or an
            index that offers only pickles may be refused naming it instead of the pickle).
    """

    case: str
    path: Path
    file: str | None
    words: str
    or_named: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a refusal may give and conform."""
        return tuple(n for n in (self.file, self.or_named) if n is not None)


def _raw(folder: Path, marker: Path) -> PickleCase:
    path = folder / "pytorch_model.bin"
    path.write_bytes(pickle.dumps(trap_state(marker)))
    return PickleCase("pickle-file", path, path.name, "pickle checkpoint")


def _torch_zip(folder: Path, marker: Path) -> PickleCase:
    path = folder / "model.pt"
    torch.save(trap_state(marker), path)
    return PickleCase("torch-save-file", path, path.name, "pickle checkpoint")


def _only_pickle_in_folder(folder: Path, marker: Path) -> PickleCase:
    path = folder / "diffusion_pytorch_model.bin"
    path.write_bytes(pickle.dumps(trap_state(marker)))
    return PickleCase(
        "folder-of-pickles", folder, path.name, "pickle checkpoint", or_named=folder.name
    )


def _index_names_pickle(folder: Path, marker: Path) -> PickleCase:
    shard = folder / "pytorch_model-00001-of-00001.bin"
    shard.write_bytes(pickle.dumps(trap_state(marker)))
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": dict.fromkeys(small_state(), shard.name)}))
    return PickleCase(
        "index-names-a-pickle", index, shard.name, "pickle checkpoint", or_named=index.name
    )


def _disguised(folder: Path, marker: Path) -> PickleCase:
    path = folder / "model.safetensors"
    path.write_bytes(pickle.dumps(trap_state(marker)))
    return PickleCase("pickle-named-safetensors", path, path.name, "exceeds the file")


def _safe_pickle_disguised(folder: Path, marker: Path) -> PickleCase:
    """A plain `torch.save` of real tensors under a safetensors name: no trap, and one that
    `torch.load(weights_only=True)` accepts, so a loader that falls back to that "safe"
    unpickler on a file safetensors cannot parse loads it (CKPT-1: only safetensors is read)."""
    path = folder / "model.safetensors"
    torch.save(small_state(), path)
    return PickleCase("torch-save-named-safetensors", path, path.name, "exceeds the file")


def _beside_safetensors(folder: Path, marker: Path) -> PickleCase:
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(trap_state(marker)))
    write_checkpoint(small_state(), folder)
    return PickleCase("pickle-beside-safetensors", folder, None, "")


PICKLE_CASES: dict[str, Callable[[Path, Path], PickleCase]] = {
    "pickle-file": _raw,
    "torch-save-file": _torch_zip,
    "folder-of-pickles": _only_pickle_in_folder,
    "index-names-a-pickle": _index_names_pickle,
    "pickle-named-safetensors": _disguised,
    "torch-save-named-safetensors": _safe_pickle_disguised,
    "pickle-beside-safetensors": _beside_safetensors,
}


def write_pickle_case(case: str, folder: Path, *, marker: Path) -> PickleCase:
    """Write pickle case `case` into `folder` (created); unpickling it would create `marker`."""
    folder.mkdir(parents=True, exist_ok=True)
    return PICKLE_CASES[case](folder, marker)
