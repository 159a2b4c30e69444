"""Broken loaders for defects the suite once let through: each the reference with one defect
that a loader written independently had, and the rule whose tests now catch it."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch
from torch import nn

from fakes.broken.base import BrokenAdapter
from fakes.broken.dit import DiTDefect
from fakes.broken.readers import SharedMapReader
from reference.errors import CheckpointError, StateDictABIError
from reference.kit.seam import ComponentRequest, PlanLike
from reference.load.dit import DiTSteps
from reference.load.vae import VAESteps
from reference.place.modules import non_persistent_buffers
from reference.read.checkpoint import INDEX_SUFFIX, Checkpoint, TensorReader, open_checkpoint
from reference.read.header import read_header
from reference.read.preflight import check_device_memory
from reference.request.args import own_server_args
from reference.request.model_index import is_transformer_component, read_pipeline
from reference.request.platform import Platform

__all__ = [
    "BuildsTheConfigUnbounded",
    "DefersOnlyTheMainTransformer",
    "FollowsIndexesOutOfTheirFolder",
    "LoadsSafePicklesAsAFallback",
    "MapsOneFileCheckpointsShared",
    "OneFileSharedReader",
    "PreflightsTheFirstShardOnly",
    "RunsNoRebuildHooks",
    "rebuild_without_hooks",
]


class BuildsTheConfigUnbounded(BrokenAdapter):
    """Checks a pipeline component's config.json by constructing its class from it once, an
    ordinary construction on the CPU with no bound from the checkpoint, before the load (as a
    loader that validates a config with `from_config` does): a config that sizes a table or a
    layer far past the weights allocates it, or dies in torch's allocator (CKPT-6)."""

    name = "broken-builds-the-config-unbounded"
    breaks = frozenset({"CKPT-6"})

    def load_pipeline_component(self, request: ComponentRequest) -> torch.nn.Module:
        spec = read_pipeline(request.pipeline_dir).component(request.component)
        model = (request.models or {}).get(spec.class_name)
        if model is not None:
            model(**spec.init_kwargs)  # dropped at once: only a check
        return super().load_pipeline_component(request)


class FollowsIndexesOutOfTheirFolder(BrokenAdapter):
    """Joins each shard name of an index to the index's folder and reads whatever file that
    reaches: `../elsewhere/a.safetensors` or an absolute path leaves the folder, and a file
    that exists there is read as this checkpoint's shard (CKPT-2)."""

    name = "broken-follows-indexes-out-of-their-folder"
    breaks = frozenset({"CKPT-2"})

    def inspect_checkpoint(
        self, path: str | os.PathLike[str]
    ) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        escaping = self._escaping_shards(Path(path))
        if escaping is None:  # every shard name is a file name beside the index: the reference
            return super().inspect_checkpoint(path)
        found: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
        for shard in escaping:
            found.update({t.name: (t.dtype, t.shape) for t in read_header(shard).tensors})
        return found

    @staticmethod
    def _escaping_shards(given: Path) -> list[Path] | None:
        """The index's shards, joined to its folder, where one of their names leaves it and
        every one exists; None otherwise."""
        indexes = sorted(given.glob(f"*{INDEX_SUFFIX}")) if given.is_dir() else [given]
        if len(indexes) != 1 or not indexes[0].name.endswith(INDEX_SUFFIX):
            return None
        if not indexes[0].is_file() or indexes[0].stat().st_size > 1 << 20:
            return None  # a pipe, a device or a huge index: the reference's refusal
        try:
            weight_map = json.loads(indexes[0].read_text())["weight_map"]
            names = list(dict.fromkeys(weight_map.values()))
        except Exception:  # unreadable or malformed: the reference's refusal
            return None
        if not all(isinstance(n, str) and n for n in names):
            return None
        if all(Path(n).name == n for n in names):
            return None
        shards = [indexes[0].parent / n for n in names]  # an absolute name replaces the folder
        return shards if all(s.is_file() for s in shards) else None


class LoadsSafePicklesAsAFallback(BrokenAdapter):
    """When safetensors cannot parse a `.safetensors` file, tries `torch.load(weights_only=True)`
    on it, the "safe" unpickler: a plain `torch.save` of tensors under a safetensors name is
    read as a checkpoint (CKPT-1: only safetensors is read)."""

    name = "broken-loads-safe-pickles-as-a-fallback"
    breaks = frozenset({"CKPT-1"})

    def inspect_checkpoint(
        self, path: str | os.PathLike[str]
    ) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        try:
            return super().inspect_checkpoint(path)
        except CheckpointError:
            state = self._unpickled(Path(path))
            if state is None:
                raise
            return {name: (t.dtype, tuple(t.shape)) for name, t in state.items()}

    def read_checkpoint_tensor(
        self, path: str | os.PathLike[str], name: str, *, device: torch.device
    ) -> torch.Tensor:
        try:
            return super().read_checkpoint_tensor(path, name, device=device)
        except CheckpointError:
            state = self._unpickled(Path(path))
            if state is None or name not in state:
                raise
            return state[name].to(device)

    @staticmethod
    def _unpickled(path: Path) -> dict[str, torch.Tensor] | None:
        if not (path.is_file() and path.name.endswith(".safetensors")):
            return None
        try:
            with path.open("rb") as file:  # a file object: torch.load goes by content, not name
                state = torch.load(file, weights_only=True)
        except Exception:  # not a pickle the safe unpickler takes: the first error stands
            return None
        if not isinstance(state, dict):
            return None
        return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


