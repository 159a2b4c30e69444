"""Broken checkpoint readers behind the adapter's checkpoint methods (CKPT-1, CKPT-2, CKPT-4),
and a correct one that takes the other branch of CKPT-2's either-or rules."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from fakes.broken.base import BrokenAdapter
from reference.errors import CheckpointError
from reference.kit.seam import ComponentRequest, DitRequest, VaeRequest
from reference.load import dit
from reference.place.modules import Slot, Slots
from reference.place.stream import StreamPlan
from reference.place.stream import preflight as reference_preflight
from reference.read.checkpoint import (
    INDEX_SUFFIX,
    Checkpoint,
    StreamingReader,
    TensorReader,
    hidden_files,
    open_checkpoint,
)
from reference.read.header import DTYPES, PICKLE_SUFFIXES, TensorInfo, read_header
from reference.report.summary import LoadReport
from reference.request.platform import Platform

__all__ = [
    "FolderPolicy",
    "IgnoresShardIndex",
    "ReadsDotfilesAsShards",
    "ReadsOneOfSeveralUnindexedFiles",
    "RefusesUnindexedFoldersAndDotfiles",
    "SafetensorsLibraryErrors",
    "UnpicklesLegacyCheckpoints",
    "unindexed_files",
    "with_dotfiles",
]


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


def unindexed_files(path: Path) -> tuple[Path, ...]:
    """The `*.safetensors` files of a folder without a shard index, dotfiles aside, where there
    are several: what CKPT-2 lets a loader read as one checkpoint or refuse naming them; ()
    for anything else (a file, an index, a folder with an index or one file)."""
    if not path.is_dir() or any(not p.name.startswith(".") for p in path.glob(f"*{INDEX_SUFFIX}")):
        return ()
    files = tuple(sorted(p for p in path.glob("*.safetensors") if not p.name.startswith(".")))
    return files if len(files) > 1 else ()


class FolderPolicy(BrokenAdapter):
    """The reference adapter with its own answer to what a checkpoint path names: every path
    a checkpoint method is handed (a file, an index, a folder) goes through `resolve` first,
    which may refuse it or hand the reference another path."""

    def resolve(self, path: Path) -> Path:
        """The path the reference reads for `path` (here: `path` itself)."""
        return path

    def inspect_checkpoint(
        self, path: str | os.PathLike[str]
    ) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        return super().inspect_checkpoint(self.resolve(_path(path)))

    def read_checkpoint_tensor(
        self, path: str | os.PathLike[str], name: str, *, device: torch.device
    ) -> torch.Tensor:
        return super().read_checkpoint_tensor(self.resolve(_path(path)), name, device=device)

    def load_dit(self, request: DitRequest) -> tuple[nn.Module, LoadReport]:
        return super().load_dit(
            replace(request, checkpoint=self.resolve(_path(request.checkpoint)))
        )

    def load_vae(self, request: VaeRequest) -> tuple[nn.Module, LoadReport]:
        return super().load_vae(
            replace(request, checkpoint=self.resolve(_path(request.checkpoint)))
        )

    def check_device_memory(
        self, checkpoint: Path, *, component: str, device: torch.device, platform: Platform
    ) -> int:
        return super().check_device_memory(
            self.resolve(_path(checkpoint)), component=component, device=device, platform=platform
        )


class ReadsOneOfSeveralUnindexedFiles(FolderPolicy):
    """Given a folder of several `.safetensors` files and no index, reads the first of them
    and nothing else, silently, as a loader that takes "the" checkpoint file of a folder does:
    the others' tensors are never seen (CKPT-2: never read as one of them silently), nor a
    name two of them hold (CKPT-4: duplicate names across shards). A pipeline's component
    folder is read as the reference reads it."""

    name = "broken-reads-one-of-several-unindexed-files"
    breaks = frozenset({"CKPT-2", "CKPT-4"})

    def resolve(self, path: Path) -> Path:
        files = unindexed_files(path)
        return files[0] if files else path


class RefusesUnindexedFoldersAndDotfiles(FolderPolicy):
    """CKPT-2's other branches, where the reference takes the first: a folder of several
    `.safetensors` files and no index is refused naming the files (the reference reads them as
    one checkpoint), and a folder holding a dotfile named like a checkpoint file (macOS's
    `._model.safetensors`) is refused naming it (the reference skips it, with a note). On every
    path, a pipeline's component folders included."""

    name = "correct-refuses-unindexed-folders-and-dotfiles"
    exercises = frozenset({"CKPT-2", "CKPT-4"})

    def resolve(self, path: Path) -> Path:
        dotfiles = hidden_files(path)
        if dotfiles:
            raise CheckpointError(
                str(dotfiles[0]),
                None,
                "a dotfile (such as macOS's ._ metadata) named like a checkpoint file; it is not"
                " part of the checkpoint: remove it, or give the checkpoint's own file",
            )
        files = unindexed_files(path)
        if files:
            raise CheckpointError(
                str(path),
                None,
                f"holds {len(files)} *.safetensors files and no shard index"
                f" ({', '.join(f.name for f in files)}); give one file, or the index that makes"
                " them one checkpoint",
            )
        return path

    def load_pipeline_component(self, request: ComponentRequest) -> torch.nn.Module:
        # A component's weights live in its folder.
        self.resolve(_path(request.pipeline_dir) / request.component)
        return super().load_pipeline_component(request)


