"""What a pipeline's components will hold, and one memory preflight per device (PIPE-2).

Every component is built on `meta` before any tensor of any component is read
(`ComponentLoader.prepare`); from that build and the headers this module checks the checkpoint
against the slots (names and shapes, CKPT-3) and counts the bytes each component will hold at
the end of the load on each device. `check_pipeline_memory` then compares, per device, what all
the components will hold there (plus the largest tensor in flight and the stated margin) with
what the platform has, and refuses a pipeline that does not fit as a whole, naming the device,
the bytes and the components: a pipeline whose parts each fit but together do not is found out
before the first byte of tensor data moves, never halfway through.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from reference.errors import LISTED, DeviceMemoryError, HostMemoryError, StateMismatchError, shown
from reference.load.dit import check_names
from reference.place.modules import find_slots
from reference.read.checkpoint import Checkpoint
from reference.read.preflight import device_memory_margin
from reference.request.platform import Platform

__all__ = [
    "ComponentNeeds",
    "check_pipeline_memory",
    "check_shapes",
    "component_needs",
    "describe_bytes",
]

HOST = torch.device("cpu")


@dataclass(frozen=True)
class ComponentNeeds:
    """The memory one component will take where it ends up, counted before any tensor is read.

    Attributes:
        component: its name.
        device: where its tensors live at the end (the CPU for an offloaded component).
        held: bytes its slots will take there: every slot in its dtype, except, on the CPU,
            the tensors a zero-copy load adopts as views of the files (file-backed pages, not
            the process's own memory).
        largest: its largest single slot, in bytes (the tensor in flight).
    """

    component: str
    device: torch.device
    held: int
    largest: int


def check_shapes(module: nn.Module, checkpoint: Checkpoint, *, component: str) -> None:
    """CKPT-3 before any read: the checkpoint's names are the module's slots, and each tensor's
    shape is its slot's (a slot whose parameter brings its own `weight_loader` may reshape what
    it is given, and is not judged here).

    Raises:
        StateMismatchError: naming the unknown and missing names, or each wrong shape.
    """
    found = find_slots(module)
    names = set(checkpoint.tensors)
    check_names(module, names, component=component, files=checkpoint.files, slots=found)
    wrong = []
    for name, info in sorted(checkpoint.tensors.items()):
        slot = found.by_name.get(found.aliases.get(name, name))
        if slot is None or hasattr(slot.tensor, "weight_loader"):
            continue
        if tuple(slot.tensor.shape) != info.shape:
            wrong.append(
                f"'{shown(name)}' is {list(info.shape)} in {shown(info.file.name)}, the model"
                f" expects {list(slot.tensor.shape)}"
            )
    if wrong:
        more = f" and {len(wrong) - LISTED} more" if len(wrong) > LISTED else ""
        raise StateMismatchError(
            f"{component}: checkpoint and model disagree before any tensor was read; wrong"
            f" shapes: {'; '.join(wrong[:LISTED])}{more}"
        )


def component_needs(
    module: nn.Module,
    checkpoint: Checkpoint,
    *,
    component: str,
    device: torch.device,
    load_device: torch.device,
    adopts: bool,
) -> ComponentNeeds:
    """The bytes `module` (built on meta, slots in their final dtypes) will hold on `device`.

    `adopts`: the load may keep CPU tensors as views of the files (zero-copy); then a tensor
    loaded on the CPU whose file dtype is its slot's and whose bytes are aligned for it is
    counted as the files' pages, not as the process's memory. Tied names count once.
    """
    found = find_slots(module)
    held = largest = 0
    for name, slot in found.by_name.items():
        size = slot.tensor.numel() * slot.tensor.element_size()
        largest = max(largest, size)
        info = checkpoint.tensors.get(name)
        if (
            adopts
            and device.type == "cpu"
            and load_device.type == "cpu"
            and info is not None
            and info.dtype == slot.tensor.dtype
            and info.start % max(info.dtype.itemsize, 1) == 0
        ):
            continue
        held += size
    return ComponentNeeds(component, device, held, largest)


def describe_bytes(n: int) -> str:
    """`n` bytes as GiB with the exact count, for refusals."""
    return f"{n / 1024**3:.2f} GiB ({n} bytes)"


def check_pipeline_memory(
    needs: Sequence[ComponentNeeds], *, platform: Platform, pipeline: str
) -> Mapping[torch.device, int]:
    """PIPE-2: one preflight per device for the whole pipeline.

    For each device, the bytes every component will hold there, plus the largest tensor of any
    of them (in flight while it is placed) and the stated margin
    (`reference.read.preflight.device_memory_margin` of the total), against what the platform
    reports: `available_host_memory()` for the CPU (no check where that is unknown),
    `free_device_memory(device)` for a GPU.

    Returns:
        The bytes needed on each device.

    Raises:
        HostMemoryError, DeviceMemoryError: naming the device, the bytes needed and available,
            and each component that will live there with its bytes.
    """
    by_device: dict[torch.device, list[ComponentNeeds]] = {}
    for need in needs:
        by_device.setdefault(need.device, []).append(need)
    required: dict[torch.device, int] = {}
    for device, members in by_device.items():
        total = sum(m.held for m in members)
        needed = total + max(m.largest for m in members) + device_memory_margin(total)
        required[device] = needed
        if device.type == "cpu":
            available = platform.available_host_memory()
            error: type[Exception] = HostMemoryError
            what = "host memory available"
            fix = "free host memory, offload fewer components, or load fewer components"
        else:
            available = platform.free_device_memory(device)
            error = DeviceMemoryError
            what = f"free on {device}"
            fix = "free device memory, or offload components to the CPU"
        if available is None or needed <= available:
            continue
        listed_components = ", ".join(f"{m.component!r} {describe_bytes(m.held)}" for m in members)
        raise error(
            f"pipeline {pipeline}: its components need {describe_bytes(needed)} on {device}"
            f" together ({listed_components}; + the largest tensor in flight and a"
            f" {describe_bytes(device_memory_margin(total))} margin), but only"
            f" {describe_bytes(available)} is {what}; refused before any tensor was read: {fix}"
        )
    return required
