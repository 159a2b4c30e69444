"""Broken DiT loading steps: adoption and copy (ZC-9..13), checks before reading (CKPT-5),
direct reads (DG-4), and post-load processing with deferred offload (FP8-2, FP8-4..6)."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

import safetensors.torch
import torch
from torch import nn

from fakes.broken.base import BrokenAdapter
from fakes.broken.readers import SharedMapReader
from reference.errors import QuantizationLoadError, StateMismatchError
from reference.kit.seam import DitRequest, PlanLike, StateRequest
from reference.load.dit import REFERENCE_DIT_STEPS, DiTSteps
from reference.place.adopt import AdoptedBytes, AdoptSteps, copy_to_fresh
from reference.place.modules import Slot
from reference.place.postload import offload_to_cpu, process_weights
from reference.read.checkpoint import Checkpoint, TensorReader
from reference.report.summary import LoadReport
from reference.request.plan import WeightLoadPlan

__all__ = [
    "AdoptsSharedBytesTwice",
    "BuffersBecomeParameters",
    "CopiesWithoutWeightLoader",
    "CpuPreReader",
    "DiTDefect",
    "FallsBackToUnquantized",
    "IgnoresFsdp",
    "KeepsCheckpointDtype",
    "LeavesAdoptedTrainable",
    "LeavesDitTraining",
    "LosesAdoptedAttributes",
    "MapsCheckpointShared",
    "MapsFilesInDirectModeOnCpu",
    "NeverClashes",
    "OffloadsBeforeProcessing",
    "PreReadsDirectCheckpoint",
    "PreconvertsForWeightLoader",
    "ReadsBeforeChecking",
    "UpcastsOnOffload",
    "copy_converted_first",
    "copy_ignoring_weight_loader",
    "copy_keeping_dtype",
    "no_preflight",
    "offload_as_float32",
    "reference_copy",
]

reference_copy = copy_to_fresh


class DiTDefect(BrokenAdapter):
    """A loader whose DiT loads run the reference with its own `dit_steps`, then `after`."""

    def after(self, module: nn.Module, report: LoadReport) -> None:
        """What this loader does to a loaded module before handing it out."""

    def load_full_state(self, request: StateRequest) -> LoadReport:
        report = super().load_full_state(request)
        self.after(request.module, report)
        return report

    def load_dit(self, request: DitRequest) -> tuple[nn.Module, LoadReport]:
        module, report = super().load_dit(request)
        self.after(module, report)
        return module, report


class LosesAdoptedAttributes(DiTDefect):
    """Wraps each adopted tensor in a bare `nn.Parameter`: same storage, but the parameter's
    attributes (`weight_loader`, `input_dim`, ...) are gone (ZC-9)."""

    name = "broken-loses-adopted-attributes"
    breaks = frozenset({"ZC-9"})

    def after(self, module: nn.Module, report: LoadReport) -> None:
        adopted = [module.get_parameter(r.name) for r in report.records if r.how == "adopted"]
        bare = {id(p): nn.Parameter(p.detach(), requires_grad=False) for p in adopted}
        for owner in module.modules(remove_duplicate=False):
            for leaf, param in owner._parameters.items():
                if param is not None and id(param) in bare:
                    owner._parameters[leaf] = bare[id(param)]


def copy_ignoring_weight_loader(slot: Slot, tensor: torch.Tensor, load_device: torch.device) -> Any:
    """The copy path without the layer's weight_loader: a plain copy of the whole tensor."""
    target = slot.tensor
    if tensor.shape != target.shape:
        raise StateMismatchError(
            f"{slot.name}: checkpoint shape {tuple(tensor.shape)} != slot shape"
            f" {tuple(target.shape)}"
        )
    fresh = torch.empty_like(target, device=load_device).copy_(tensor)
    if not slot.is_parameter:
        return fresh
    grad = target.requires_grad and fresh.is_floating_point()
    new = torch.Tensor._make_subclass(type(target), fresh, grad)
    new.__dict__.update(target.__dict__)
    return new


class CopiesWithoutWeightLoader(DiTDefect):
    """Copies refused tensors whole, never through the layer's own weight_loader: no sharding
    for TP>1, no layer-specific packing (ZC-10)."""

    name = "broken-copies-without-weight-loader"
    breaks = frozenset({"ZC-10"})
    also_fails = MappingProxyType(
        {
            "ZC-5": "the TP tests pin ZC-5 and ZC-10 together",
        }
    )

    def dit_steps(self, plan: PlanLike, *, fsdp: bool) -> DiTSteps:
        return DiTSteps(adopt=AdoptSteps(copy=copy_ignoring_weight_loader))


