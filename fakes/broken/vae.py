"""Broken direct VAE loading: one step of `reference.load.vae.load_vae` done wrong each
(VAE-1..13)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch
from torch import nn

from fakes.broken.base import BrokenAdapter
from fakes.broken.readers import WholeFileReader
from reference.errors import ComponentCheckpointUnsupportedError, StateDictABIError
from reference.kit.seam import VaeRequest
from reference.load.vae import VAESteps
from reference.place.modules import Slot, rebuild_non_persistent_buffers
from reference.place.records import TensorRecord
from reference.place.stream import StreamPlan, fill_slot, grad_allowed, preflight, stream
from reference.read.checkpoint import Checkpoint, TensorReader, open_checkpoint
from reference.report.summary import LoadReport
from reference.request.plan import WeightLoadPlan

__all__ = [
    "CPU",
    "BuildsBuffersOnMeta",
    "CpuStreamKeepsFileViews",
    "DropsUnknownTensors",
    "FallsBackForQuantizedVae",
    "FreezesStreamedParameters",
    "IgnoresChannelsLast",
    "KeepsFileDtype",
    "LeavesMissingSlotsOnMeta",
    "LetsMetaBuffersThrough",
    "ReadsWholeVaeCheckpoint",
    "RefusesConstructedBuffersAtEnd",
    "RefusesMetaBuffersLate",
    "ToleratesMissingSlots",
    "VAEDefect",
    "accept_every_buffer",
    "build_everything_on_meta",
    "drop_unknown",
    "fill_with_file_view",
    "ignore_missing",
    "keep_whatever_is_there",
    "rebuild_what_can_be_rebuilt",
    "reference_fill_slot",
    "reference_preflight",
    "reference_rebuild",
    "reference_stream",
    "stream_in_file_dtype",
]

CPU = torch.device("cpu")
reference_preflight = preflight
reference_stream = stream
reference_rebuild = rebuild_non_persistent_buffers


class VAEDefect(BrokenAdapter):
    """A loader whose VAE loads (and slot checks) run the reference with its own `vae_steps`,
    on the `request` it makes of the one asked for, then `after`."""

    def request(self, request: VaeRequest) -> VaeRequest:
        """The load this loader does instead of the one asked for."""
        return request

    def after(self, module: nn.Module) -> None:
        """What this loader does to a loaded VAE before handing it out."""

    def load_vae(self, request: VaeRequest) -> tuple[nn.Module, LoadReport]:
        module, report = super().load_vae(self.request(request))
        self.after(module)
        return module, report


class ReadsWholeVaeCheckpoint(VAEDefect):
    """Materialises the whole checkpoint as a CPU state dict before filling the slots (VAE-1)."""

    name = "broken-reads-whole-vae-checkpoint"
    breaks = frozenset({"VAE-1"})

    def vae_steps(self) -> VAESteps:
        return VAESteps(reader=WholeFileReader)


def drop_unknown(
    checkpoint: Checkpoint, slots: Mapping[str, Slot], *, component: str
) -> StreamPlan:
    """Preflight with `strict=False` on the file side: tensors without a slot are skipped."""
    known = {name: info for name, info in checkpoint.tensors.items() if name in slots}
    kept = dataclasses.replace(checkpoint, tensors=known)
    return reference_preflight(kept, slots, component=component)


class DropsUnknownTensors(VAEDefect):
    """Skips checkpoint tensors that match no slot, entries for non-persistent buffers
    included, instead of refusing them (VAE-4, VAE-7; and the header check against the slots,
    CKPT-3, lets an unknown name through)."""

    name = "broken-drops-unknown-tensors"
    breaks = frozenset({"VAE-4", "VAE-7", "CKPT-3"})

    def vae_steps(self) -> VAESteps:
        return VAESteps(preflight=drop_unknown)


def stream_in_file_dtype(
    reader: TensorReader, slots: Mapping[str, Slot], plan: StreamPlan, *, device: torch.device
) -> tuple[tuple[TensorRecord, ...], dict[str, torch.Tensor]]:
    """Streams each tensor in the dtype the file has, not the slot's."""
    as_file = {
        name: dataclasses.replace(
            slot, tensor=slot.tensor.to(reader.checkpoint.tensors[name].dtype)
        )
        for name, slot in slots.items()
    }
    return reference_stream(reader, as_file, plan, device=device)