class OneFileSharedReader(TensorReader):
    """The reference's reader, but a checkpoint of one file is mapped shared (a writable view
    of the file), as a loader that special-cases the one-file layout with its own mmap does."""

    def read(self, name: str, *, device: torch.device) -> torch.Tensor:
        if len(self.checkpoint.files) == 1:
            return SharedMapReader(self.checkpoint).read(name, device=device)
        return super().read(name, device=device)


class MapsOneFileCheckpointsShared(DiTDefect):
    """Maps a one-file checkpoint shared instead of copy-on-write (sharded ones as the
    reference): writing to an adopted parameter writes the file (ZC-13, and so CKPT-5)."""

    name = "broken-maps-one-file-checkpoints-shared"
    breaks = frozenset({"ZC-13", "CKPT-5"})

    def dit_steps(self, plan: PlanLike, *, fsdp: bool) -> DiTSteps:
        return DiTSteps(reader=OneFileSharedReader)


class PreflightsTheFirstShardOnly(BrokenAdapter):
    """Sizes a direct load from the first shard's header alone (the loop that sums the shards
    stops after one): a sharded checkpoint that does not fit passes the preflight (DG-6)."""

    name = "broken-preflights-the-first-shard-only"
    breaks = frozenset({"DG-6"})

    def check_device_memory(
        self, checkpoint: Path, *, component: str, device: torch.device, platform: Platform
    ) -> int:
        opened = open_checkpoint(checkpoint)
        first = opened.files[0]
        tensors = {n: t for n, t in opened.tensors.items() if t.file == first}
        return check_device_memory(
            Checkpoint((first,), tensors), component=component, device=device, platform=platform
        )


def rebuild_without_hooks(
    module: nn.Module, *, device: torch.device, component: str
) -> tuple[str, ...]:
    """The reference's buffer step without the `rebuild_buffers` hooks: a buffer on meta after
    the stream is refused then, naming it, once every tensor was read."""
    buffers = non_persistent_buffers(module)
    on_meta = sorted(name for name, entry in buffers.items() if entry.tensor.is_meta)
    if on_meta:
        raise StateDictABIError(f"{component}: buffers {', '.join(on_meta)} are on meta")
    for entry in buffers.values():
        entry.owner._buffers[entry.attr] = entry.tensor.to(device)
    return tuple(buffers)


class RunsNoRebuildHooks(DiTDefect):
    """Accepts a buffer construction leaves on meta when the module has a hook to rebuild it,
    then never runs the hook, on the DiT and the VAE paths: the buffer is refused only after
    every tensor was read (VAE-9: a loader that does not rebuild it must refuse right after the
    meta build)."""

    name = "broken-runs-no-rebuild-hooks"
    breaks = frozenset({"VAE-9"})

    def dit_steps(self, plan: PlanLike, *, fsdp: bool) -> DiTSteps:
        return DiTSteps(rebuild_buffers=rebuild_without_hooks)

    def vae_steps(self) -> VAESteps:
        return VAESteps(rebuild_buffers=rebuild_without_hooks)


class DefersOnlyTheMainTransformer(BrokenAdapter):
    """Defers the CPU offload of an online-quantized DiT for `transformer` alone: Wan 2.2's
    `transformer_2` is quantized on the device and then left there, never offloaded (FP8-2
    covers every transformer the pipeline declares)."""

    name = "broken-defers-only-the-main-transformer"
    breaks = frozenset({"FP8-2"})
    gpu_only = "on a CPU runtime device the offload moves nothing, so a missing one shows nowhere"

    def load_pipeline_component(self, request: ComponentRequest) -> torch.nn.Module:
        own = own_server_args(request.args)
        name = request.component
        if is_transformer_component(name) and name != "transformer" and own.is_cpu_offloaded(name):
            kept = {**own.component_cpu_offload, name: False}
            own = dataclasses.replace(own, component_cpu_offload=kept)
        return super().load_pipeline_component(dataclasses.replace(request, args=own))
