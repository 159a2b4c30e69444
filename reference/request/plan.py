"""The weight-load plan: where one component's checkpoint lands and what happens after (PLAN, DEV).

A plan is resolved once per component, before any byte is read, and never changes afterwards.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import torch

from reference.errors import PlanError
from reference.request.quantization import QuantizationSpec

__all__ = ["CPU", "WeightLoadPlan", "effective_plan", "resolve_checkpoint_load_device"]

CPU = torch.device("cpu")


@dataclass(frozen=True)
class WeightLoadPlan:
    """How one component's weights are loaded.

    Attributes:
        checkpoint_load_device: where tensors read from the files are materialised.
        weight_postprocess_device: where post-load weight processing (online quantization) must
            run, or None when no processing is needed.
        defer_cpu_offload: move the component to CPU only after post-processing.
        load_full_state_dict_on_device: direct mode; tensors go from the files straight to the
            load device, with no CPU pre-read.

    Raises:
        PlanError: (PLAN-3) when the fields contradict each other.
    """

    checkpoint_load_device: torch.device
    weight_postprocess_device: torch.device | None = None
    defer_cpu_offload: bool = False
    load_full_state_dict_on_device: bool = False

    def __post_init__(self) -> None:
        load, post = self.checkpoint_load_device, self.weight_postprocess_device
        if post is not None and post != load:
            raise PlanError(
                f"plan: weight_postprocess_device={post} differs from"
                f" checkpoint_load_device={load};"
                " post-processing must run where the weights were loaded"
            )
        if self.defer_cpu_offload and post is None:
            raise PlanError(
                "plan: defer_cpu_offload=True without a weight_postprocess_device; deferral only"
                " makes sense when weights are processed on the device first"
            )
        if self.load_full_state_dict_on_device and self.defer_cpu_offload:
            raise PlanError(
                "plan: load_full_state_dict_on_device=True with defer_cpu_offload=True; direct mode"
                " needs a resident component, so nothing can be deferred to CPU"
            )

    @classmethod
    def for_component(
        cls,
        *,
        checkpoint_load_device: torch.device,
        needs_device_weight_postprocess: bool,
        component_cpu_offload: bool,
        load_full_state_dict_on_device: bool = False,
    ) -> WeightLoadPlan:
        """PLAN-2: the plan of one component from its loading facts.

        Args:
            checkpoint_load_device: where the checkpoint lands (see resolve_checkpoint_load_device).
            needs_device_weight_postprocess: weights must be processed on the device after loading.
            component_cpu_offload: the component is to live on CPU.
            load_full_state_dict_on_device: direct mode.

        Raises:
            PlanError: when the combination contradicts itself (PLAN-3).
        """
        return cls(
            checkpoint_load_device=checkpoint_load_device,
            weight_postprocess_device=(
                checkpoint_load_device if needs_device_weight_postprocess else None
            ),
            defer_cpu_offload=needs_device_weight_postprocess and component_cpu_offload,
            load_full_state_dict_on_device=load_full_state_dict_on_device,
        )

    @classmethod
    def default(cls, runtime_device: torch.device) -> WeightLoadPlan:
        """PLAN-4: the plan used when none is given: load on the runtime device, every flag off."""
        return cls(checkpoint_load_device=runtime_device)


def resolve_checkpoint_load_device(
    runtime_device: torch.device,
    *,
    component_cpu_offload: bool,
    quantization: QuantizationSpec | None,
) -> torch.device:
    """DEV-1, DEV-2: where a component's checkpoint tensors are materialised.

    An offloaded, unquantized component loads straight onto CPU (where it will live anyway). A
    quantized component keeps the runtime device even when offloaded, because its weights need
    device processing first, unless its method declares that it loads on CPU
    (`QuantizationSpec.loads_on_cpu`, as GGUF does). A resident component always loads on the
    runtime device.
    """
    if component_cpu_offload and (quantization is None or quantization.loads_on_cpu):
        return CPU
    return runtime_device


def effective_plan(plan: WeightLoadPlan, *, fsdp: bool, component: str) -> WeightLoadPlan:
    """FP8-4: under FSDP the post-process device override and deferral are dropped, with a warning.

    FSDP places and offloads the weights itself, so the plan keeps only its load device (and the
    direct flag). Without FSDP, or with nothing to drop, the plan is returned unchanged.
    """
    if not fsdp or (plan.weight_postprocess_device is None and not plan.defer_cpu_offload):
        return plan
    warnings.warn(
        f"{component}: FSDP inference is on, so the weight post-process device override"
        f" ({plan.weight_postprocess_device}) and the deferred CPU offload are dropped;"
        " FSDP places and offloads the weights itself",
        UserWarning,
        stacklevel=3,
    )
    return dataclasses.replace(plan, weight_postprocess_device=None, defer_cpu_offload=False)
