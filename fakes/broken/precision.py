"""Broken precision handling (PREC-1..5): each the reference with one step done the way a
loader that "supports precision" plausibly gets it wrong."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from fakes.broken.base import BrokenAdapter
from reference.kit.seam import ComponentRequest, DitRequest, PlanLike, VaeRequest
from reference.load.dit import DiTSteps
from reference.read.checkpoint import Checkpoint, TensorReader
from reference.report.summary import LoadReport
from reference.request.args import ServerArgsLike, own_server_args
from reference.request.model_index import is_transformer_component, read_pipeline

__all__ = [
    "AcceptsUndeclaredPrecisions",
    "BuildsInTheClassDtype",
    "CastsFp32ModulesToo",
    "ConvertsTheWholeStateFirst",
    "CopiesWhenAPrecisionIsGiven",
    "PrecisionDefect",
]

FP32 = torch.float32


class PrecisionDefect(BrokenAdapter):
    """A loader whose DiT loads run `dit.load_dit` with its own `steps_for(dtype, plan)` and
    whose pipeline component loads go through `component_args` and `after_component`."""

    def steps_for(self, dtype: torch.dtype | None, plan: PlanLike) -> DiTSteps:
        return self.dit_steps(plan, fsdp=False)

    def dtype_for(self, dtype: torch.dtype | None) -> torch.dtype | None:
        """The precision this loader builds in when `dtype` is asked for."""
        return dtype

    def component_args(self, args: ServerArgsLike, pipeline_dir: Path) -> ServerArgsLike:
        return args

    def after_component(self, module: nn.Module, args: ServerArgsLike, component: str) -> None:
        """What this loader does to a loaded pipeline component before handing it out."""

    def load_dit(self, request: DitRequest) -> tuple[nn.Module, LoadReport]:
        dtype = request.dtype
        if dtype is None:
            return super().load_dit(request)
        steps = self.steps_for(dtype, request.plan)
        return self.load_dit_with(dataclasses.replace(request, dtype=self.dtype_for(dtype)), steps)

    def load_pipeline_component(self, request: ComponentRequest) -> nn.Module:
        args = self.component_args(request.args, request.pipeline_dir)
        module = super().load_pipeline_component(dataclasses.replace(request, args=args))
        self.after_component(module, args, request.component)
        return module


class BuildsInTheClassDtype(PrecisionDefect):
    """Builds every component in the dtypes its class builds (fp32), whatever precision is
    asked for, and converts the checkpoint into them (PREC-1)."""

    name = "broken-builds-in-the-class-dtype"
    breaks = frozenset({"PREC-1"})

    def dtype_for(self, dtype: torch.dtype | None) -> torch.dtype | None:
        return None

    def load_vae(self, request: VaeRequest) -> tuple[nn.Module, LoadReport]:
        return super().load_vae(dataclasses.replace(request, dtype=None))

    def component_args(self, args: ServerArgsLike, pipeline_dir: Path) -> ServerArgsLike:
        own = own_server_args(args)
        as_built = dict.fromkeys(own.component_precisions, FP32)  # still checked: PREC-3's
        return dataclasses.replace(
            own, dit_precision=FP32, vae_precision=FP32, component_precisions=as_built
        )


class CastsFp32ModulesToo(PrecisionDefect):
    """Casts a loaded pipeline component to its precision whole (`module.to(dtype)`), so the
    modules its class keeps in fp32 (diffusers' `_keep_in_fp32_modules`) lose it (PREC-2)."""

    name = "broken-casts-fp32-modules-too"
    breaks = frozenset({"PREC-2"})

    def after_component(self, module: nn.Module, args: ServerArgsLike, component: str) -> None:
        if not is_transformer_component(component):
            return
        dtype = own_server_args(args).precision_for(component)
        for param in module.parameters():
            if param.is_floating_point() and param.element_size() > 1:
                param.data = param.data.to(dtype)


class AcceptsUndeclaredPrecisions(PrecisionDefect):
    """Drops a precision override for a component the pipeline does not declare, as a dict
    lookup by name would, instead of refusing it (PREC-3)."""

    name = "broken-accepts-undeclared-precisions"
    breaks = frozenset({"PREC-3"})

    def component_args(self, args: ServerArgsLike, pipeline_dir: Path) -> ServerArgsLike:
        own = own_server_args(args)
        declared = set(read_pipeline(pipeline_dir).names)
        kept = {k: v for k, v in own.component_precisions.items() if k in declared}
        return dataclasses.replace(own, component_precisions=kept)


class _Cloning(TensorReader):
    """Hands out each tensor as a fresh copy of itself."""

    def read(self, name: str, *, device: torch.device) -> torch.Tensor:
        return super().read(name, device=device).clone()


class CopiesWhenAPrecisionIsGiven(PrecisionDefect):
    """Given a precision, materialises every checkpoint tensor in memory of its own before it
    is placed, as a loader that casts the state dict up front does: a tensor already in its
    slot's dtype is copied instead of adopted (PREC-4)."""

    name = "broken-copies-when-a-precision-is-given"
    breaks = frozenset({"PREC-4"})

    def steps_for(self, dtype: torch.dtype | None, plan: PlanLike) -> DiTSteps:
        steps = self.dit_steps(plan, fsdp=False)
        if plan.load_full_state_dict_on_device:  # direct mode copies anyway: PREC-5's ground
            return steps
        return dataclasses.replace(steps, reader=_Cloning)


class _ConvertedUpFront(TensorReader):
    """Reads and converts every tensor of the checkpoint before handing out the first."""

    def __init__(self, checkpoint: Checkpoint, dtype: torch.dtype) -> None:
        super().__init__(checkpoint)
        self.state: dict[str, torch.Tensor] = {}
        self.dtype = dtype

    def read(self, name: str, *, device: torch.device) -> torch.Tensor:
        if not self.state:
            for each in self.checkpoint.tensors:
                tensor = super().read(each, device=device)
                floating = tensor.is_floating_point() and tensor.element_size() > 1
                self.state[each] = tensor.to(self.dtype) if floating else tensor.clone()
        return self.state[name]


class ConvertsTheWholeStateFirst(PrecisionDefect):
    """In direct mode with a precision, converts the whole checkpoint before placing any of it,
    so every converted tensor sits in memory beside the model (PREC-5)."""

    name = "broken-converts-the-whole-state-first"
    breaks = frozenset({"PREC-5"})

    def steps_for(self, dtype: torch.dtype | None, plan: PlanLike) -> DiTSteps:
        steps = self.dit_steps(plan, fsdp=False)
        if dtype is None or not plan.load_full_state_dict_on_device:
            return steps
        return dataclasses.replace(steps, reader=lambda ckpt: _ConvertedUpFront(ckpt, dtype))