def copy_keeping_dtype(slot: Slot, tensor: torch.Tensor, load_device: torch.device) -> Any:
    """The copy path, except that a parameter without weight_loader keeps the file's dtype."""
    target = slot.tensor
    if not slot.is_parameter or "weight_loader" in target.__dict__ or tensor.shape != target.shape:
        return reference_copy(slot, tensor, load_device)
    fresh = tensor.to(load_device, copy=True)
    new = torch.Tensor._make_subclass(type(target), fresh, target.requires_grad)
    new.__dict__.update(target.__dict__)
    return new


class KeepsCheckpointDtype(DiTDefect):
    """Gives parameters without a weight_loader the checkpoint tensor in the file's dtype,
    unconverted (ZC-11)."""

    name = "broken-keeps-checkpoint-dtype"
    # ZC-2b too: such a parameter takes its tensor "converted once when its dtype differs".
    breaks = frozenset({"ZC-11", "ZC-2b"})
    also_fails = MappingProxyType(
        {
            "ZC-10": "the converted-once test pins ZC-10 and ZC-11 together",
        }
    )

    def dit_steps(self, plan: PlanLike, *, fsdp: bool) -> DiTSteps:
        return DiTSteps(adopt=AdoptSteps(copy=copy_keeping_dtype))


class BuffersBecomeParameters(DiTDefect):
    """Re-registers every persistent buffer of a loaded DiT as a `Parameter` holding the same
    values, as upstream 0.5.23's full-state path does (ZC-15)."""

    name = "broken-buffers-become-parameters"
    breaks = frozenset({"ZC-15"})

    def after(self, module: nn.Module, report: LoadReport) -> None:
        for sub in module.modules():
            for leaf in [n for n in sub._buffers if n not in sub._non_persistent_buffers_set]:
                value = sub._buffers.pop(leaf)
                if value is not None:
                    sub.register_parameter(leaf, nn.Parameter(value, requires_grad=False))


class LeavesDitTraining(DiTDefect):
    """Hands the loaded DiT back in training mode, as `nn.Module` builds it (OUT-1: returned
    in eval mode, as `from_pretrained` returns it)."""

    name = "broken-leaves-dit-training"
    breaks = frozenset({"OUT-1"})

    def after(self, module: nn.Module, report: LoadReport) -> None:
        module.train()


class LeavesAdoptedTrainable(DiTDefect):
    """Hands every floating parameter back with `requires_grad=True`, as `nn.Parameter` makes
    it, adopted ones included (ZC-9: an adopted parameter has `requires_grad=False`)."""

    name = "broken-leaves-adopted-trainable"
    breaks = frozenset({"ZC-9"})

    def after(self, module: nn.Module, report: LoadReport) -> None:
        for param in module.parameters():
            if param.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
                param.requires_grad_(True)


def copy_converted_first(slot: Slot, tensor: torch.Tensor, load_device: torch.device) -> Any:
    """The copy path, handing a layer's weight_loader the tensor already in the slot's dtype."""
    if slot.is_parameter and "weight_loader" in slot.tensor.__dict__:
        tensor = tensor.to(slot.tensor.dtype)
    return reference_copy(slot, tensor, load_device)


class PreconvertsForWeightLoader(DiTDefect):
    """Not broken: hands a layer's `weight_loader` the checkpoint tensor already converted to
    the slot's dtype. ZC-10 leaves that free (the values are the checkpoint's either way), so
    the suite must fail it on nothing."""

    name = "correct-preconverts-for-weight-loader"
    exercises = frozenset({"ZC-10", "ZC-11"})

    def dit_steps(self, plan: PlanLike, *, fsdp: bool) -> DiTSteps:
        return DiTSteps(adopt=AdoptSteps(copy=copy_converted_first))


class NeverClashes(AdoptedBytes):
    """Forgets what was adopted: any bytes may be adopted again."""

    def clash(self, tensor: torch.Tensor) -> str | None:
        return None


class AdoptsSharedBytesTwice(DiTDefect):
    """Adopts every eligible tensor even when its bytes were adopted already, so two
    parameters the model does not tie share memory (ZC-12)."""

    name = "broken-adopts-shared-bytes-twice"
    breaks = frozenset({"ZC-12"})
    also_fails = MappingProxyType({})

    def dit_steps(self, plan: PlanLike, *, fsdp: bool) -> DiTSteps:
        return DiTSteps(adopt=AdoptSteps(ledger=NeverClashes))


class MapsCheckpointShared(DiTDefect):
    """Maps checkpoint files shared instead of copy-on-write: writing to an adopted parameter
    writes the file (ZC-13), so checkpoint files do get written (CKPT-5)."""

    name = "broken-maps-checkpoint-shared"
    breaks = frozenset({"ZC-13", "CKPT-5"})

    def dit_steps(self, plan: PlanLike, *, fsdp: bool) -> DiTSteps:
        return DiTSteps(reader=SharedMapReader)


def no_preflight(module: nn.Module, names: set[str], *, component: str, **_: object) -> None:
    """Checks nothing: disagreements surface only while tensors are read."""


