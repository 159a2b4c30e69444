"""Plain PyTorch loading behind the seam: the baseline the contract is measured against.

Two adapters, each the code a model author writes without a loader library:

    PlainLoadStateDict   state = safetensors.torch.load_file(file); model.load_state_dict(state)
    PlainAssign          the same with load_state_dict(state, assign=True) into a model built on
                         `meta`: the file's tensors become the parameters, no questions asked

They declare only what that code does: load a DiT's state into a model (`zero_copy`, judged on
adoption, copies and values) and load a VAE (`vae_stream`). Plans are not theirs: the zero-copy
tests hand a plan to `load_dit`, so the plan methods return the reference's plan values, and the
baselines read nothing from a plan but its load device. Flags, admission, pipelines, tensor
parallelism, online quantization and direct GPU loading are not claimed. Their conformance
reports show, on real behaviour, which rules naive loading breaks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import ClassVar

import safetensors.torch
import torch
from torch import nn

from reference.errors import StateMismatchError
from reference.kit.adapters.reference import ReferencePlans
from reference.kit.seam import (
    VAE_STREAM,
    ZERO_COPY,
    DitRequest,
    PlanLike,
    StateRequest,
    Unsupported,
    VaeRequest,
)
from reference.place.adopt import LinearKinds, Verdict
from reference.place.postload import OffloadOptions
from reference.place.records import TensorRecord
from reference.report.summary import LoadReport
from reference.request.plan import WeightLoadPlan
from reference.request.quantization import QuantizationSpec

__all__ = [
    "CPU",
    "INDEX_SUFFIX",
    "PlainAssign",
    "PlainLoadStateDict",
    "checkpoint_files",
    "load_file",
]

CPU = torch.device("cpu")
INDEX_SUFFIX = ".safetensors.index.json"


def refuse_precision(dtype: torch.dtype | None) -> None:
    """Plain PyTorch loading has no precision setting: it loads in the dtypes the model builds
    (a test that asks for one is skipped, and its rule not credited)."""
    if dtype is not None:
        raise Unsupported("plain PyTorch loading builds the model in its own dtypes")


def checkpoint_files(path: str | os.PathLike[str]) -> list[Path]:
    """The safetensors files of a checkpoint: a file, a shard index, or a folder of either."""
    path = Path(path)
    if path.is_dir():
        indexes = sorted(path.glob(f"*{INDEX_SUFFIX}"))
        if not indexes:
            return sorted(path.glob("*.safetensors"))
        path = indexes[0]
    if path.name.endswith(INDEX_SUFFIX):
        weight_map: dict[str, str] = json.loads(path.read_text())["weight_map"]
        return [path.parent / name for name in sorted(set(weight_map.values()))]
    return [path]


def load_file(path: str | os.PathLike[str], device: torch.device) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint at once, on `device`: a full state dict."""
    state: dict[str, torch.Tensor] = {}
    for file in checkpoint_files(path):
        state.update(safetensors.torch.load_file(file, device=str(device)))
    return state