class KeepsFileDtype(VAEDefect):
    """Lets the file decide dtypes: a bfloat16 tensor lands in a float32 slot as bfloat16
    (VAE-7)."""

    name = "broken-keeps-file-dtype"
    breaks = frozenset({"VAE-7"})
    also_fails = MappingProxyType(
        {
            rule: "the diffusers test of a bfloat16 file pins it together with VAE-7"
            for rule in ("VAE-1", "VAE-2", "VAE-3", "VAE-8", "VAE-13")
        }
    )

    def vae_steps(self) -> VAESteps:
        return VAESteps(stream=stream_in_file_dtype)


def ignore_missing(
    checkpoint: Checkpoint, slots: Mapping[str, Slot], *, component: str
) -> StreamPlan:
    """Preflight with `strict=False` on the module side: slots the file lacks are not checked."""
    present = {name: slot for name, slot in slots.items() if name in checkpoint.tensors}
    return reference_preflight(checkpoint, present, component=component)


class ToleratesMissingSlots(VAEDefect):
    """Starts streaming although the checkpoint lacks tensors for some slots; the gap shows,
    named, only after every tensor was read (CKPT-3: the headers said so before; VAE-8, which
    asks only that they be refused by name, holds)."""

    name = "broken-tolerates-missing-slots"
    breaks = frozenset({"CKPT-3"})

    def vae_steps(self) -> VAESteps:
        return VAESteps(preflight=ignore_missing)


def keep_whatever_is_there(
    module: nn.Module, filled: Mapping[str, torch.Tensor], *, component: str
) -> None:
    """Does not compare the module's state with what was streamed."""


class LeavesMissingSlotsOnMeta(VAEDefect):
    """Streams what the checkpoint has and hands the module back with the slots it lacks still
    on meta, as a `strict=False` load does (VAE-8; and CKPT-3: the headers said so before)."""

    name = "broken-leaves-missing-slots-on-meta"
    breaks = frozenset({"VAE-8", "CKPT-3"})

    def vae_steps(self) -> VAESteps:
        return VAESteps(preflight=ignore_missing, check_state_kept=keep_whatever_is_there)


def rebuild_what_can_be_rebuilt(
    module: nn.Module, *, device: torch.device, component: str
) -> tuple[str, ...]:
    """Runs the modules' rebuild hooks and lets buffers nothing rebuilt stay on meta."""
    try:
        return reference_rebuild(module, device=device, component=component)
    except StateDictABIError:
        return ()


def accept_every_buffer(module: nn.Module, *, component: str) -> tuple[str, ...]:
    """Does not look at non-persistent buffers after the meta build."""
    return ()


class LetsMetaBuffersThrough(VAEDefect):
    """Hands out a VAE whose non-persistent buffers nothing rebuilt: they stay on meta until
    decode time (VAE-9), as upstream did before 0.5.23."""

    name = "broken-lets-meta-buffers-through"
    breaks = frozenset({"VAE-9"})

    def vae_steps(self) -> VAESteps:
        return VAESteps(
            refuse_buffers=accept_every_buffer, rebuild_buffers=rebuild_what_can_be_rebuilt
        )


class RefusesMetaBuffersLate(VAEDefect):
    """Refuses buffers nothing rebuilds only after the stream, once every tensor was read (as
    upstream 0.5.23 does at finalisation), not right after the meta build (VAE-9)."""

    name = "broken-refuses-meta-buffers-late"
    breaks = frozenset({"VAE-9"})

    def vae_steps(self) -> VAESteps:
        return VAESteps(refuse_buffers=accept_every_buffer)


class RefusesConstructedBuffersAtEnd(VAEDefect):
    """Builds the whole VAE on meta and refuses, at the end of the load, every module whose
    buffers construction computed (they are still on meta), as upstream 0.5.23 does: a class
    the user does not own cannot load, and the refusal comes after the data was read (VAE-9)."""

    name = "broken-refuses-constructed-buffers-at-end"
    breaks = frozenset({"VAE-9"})

    def vae_steps(self) -> VAESteps:
        return VAESteps(build=build_everything_on_meta, refuse_buffers=accept_every_buffer)


