"""Header preflight and per-tensor streaming of a checkpoint into a module's slots.

Preflight (CKPT-3) compares the names, shapes and dtypes that the safetensors headers declare with
the slots before a single tensor byte is read, so a mismatched checkpoint fails with the module
untouched. Streaming (VAE-1, VAE-7, VAE-8) then reads one tensor at a time and gives each slot its
own fresh tensor on the target device; the tensor read from the file is dropped before the next
one is read, so no state dict (on CPU or anywhere) is ever built.

dtype policy: a checkpoint tensor whose dtype differs from its slot's is converted to the slot's
dtype, once, while it is copied into the slot. The module decides dtypes; the file does not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from reference.errors import LISTED, StateMismatchError, listed, shown
from reference.place.modules import Slot
from reference.place.records import TensorRecord
from reference.read.checkpoint import Checkpoint, TensorReader
from reference.read.staging import StagingReader

__all__ = ["StreamPlan", "fill_slot", "grad_allowed", "preflight", "stream"]

CPU = torch.device("cpu")
FLOAT8 = frozenset(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, name)
)


@dataclass(frozen=True)
class StreamPlan:
    """What the headers promise, checked against the slots.

    Attributes:
        names: tensor names in read order (each file front to back).
        conversions: name -> (checkpoint dtype, slot dtype) for tensors converted on the way in.
    """

    names: tuple[str, ...]
    conversions: Mapping[str, tuple[torch.dtype, torch.dtype]]


def preflight(checkpoint: Checkpoint, slots: Mapping[str, Slot], *, component: str) -> StreamPlan:
    """CKPT-3: check the checkpoint's headers against the slots; reads no tensor data.

    Names seen twice across shards are already refused by `open_checkpoint` (CKPT-2, CKPT-4).

    Args:
        checkpoint: from `reference.read.checkpoint.open_checkpoint` (validated headers only).
        slots: from `reference.place.slots.state_slots`.
        component: named in error messages.

    Returns:
        The read order and the dtype conversions the stream will make.

    Raises:
        StateMismatchError: listing unknown tensors, missing slots, or each wrong shape.
    """
    unknown = sorted(set(checkpoint.tensors) - set(slots))
    if unknown:
        files = sorted({checkpoint.tensors[name].file.name for name in unknown})
        raise StateMismatchError(
            f"{component}: the checkpoint holds tensors the module has no slot for:"
            f" {listed(unknown)} (in {listed(files)}). Check that the checkpoint belongs to"
            " this model class and config"
        )
    missing = sorted(set(slots) - set(checkpoint.tensors))
    if missing:
        in_files = listed(file.name for file in checkpoint.files)
        raise StateMismatchError(
            f"{component}: the checkpoint ({in_files}) lacks tensors for these slots:"
            f" {listed(missing)}. Every parameter and persistent buffer must come from the"
            " checkpoint"
        )
    wrong = [
        f"{shown(name)} is {list(info.shape)} in {shown(info.file.name)}, the module expects"
        f" {list(slots[name].shape)}"
        for name, info in sorted(checkpoint.tensors.items())
        if info.shape != slots[name].shape
    ]
    if wrong:
        more = f"; and {len(wrong) - LISTED} more" if len(wrong) > LISTED else ""
        raise StateMismatchError(f"{component}: wrong shapes: {'; '.join(wrong[:LISTED])}{more}")
    names = tuple(TensorReader(checkpoint))
    conversions = {
        name: (info.dtype, slots[name].dtype)
        for name, info in checkpoint.tensors.items()
        if info.dtype != slots[name].dtype
    }
    return StreamPlan(names, conversions)


def grad_allowed(dtype: torch.dtype) -> bool:
    """VAE-10: only floating (not float8) and complex tensors may require grad."""
    return (dtype.is_floating_point and dtype not in FLOAT8) or dtype.is_complex


def fill_slot(reader: TensorReader, slot: Slot, *, device: torch.device) -> torch.Tensor:
    """Read one checkpoint tensor and assign a fresh copy of it into its slot on `device`.

    The tensor the reader returns (on CPU, a view into the file's private map; from a
    `StagingReader`, a fresh tensor already on `device`) is local to this function, so it is
    gone when the function returns: the slot holds its own storage, converted to the slot's
    dtype on `device` (PREC-5). Where the reader's tensors are fresh buffers of their own
    (`reader.fresh_names`: the pool's, the staging reader's) and one already is what the slot
    needs (on `device`, the slot's dtype and shape), it becomes the slot's tensor without a
    second copy. A parameter keeps its `requires_grad` and Python attributes (VAE-10).

    Returns:
        The tensor now held by the slot.
    """
    source = reader.read(slot.name, device=device if isinstance(reader, StagingReader) else CPU)
    if (
        slot.name in reader.fresh_names
        and source.device.type == device.type
        and source.dtype == slot.dtype
        and tuple(source.shape) == slot.shape
        and source.is_contiguous()
    ):
        tensor = source
    else:
        tensor = torch.empty(slot.shape, dtype=slot.dtype, device=device).copy_(source)
    if slot.is_parameter:
        previous = slot.owner._parameters[slot.attr]
        param = nn.Parameter(tensor, requires_grad=slot.requires_grad and grad_allowed(slot.dtype))
        if previous is not None:
            param.__dict__.update(previous.__dict__)
        slot.owner._parameters[slot.attr] = param
        return param
    slot.owner._buffers[slot.attr] = tensor
    return tensor


def stream(
    reader: TensorReader,
    slots: Mapping[str, Slot],
    plan: StreamPlan,
    *,
    device: torch.device,
    fill: Callable[..., torch.Tensor] = fill_slot,
) -> tuple[tuple[TensorRecord, ...], dict[str, torch.Tensor]]:
    """VAE-1, VAE-7, VAE-8: stream every tensor of a preflighted checkpoint into its slot.

    CPU and accelerator targets share this one path (VAE-13): each tensor is read as a CPU view of
    the file and copied once into a fresh tensor allocated on `device`.

    Args:
        reader: over the checkpoint that `plan` was made from.
        slots: the slots `plan` was checked against; preflight guarantees that every name is
            read once (names are unique across shards) and every slot is filled.
        plan: from `preflight`.
        device: the target device.
        fill: reads one tensor into its slot (`fill_slot`'s signature); the reference's by
            default.

    Returns:
        One "streamed" record per tensor, and the tensor each slot now holds, by name.
    """
    filled: dict[str, torch.Tensor] = {}
    records = []
    for name in plan.names:
        filled[name] = fill(reader, slots[name], device=device)
        conversion = plan.conversions.get(name)
        reason = f"dtype {conversion[0]} converted to {conversion[1]}" if conversion else None
        tensor = filled[name]
        source = conversion[0] if conversion else None
        records.append(TensorRecord(name, "streamed", tensor.nbytes, reason, source, tensor.dtype))
    return tuple(records), filled