class PlainLoadStateDict(ReferencePlans):
    """`load_file` + `load_state_dict`: every tensor is copied into a model that has storage."""

    name = "plain-load_state_dict"
    capabilities: frozenset[str] = frozenset({ZERO_COPY, VAE_STREAM})
    assign: ClassVar[bool] = False

    # The zero-copy tests pass plans in; the reference's plan values serve (PLANS is not
    # declared, so no plan rule is judged on this adapter).

    def requires_device_weight_processing(self, quantization: QuantizationSpec | None) -> bool:
        return False  # nothing is processed after loading

    def offload_for_quantization(
        self, options: OffloadOptions, quantization: QuantizationSpec | None
    ) -> OffloadOptions:
        return options

    # --- DiT -----------------------------------------------------------------------------------
    def zero_copy_verdict(
        self,
        param: torch.Tensor,
        checkpoint_tensor: torch.Tensor,
        target: torch.Tensor,
        *,
        kinds: LinearKinds,
        direct_device: torch.device | None = None,
    ) -> Verdict:
        """What load_state_dict does with this tensor: copy it, always."""
        return Verdict(False, "load_state_dict copies every tensor")

    def load_full_state(self, request: StateRequest) -> LoadReport:
        device = request.plan.checkpoint_load_device
        state = {name: tensor.to(device) for name, tensor in request.tensors}
        module = request.module
        if not self.assign:
            module.to_empty(device=device)  # a model built on meta has no storage to copy into
        return self.fill(module, state, plan=request.plan, component=request.component)

    def load_dit(self, request: DitRequest) -> tuple[nn.Module, LoadReport]:
        refuse_precision(request.dtype)
        device = request.plan.checkpoint_load_device
        state = load_file(request.checkpoint, device)
        module = self.build(request.build)
        report = self.fill(module, state, plan=request.plan, component=request.component)
        return (module if self.assign else module.to(device)), report

    # --- VAE -----------------------------------------------------------------------------------
    def vae_state_slots(self, module: nn.Module) -> frozenset[str]:
        """The keys load_state_dict fills."""
        return frozenset(module.state_dict())

    def load_vae(self, request: VaeRequest) -> tuple[nn.Module, LoadReport]:
        refuse_precision(request.dtype)
        state = load_file(request.checkpoint, request.device if self.assign else CPU)
        module = self.build(request.build)
        plan = WeightLoadPlan(checkpoint_load_device=request.device)
        report = self.fill(module, state, plan=plan, component=request.component)
        if not self.assign:
            module.to(request.device)
        events: list[str] = []
        if request.channels_last_3d:
            for sub in module.modules():
                if isinstance(sub, nn.Conv3d):
                    sub.weight.data = sub.weight.data.contiguous(
                        memory_format=torch.channels_last_3d
                    )
            events.append("channels_last_3d")
        prepare = getattr(module, "prepare_decode_dtype", None)
        if request.decode_dtype is not None and callable(prepare):
            prepare(request.decode_dtype)
            events.append(f"decode_dtype {request.decode_dtype}")
        return module, LoadReport(request.component, plan, report.records, events=tuple(events))

    # --- shared --------------------------------------------------------------------------------
    def build(self, build: Callable[[], nn.Module]) -> nn.Module:
        """The model as plain code builds it: with storage, or on meta for assign=True."""
        if not self.assign:
            return build()
        with torch.device("meta"):
            return build()

    def fill(
        self,
        module: nn.Module,
        state: Mapping[str, torch.Tensor],
        *,
        plan: PlanLike,
        component: str,
    ) -> LoadReport:
        """`load_state_dict(state, strict=True, assign=...)`, its errors as the contract's."""
        try:
            module.load_state_dict(state, strict=True, assign=self.assign)
        except RuntimeError as error:
            message = " ".join(str(error).split())
            raise StateMismatchError(f"{component}: {message}") from error
        held = module.state_dict(keep_vars=True)
        records = tuple(
            TensorRecord(
                name,
                "adopted" if held[name].data_ptr() == tensor.data_ptr() else "copied",
                tensor.nbytes,
            )
            for name, tensor in state.items()
        )
        real_plan = WeightLoadPlan(checkpoint_load_device=plan.checkpoint_load_device)
        return LoadReport(component=component, plan=real_plan, records=records, events=("load",))


class PlainAssign(PlainLoadStateDict):
    """`load_file` + `load_state_dict(assign=True)` into a model built on meta: every tensor the
    file holds becomes a parameter, whatever it is."""

    name = "plain-assign"
    assign = True

    def zero_copy_verdict(
        self,
        param: torch.Tensor,
        checkpoint_tensor: torch.Tensor,
        target: torch.Tensor,
        *,
        kinds: LinearKinds,
        direct_device: torch.device | None = None,
    ) -> Verdict:
        """What assign=True does with this tensor: adopt it when the shape fits (its only check)."""
        if checkpoint_tensor.shape != target.shape:
            return Verdict(
                False,
                f"ZC-8: shape {tuple(checkpoint_tensor.shape)} != target {tuple(target.shape)}",
            )
        return Verdict(True)