def build_everything_on_meta(build: Callable[[], nn.Module], *, component: str) -> nn.Module:
    """Runs `build()` with `meta` as the default device: non-persistent buffers computed in
    `__init__` end up on meta with everything else."""
    with torch.device("meta"):
        module = build()
    if not isinstance(module, nn.Module):
        raise TypeError(f"{component}: build() returned {type(module).__name__}")
    return module


class BuildsBuffersOnMeta(VAEDefect):
    """Builds the whole VAE under `torch.device("meta")`, so buffers computed in `__init__`
    (every diffusers class's) are on meta and, with no hook to rebuild them, refused: a class
    the user does not own cannot load (VAE-9 asks to build them real)."""

    name = "broken-builds-buffers-on-meta"
    breaks = frozenset({"VAE-9"})

    def vae_steps(self) -> VAESteps:
        return VAESteps(build=build_everything_on_meta)


class FreezesStreamedParameters(VAEDefect):
    """Sets requires_grad=False on every streamed parameter (VAE-10)."""

    name = "broken-freezes-parameters"
    breaks = frozenset({"VAE-10"})

    def after(self, module: nn.Module) -> None:
        module.requires_grad_(False)


class IgnoresChannelsLast(VAEDefect):
    """Never applies `channels_last_3d` to a streamed VAE (VAE-11)."""

    name = "broken-ignores-channels-last"
    breaks = frozenset({"VAE-11"})

    def request(self, request: VaeRequest) -> VaeRequest:
        return dataclasses.replace(request, channels_last_3d=False)


class FallsBackForQuantizedVae(VAEDefect):
    """When direct streaming refuses a quantized (or custom-code) VAE, silently loads it the
    generic way instead: built normally, its state dict copied in (VAE-12)."""

    name = "broken-falls-back-for-quantized-vae"
    breaks = frozenset({"VAE-12", "VAE-12b"})

    def load_vae(self, request: VaeRequest) -> tuple[nn.Module, LoadReport]:
        try:
            return super().load_vae(request)
        except ComponentCheckpointUnsupportedError:
            module = request.build()
            reader = TensorReader(open_checkpoint(request.checkpoint))
            module.load_state_dict({name: reader.read(name, device=CPU) for name in reader})
            records = tuple(
                TensorRecord(n, "copied", t.nbytes) for n, t in module.state_dict().items()
            )
            plan = WeightLoadPlan(checkpoint_load_device=CPU)
            return module.to(request.device), LoadReport(request.component, plan, records)


def fill_with_file_view(reader: TensorReader, slot: Slot, *, device: torch.device) -> torch.Tensor:
    """On a CPU target, the slot takes the file map's view itself (converted only when the
    dtype differs) instead of its own storage."""
    if device.type != "cpu":
        return reference_fill_slot(reader, slot, device=device)
    source = reader.read(slot.name, device=CPU)
    tensor = source if source.dtype == slot.dtype else source.to(slot.dtype)
    if not slot.is_parameter:
        slot.owner._buffers[slot.attr] = tensor
        return tensor
    previous = slot.owner._parameters[slot.attr]
    param = nn.Parameter(tensor, requires_grad=slot.requires_grad and grad_allowed(slot.dtype))
    if previous is not None:
        param.__dict__.update(previous.__dict__)
    slot.owner._parameters[slot.attr] = param
    return param


reference_fill_slot = fill_slot


class CpuStreamKeepsFileViews(VAEDefect):
    """The CPU target branch differs from the device branch: slots hold views into the
    checkpoint's file map, not tensors of their own (VAE-13)."""

    name = "broken-cpu-stream-keeps-file-views"
    breaks = frozenset({"VAE-13"})
    also_fails = MappingProxyType({"VAE-1": "both tests of VAE-13 pin VAE-1 too"})

    def vae_steps(self) -> VAESteps:
        return VAESteps(stream=functools.partial(stream, fill=fill_with_file_view))
