"""Broken plans and placement decisions: PLAN, DEV, FP8-1, FP8-3."""

from __future__ import annotations

import dataclasses

import torch

from fakes.broken.base import BrokenAdapter
from reference.place.postload import OffloadOptions
from reference.request.plan import CPU, WeightLoadPlan
from reference.request.quantization import ONLINE_DEVICE_METHODS, QuantizationSpec

__all__ = [
    "DefaultPlanOnCpu",
    "DefersResidentComponents",
    "DisablesOffloadForOnlineFp8",
    "IgnoresCpuLoadDeclaration",
    "LoadsOffloadedQuantizedOnCpu",
    "MutablePlan",
    "MutablePlans",
    "NeverLoadsOnCpu",
    "ProcessesSerializedCheckpoints",
    "UncheckedPlan",
    "UnvalidatedPlans",
]


class MutablePlan(WeightLoadPlan):
    """A plan whose fields can be reassigned after it was resolved."""

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)


class MutablePlans(BrokenAdapter):
    """Its plans can be changed after they were resolved (PLAN-1)."""

    name = "broken-mutable-plans"
    breaks = frozenset({"PLAN-1"})

    def plan_for_component(
        self,
        *,
        checkpoint_load_device: torch.device,
        needs_device_weight_postprocess: bool,
        component_cpu_offload: bool,
        load_full_state_dict_on_device: bool = False,
    ) -> WeightLoadPlan:
        plan = super().plan_for_component(
            checkpoint_load_device=checkpoint_load_device,
            needs_device_weight_postprocess=needs_device_weight_postprocess,
            component_cpu_offload=component_cpu_offload,
            load_full_state_dict_on_device=load_full_state_dict_on_device,
        )
        return MutablePlan(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)})


class DefersResidentComponents(BrokenAdapter):
    """Defers the CPU offload of every component that needs processing, resident or not."""

    name = "broken-defers-resident"
    breaks = frozenset({"PLAN-2"})

    def plan_for_component(
        self,
        *,
        checkpoint_load_device: torch.device,
        needs_device_weight_postprocess: bool,
        component_cpu_offload: bool,
        load_full_state_dict_on_device: bool = False,
    ) -> WeightLoadPlan:
        return WeightLoadPlan(
            checkpoint_load_device=checkpoint_load_device,
            weight_postprocess_device=(
                checkpoint_load_device if needs_device_weight_postprocess else None
            ),
            defer_cpu_offload=needs_device_weight_postprocess,
            load_full_state_dict_on_device=load_full_state_dict_on_device,
        )


class UncheckedPlan(WeightLoadPlan):
    """A plan that accepts any combination of fields."""

    def __post_init__(self) -> None:
        pass


class UnvalidatedPlans(BrokenAdapter):
    """Builds plans without checking that their fields agree (PLAN-3)."""

    name = "broken-unvalidated-plans"
    breaks = frozenset({"PLAN-3"})

    def plan_for_component(
        self,
        *,
        checkpoint_load_device: torch.device,
        needs_device_weight_postprocess: bool,
        component_cpu_offload: bool,
        load_full_state_dict_on_device: bool = False,
    ) -> WeightLoadPlan:
        post = checkpoint_load_device if needs_device_weight_postprocess else None
        return UncheckedPlan(
            checkpoint_load_device=checkpoint_load_device,
            weight_postprocess_device=post,
            defer_cpu_offload=needs_device_weight_postprocess and component_cpu_offload,
            load_full_state_dict_on_device=load_full_state_dict_on_device,
        )

    def make_plan(
        self,
        *,
        checkpoint_load_device: torch.device,
        weight_postprocess_device: torch.device | None,
        defer_cpu_offload: bool,
        load_full_state_dict_on_device: bool,
    ) -> WeightLoadPlan:
        return UncheckedPlan(
            checkpoint_load_device=checkpoint_load_device,
            weight_postprocess_device=weight_postprocess_device,
            defer_cpu_offload=defer_cpu_offload,
            load_full_state_dict_on_device=load_full_state_dict_on_device,
        )


class DefaultPlanOnCpu(BrokenAdapter):
    """Without a plan it loads on CPU, whatever the runtime device (PLAN-4)."""

    name = "broken-default-plan-on-cpu"
    breaks = frozenset({"PLAN-4"})

    def default_plan(self, runtime_device: torch.device) -> WeightLoadPlan:
        return WeightLoadPlan(checkpoint_load_device=CPU)


class NeverLoadsOnCpu(BrokenAdapter):
    """Loads every checkpoint on the runtime device, offloaded components too: unquantized ones
    (DEV-1) and those whose quantization method declares CPU loading (DEV-2)."""

    name = "broken-never-loads-on-cpu"
    breaks = frozenset({"DEV-1", "DEV-2", "DEV-3"})

    def resolve_checkpoint_load_device(
        self,
        runtime_device: torch.device,
        *,
        component_cpu_offload: bool,
        quantization: QuantizationSpec | None,
    ) -> torch.device:
        return runtime_device


class LoadsOffloadedQuantizedOnCpu(BrokenAdapter):
    """Loads every offloaded component on CPU, quantized ones too (DEV-2)."""

    name = "broken-quantized-on-cpu"
    breaks = frozenset({"DEV-2", "DEV-3"})

    def resolve_checkpoint_load_device(
        self,
        runtime_device: torch.device,
        *,
        component_cpu_offload: bool,
        quantization: QuantizationSpec | None,
    ) -> torch.device:
        return CPU if component_cpu_offload else runtime_device


class IgnoresCpuLoadDeclaration(BrokenAdapter):
    """Keeps every quantized component on the runtime device when offloaded, even one whose
    method declares that it loads on CPU, as GGUF does (DEV-2)."""

    name = "broken-ignores-cpu-load-declaration"
    breaks = frozenset({"DEV-2", "DEV-3"})

    def resolve_checkpoint_load_device(
        self,
        runtime_device: torch.device,
        *,
        component_cpu_offload: bool,
        quantization: QuantizationSpec | None,
    ) -> torch.device:
        return CPU if component_cpu_offload and quantization is None else runtime_device


class ProcessesSerializedCheckpoints(BrokenAdapter):
    """Asks for device processing of fp8/mxfp4 checkpoints already stored quantized (FP8-1)."""

    name = "broken-processes-serialized"
    breaks = frozenset({"FP8-1"})

    def requires_device_weight_processing(self, quantization: QuantizationSpec | None) -> bool:
        return quantization is not None and quantization.method.lower() in ONLINE_DEVICE_METHODS


class DisablesOffloadForOnlineFp8(BrokenAdapter):
    """Switches component CPU offload off for every FP8 checkpoint, online ones too (FP8-3)."""

    name = "broken-no-offload-for-fp8"
    breaks = frozenset({"FP8-3"})

    def offload_for_quantization(
        self, options: OffloadOptions, quantization: QuantizationSpec | None
    ) -> OffloadOptions:
        if quantization is not None and "fp8" in quantization.method.lower():
            return dataclasses.replace(options, component_cpu_offload=False)
        return options