class ReadsBeforeChecking(DiTDefect):
    """Starts reading tensors without first checking the checkpoint's names against the model
    (CKPT-5: the mismatch is found after bytes were read)."""

    name = "broken-reads-before-checking"
    breaks = frozenset({"CKPT-5"})

    def dit_steps(self, plan: PlanLike, *, fsdp: bool) -> DiTSteps:
        return DiTSteps(check_names=no_preflight)


class CpuPreReader(TensorReader):
    """Reads every file's bytes into host memory first (a full CPU state dict, as a rank-local
    pre-read does), then hands out its tensors moved to the device asked for."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        super().__init__(checkpoint)
        self.state: dict[str, torch.Tensor] = {}

    def read(self, name: str, *, device: torch.device) -> torch.Tensor:
        if not self.state:
            for file in self.checkpoint.files:
                self.state.update(safetensors.torch.load(file.read_bytes()))
        return self.state[name].to(device)


class PreReadsDirectCheckpoint(DiTDefect):
    """In direct mode, reads the whole checkpoint into host memory first and moves it to the
    device from there (DG-4)."""

    name = "broken-pre-reads-direct-checkpoint"
    breaks = frozenset({"DG-4"})

    def dit_steps(self, plan: PlanLike, *, fsdp: bool) -> DiTSteps:
        if plan.load_full_state_dict_on_device:
            return DiTSteps(reader=CpuPreReader)
        return REFERENCE_DIT_STEPS


class MapsFilesInDirectModeOnCpu(DiTDefect):
    """Loads a direct plan onto the CPU as the ordinary CPU plan: eligible tensors are adopted
    as views of the files' maps, not read into fresh host memory (PLAN-3)."""

    name = "broken-maps-files-in-direct-mode-on-cpu"
    breaks = frozenset({"PLAN-3"})

    @staticmethod
    def _plan(plan: PlanLike) -> WeightLoadPlan:
        real = DiTDefect._plan(plan)
        if real.load_full_state_dict_on_device and real.checkpoint_load_device.type == "cpu":
            return WeightLoadPlan(checkpoint_load_device=real.checkpoint_load_device)
        return real


class OffloadsBeforeProcessing(DiTDefect):
    """Moves a deferred component to CPU before its weights are processed, so processing runs
    on CPU (FP8-2)."""

    name = "broken-offloads-before-processing"
    breaks = frozenset({"FP8-2"})
    also_fails = MappingProxyType(
        {"FP8-3": "the load -> process -> offload test pins FP8-2 and FP8-3 together"}
    )
    gpu_only = "on a CPU runtime device the early offload moves nothing, so it is no event"

    def dit_steps(self, plan: PlanLike, *, fsdp: bool) -> DiTSteps:
        if not plan.defer_cpu_offload or fsdp:  # FSDP drops the deferral (FP8-4)
            return REFERENCE_DIT_STEPS

        def offload_then_process(module: nn.Module, **options: Any) -> int:
            offload_to_cpu(module)
            return process_weights(module, **options)

        return DiTSteps(process=offload_then_process)


class IgnoresFsdp(DiTDefect):
    """Loads as if FSDP were off: keeps the post-process override and the deferral (FP8-4)."""

    name = "broken-ignores-fsdp"
    breaks = frozenset({"FP8-4"})

    def load_dit(self, request: DitRequest) -> tuple[nn.Module, LoadReport]:
        return super().load_dit(dataclasses.replace(request, fsdp=False))


class FallsBackToUnquantized(DiTDefect):
    """When the quantized load fails, loads again without quantization (FP8-5)."""

    name = "broken-falls-back-to-unquantized"
    breaks = frozenset({"FP8-5"})
    also_fails = MappingProxyType(
        {"CKPT-5": "the atomicity test of a failed quantized load pins CKPT-5 with FP8-5"}
    )

    def load_dit(self, request: DitRequest) -> tuple[nn.Module, LoadReport]:
        try:
            return super().load_dit(request)
        except QuantizationLoadError:
            unquantized = self.default_plan(request.plan.checkpoint_load_device)
            return super().load_dit(
                dataclasses.replace(request, plan=unquantized, quantization=None)
            )


def offload_as_float32(module: nn.Module) -> None:
    """Moves to CPU and upcasts floating tensors (float8 included) to float32 on the way."""
    module.to(device="cpu", dtype=torch.float32)


class UpcastsOnOffload(DiTDefect):
    """The deferred move to CPU upcasts the processed FP8 weights to float32 (FP8-6)."""

    name = "broken-upcasts-on-offload"
    breaks = frozenset({"FP8-6"})

    def dit_steps(self, plan: PlanLike, *, fsdp: bool) -> DiTSteps:
        return DiTSteps(offload=offload_as_float32)
