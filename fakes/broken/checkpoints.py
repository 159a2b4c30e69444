"""Broken checkpoint readers behind the adapter's checkpoint methods (CKPT-1, CKPT-2, CKPT-4)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import safe_open

from reference.header import DTYPES, PICKLE_SUFFIXES, read_header
from reference.kit.fakes.broken.base import BrokenAdapter

__all__ = ["IgnoresShardIndex", "SafetensorsLibraryErrors", "UnpicklesLegacyCheckpoints"]


def _path(path: str | os.PathLike[str]) -> Path:
    return Path(path)


class UnpicklesLegacyCheckpoints(BrokenAdapter):
    """Reads `.bin` / `.pt` checkpoints with `torch.load`, as legacy loaders do: unpickling runs
    whatever code the file carries (CKPT-1)."""

    name = "broken-unpickles-legacy-checkpoints"
    breaks = frozenset({"CKPT-1"})

    def inspect_checkpoint(
        self, path: str | os.PathLike[str]
    ) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        if _path(path).name.endswith(PICKLE_SUFFIXES):
            state = torch.load(_path(path), weights_only=False)
            tensors = state.items() if isinstance(state, dict) else ()
            return {k: (v.dtype, tuple(v.shape)) for k, v in tensors if isinstance(v, torch.Tensor)}
        return super().inspect_checkpoint(path)


class IgnoresShardIndex(BrokenAdapter):
    """Takes every `*.safetensors` beside an index and never reads the index itself: a shard it
    names that is missing, or names it places wrongly, go unnoticed (CKPT-2); a corrupt index
    is never reported (CKPT-4)."""

    name = "broken-ignores-shard-index"
    breaks = frozenset({"CKPT-2", "CKPT-4"})

    def inspect_checkpoint(
        self, path: str | os.PathLike[str]
    ) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        folder = _path(path) if _path(path).is_dir() else _path(path).parent
        if not any(folder.glob("*.safetensors.index.json")):
            return super().inspect_checkpoint(path)
        found: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
        for shard in sorted(folder.glob("*.safetensors")):
            found.update({t.name: (t.dtype, t.shape) for t in read_header(shard).tensors})
        return found


class SafetensorsLibraryErrors(BrokenAdapter):
    """Opens each file with the safetensors library and lets its errors through as they come:
    bare library exceptions that name neither the file nor the tensor (CKPT-4), for a pickle
    too (CKPT-1: refused naming the pickle file)."""

    name = "broken-safetensors-library-errors"
    breaks = frozenset({"CKPT-1", "CKPT-4"})

    def inspect_checkpoint(
        self, path: str | os.PathLike[str]
    ) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        # Folders, indexes and anything but a regular file (a pipe would block) go the right way.
        if not _path(path).is_file() or _path(path).name.endswith(".json"):
            return super().inspect_checkpoint(path)
        found: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (a safe_open handle is not a mapping)
                piece = handle.get_slice(name)
                found[name] = (DTYPES[piece.get_dtype()], tuple(piece.get_shape()))
        return found