def with_dotfiles(path: Path) -> Checkpoint | None:
    """The folder `path` read with every `*.safetensors` in it a shard, dotfiles too, under the
    reference's rule for a name in two shards; None where `path` is no folder without an
    index holding such a dotfile (the reference reads it then)."""
    if not path.is_dir() or any(path.glob(f"*{INDEX_SUFFIX}")):
        return None
    files = tuple(sorted(path.glob("*.safetensors")))
    if not any(f.name.startswith(".") for f in files):
        return None
    parts = [open_checkpoint(f) for f in files]
    tensors: dict[str, TensorInfo] = {}
    for part in parts:
        for name, info in part.tensors.items():
            if name in tensors:
                raise CheckpointError(
                    str(info.file),
                    name,
                    f"tensor also present in {tensors[name].file.name}; each name must live in"
                    " exactly one shard",
                )
            tensors[name] = info
    return Checkpoint(
        files,
        tensors,
        parts[0].metadata,
        {file: meta for part in parts for file, meta in part.file_metadata.items()},
        {file: identity for part in parts for file, identity in part.identities.items()},
    )


class ReadsDotfilesAsShards(BrokenAdapter):
    """Takes every `*.safetensors` of a folder as a shard, dotfiles too: macOS's
    `._model.safetensors` beside the checkpoint is read with it, its names listed, checked
    against the model and loaded, a name it shares with the checkpoint refused as a duplicate
    (CKPT-2: a dotfile is skipped or refused naming it, never read as a shard)."""

    name = "broken-reads-dotfiles-as-shards"
    breaks = frozenset({"CKPT-2"})

    def inspect_checkpoint(
        self, path: str | os.PathLike[str]
    ) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        merged = with_dotfiles(_path(path))
        if merged is None:
            return super().inspect_checkpoint(path)
        return {name: (info.dtype, info.shape) for name, info in merged.tensors.items()}

    def read_checkpoint_tensor(
        self, path: str | os.PathLike[str], name: str, *, device: torch.device
    ) -> torch.Tensor:
        merged = with_dotfiles(_path(path))
        if merged is None:
            return super().read_checkpoint_tensor(path, name, device=device)
        if name not in merged.tensors:
            raise CheckpointError(os.fspath(path), name, "holds no tensor of this name")
        reader = TensorReader(merged)
        try:
            return reader.read(name, device=device)
        finally:
            reader.close()

    def load_dit(self, request: DitRequest) -> tuple[nn.Module, LoadReport]:
        merged = with_dotfiles(_path(request.checkpoint))
        steps = self.dit_steps(request.plan, fsdp=request.fsdp)
        if merged is not None:
            ours = merged

            def check_names(
                module: nn.Module,
                names: set[str],
                *,
                component: str,
                slots: Slots,
                files: Sequence[Path] = (),
            ) -> None:
                names = set(ours.tensors)
                dit.check_names(module, names, component=component, files=ours.files, slots=slots)

            steps = replace(steps, reader=lambda _: TensorReader(ours), check_names=check_names)
        return self.load_dit_with(request, steps)

    def load_vae(self, request: VaeRequest) -> tuple[nn.Module, LoadReport]:
        merged = with_dotfiles(_path(request.checkpoint))
        steps = self.vae_steps()
        if merged is not None:
            ours = merged

            def preflight(
                _: Checkpoint, slots: Mapping[str, Slot], *, component: str
            ) -> StreamPlan:
                return reference_preflight(ours, slots, component=component)

            steps = replace(steps, preflight=preflight, reader=lambda _: StreamingReader(ours))
        return self.load_vae_with(request, steps)
