"""The reference loader behind the suite's seam (reference.kit.seam.LoaderAdapter).

Each method delegates to the module that does the work, so this file reads as a map from the
contract's capabilities to the reference's modules.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reference.errors import CheckpointError
from reference.kit.seam import (
    ADMISSION,
    CHECKPOINT_SAFETY,
    CLI_ARGS,
    DIRECT_DIT,
    FP8_DEFER,
    LOADER_SUPPORT,
    MEMORY_PREFLIGHT,
    PIPELINES,
    PLANS,
    TENSOR_PARALLEL,
    TEXT_ENCODERS,
    VAE_STREAM,
    WHOLE_PIPELINE,
    ZERO_COPY,
    ComponentRequest,
    DitRequest,
    EncoderRequest,
    LoadedPipeline,
    PipelineRequest,
    PlanLike,
    ServingOptions,
    StateRequest,
    VaeRequest,
)
from reference.load import dit, encoder, loaders
from reference.load import pipeline as load
from reference.load import vae as vae_mod
from reference.load.dit import DiTOptions
from reference.load.vae import VAEOptions
from reference.place import adopt, postload
from reference.place import slots as slots_mod
from reference.place.adopt import LinearKinds, Verdict
from reference.place.postload import OffloadOptions
from reference.read import preflight
from reference.read.checkpoint import TensorReader, open_checkpoint
from reference.report.summary import LoadReport
from reference.request import admission
from reference.request import args as args_mod
from reference.request import model_index as pipeline_mod
from reference.request import plan as plan_mod
from reference.request.args import ServerArgsLike, own_server_args
from reference.request.platform import Platform
from reference.request.quantization import QuantizationSpec, requires_device_weight_processing

__all__ = ["ReferenceAdapter", "ReferencePlans"]


class ReferencePlans:
    """The reference's plan methods (PLAN, DEV, FP8-1), shared with adapters that reuse them."""

    def plan_for_component(
        self,
        *,
        checkpoint_load_device: torch.device,
        needs_device_weight_postprocess: bool,
        component_cpu_offload: bool,
        load_full_state_dict_on_device: bool = False,
    ) -> plan_mod.WeightLoadPlan:
        return plan_mod.WeightLoadPlan.for_component(
            checkpoint_load_device=checkpoint_load_device,
            needs_device_weight_postprocess=needs_device_weight_postprocess,
            component_cpu_offload=component_cpu_offload,
            load_full_state_dict_on_device=load_full_state_dict_on_device,
        )

    def default_plan(self, runtime_device: torch.device) -> plan_mod.WeightLoadPlan:
        return plan_mod.WeightLoadPlan.default(runtime_device)

    def make_plan(
        self,
        *,
        checkpoint_load_device: torch.device,
        weight_postprocess_device: torch.device | None,
        defer_cpu_offload: bool,
        load_full_state_dict_on_device: bool,
    ) -> plan_mod.WeightLoadPlan:
        return plan_mod.WeightLoadPlan(
            checkpoint_load_device=checkpoint_load_device,
            weight_postprocess_device=weight_postprocess_device,
            defer_cpu_offload=defer_cpu_offload,
            load_full_state_dict_on_device=load_full_state_dict_on_device,
        )

    def resolve_checkpoint_load_device(
        self,
        runtime_device: torch.device,
        *,
        component_cpu_offload: bool,
        quantization: QuantizationSpec | None,
    ) -> torch.device:
        return plan_mod.resolve_checkpoint_load_device(
            runtime_device, component_cpu_offload=component_cpu_offload, quantization=quantization
        )

    def requires_device_weight_processing(self, quantization: QuantizationSpec | None) -> bool:
        return requires_device_weight_processing(quantization)


class ReferenceAdapter(ReferencePlans):
    """The reference loader behind the seam: it declares every capability of the seam
    (`ALL_CAPABILITIES`), and implements each."""

    name = "reference"
    capabilities: frozenset[str] = frozenset({PLANS})

    # --- DiT: zero-copy, copy path, direct mode, FP8 defer, TP ---------------------------------
    def zero_copy_verdict(
        self,
        param: torch.Tensor,
        checkpoint_tensor: torch.Tensor,
        target: torch.Tensor,
        *,
        kinds: LinearKinds,
        direct_device: torch.device | None = None,
    ) -> Verdict:
        return adopt.zero_copy_verdict(
            param, checkpoint_tensor, target, kinds=kinds, direct_device=direct_device
        )

    def load_full_state(self, request: StateRequest) -> LoadReport:
        real = self._plan(request.plan)
        records = adopt.load_full_state(
            request.module,
            request.tensors,
            load_device=real.checkpoint_load_device,
            kinds=request.kinds,
            direct=real.load_full_state_dict_on_device,
            steps=self.dit_steps(request.plan, fsdp=False).adopt,
        )
        return LoadReport(component=request.component, plan=real, records=records, events=("load",))

    def load_dit(self, request: DitRequest) -> tuple[nn.Module, LoadReport]:
        return self.load_dit_with(request, self.dit_steps(request.plan, fsdp=request.fsdp))

    def load_dit_with(
        self, request: DitRequest, steps: dit.DiTSteps
    ) -> tuple[nn.Module, LoadReport]:
        """`request` loaded by the reference's `load_dit` with `steps` (a variant that decides
        its steps from the request itself, not only from the plan, calls this)."""
        return dit.load_dit(
            request.build,
            request.checkpoint,
            plan=self._plan(request.plan),
            kinds=request.kinds,
            quantization=request.quantization,
            fsdp=request.fsdp,
            component=request.component,
            dtype=request.dtype,
            options=DiTOptions(steps=steps),
        )

    def dit_steps(self, plan: PlanLike, *, fsdp: bool) -> dit.DiTSteps:
        """The steps of this adapter's DiT loads (the reference's); a variant that loads
        differently returns its own, as the kit's broken loaders do."""
        return dit.REFERENCE_DIT_STEPS

    def encoder_options(self) -> encoder.EncoderOptions:
        """How this adapter's encoder loads run (the reference's steps)."""
        return encoder.ENCODER_DEFAULTS

    def vae_steps(self) -> vae_mod.VAESteps:
        """The steps of this adapter's VAE loads and slot checks (the reference's)."""
        return vae_mod.REFERENCE_VAE_STEPS

    def offload_for_quantization(
        self, options: OffloadOptions, quantization: QuantizationSpec | None
    ) -> OffloadOptions:
        return postload.offload_for_quantization(options, quantization)

    @staticmethod
    def _plan(plan: PlanLike) -> plan_mod.WeightLoadPlan:
        """The reference's own plan for any plan-like value (validated again: PLAN-3)."""
        if isinstance(plan, plan_mod.WeightLoadPlan):
            return plan
        return plan_mod.WeightLoadPlan(
            checkpoint_load_device=plan.checkpoint_load_device,
            weight_postprocess_device=plan.weight_postprocess_device,
            defer_cpu_offload=plan.defer_cpu_offload,
            load_full_state_dict_on_device=plan.load_full_state_dict_on_device,
        )

    # --- VAE: slots, preflight, streaming ------------------------------------------------------
    def vae_state_slots(self, module: torch.nn.Module) -> frozenset[str]:
        checks = self.vae_steps().slot_checks
        return frozenset(
            slots_mod.state_slots(module, component=type(module).__name__, checks=checks)
        )

    def load_vae(self, request: VaeRequest) -> tuple[torch.nn.Module, LoadReport]:
        return self.load_vae_with(request, self.vae_steps())

    def load_vae_with(
        self, request: VaeRequest, steps: vae_mod.VAESteps
    ) -> tuple[torch.nn.Module, LoadReport]:
        """`request` loaded by the reference's `load_vae` with `steps` (see `load_dit_with`)."""
        return vae_mod.load_vae(
            request.build,
            request.checkpoint,
            device=request.device,
            component=request.component,
            config=request.config,
            quantization=request.quantization,
            decode_dtype=request.decode_dtype,
            channels_last_3d=request.channels_last_3d,
            dtype=request.dtype,
            options=VAEOptions(steps=steps),
        )

    # --- arguments and admission ---------------------------------------------------------------
    def parse_server_args(self, argv: Sequence[str]) -> tuple[args_mod.ServerArgs, list[str]]:
        return args_mod.parse_args(argv)

    def make_server_args(self, options: ServingOptions) -> args_mod.ServerArgs:
        dtypes: dict[str, Any] = {}
        if (precisions := options.precisions) is not None:
            dtypes = {
                "dit_precision": precisions.dit,
                "vae_precision": precisions.vae,
                "component_precisions": precisions.components,
            }
        return args_mod.ServerArgs(
            runtime_device=options.runtime_device,
            dit_cpu_offload=options.dit_cpu_offload,
            dit_layerwise_offload=options.dit_layerwise_offload,
            component_cpu_offload=options.component_cpu_offload,
            fsdp_inference=options.fsdp_inference,
            tp_size=options.tp_size,
            quantization=options.quantization,
            direct_gpu_weight_loading=options.direct_gpu_weight_loading,
            component_direct_gpu_weight_loading=options.component_direct_gpu_weight_loading,
            **dtypes,
        )

    def admit(self, pipeline_dir: Path, args: ServerArgsLike, *, platform: Platform) -> None:
        pipeline = pipeline_mod.read_pipeline(pipeline_dir)
        admission.admit(pipeline, own_server_args(args), platform=platform)

    def loader_supports_direct(self, loader_kind: str, component: str) -> bool:
        support = loaders.DIRECT_SUPPORT[loader_kind]
        return support.covers(
            admission.DirectRequest(component, args_mod.COMPONENT_DIRECT_FLAG)
        ) or support.covers(admission.DirectRequest(component, args_mod.DIRECT_FLAG))

    def load_pipeline_component(self, request: ComponentRequest) -> torch.nn.Module:
        pipeline = pipeline_mod.read_pipeline(request.pipeline_dir)
        args = own_server_args(request.args)
        # PREC-3 needs the pipeline's declared components, as `load_pipeline`'s admission has.
        admission.refuse_undeclared_precisions(args, pipeline.names)
        spec = pipeline.component(request.component)
        registry = pipeline_mod.ModelRegistry()
        for class_name, cls in (request.models or {}).items():
            registry.register(cls, name=class_name)
        loader = load.loader_for(spec, registry=registry, platform=request.platform)
        module: torch.nn.Module = loader.load(spec, args).module
        return module

    def pipeline_options(self) -> load.PipelineOptions:
        """How this adapter's whole-pipeline loads run (a broken variant may change it)."""
        return load.PIPELINE_DEFAULTS

    def load_pipeline(self, request: PipelineRequest) -> LoadedPipeline:
        registry = pipeline_mod.ModelRegistry()
        for class_name, cls in (request.models or {}).items():
            registry.register(cls, name=class_name)
        loaded = load.load_pipeline(
            request.pipeline_dir,
            own_server_args(request.args),
            registry=registry,
            platform=request.platform,
            options=self.pipeline_options(),
        )
        skipped = load.not_loaded(pipeline_mod.read_pipeline(request.pipeline_dir))
        return LoadedPipeline(
            components={item.name: item.module for item in loaded},
            not_loaded=dict(skipped),
            reports=tuple(item.report for item in loaded),
        )

    def load_text_encoder(self, request: EncoderRequest) -> torch.nn.Module:
        pipeline = pipeline_mod.read_pipeline(request.pipeline_dir)
        args = own_server_args(request.args).on_platform(request.platform)
        admission.refuse_undeclared_precisions(args, pipeline.names)  # PREC-3, TE-3's count
        spec = pipeline.component(request.component)
        loader = loaders.EncoderLoader(platform=request.platform, options=self.encoder_options())
        module: torch.nn.Module = loader.load(spec, args).module
        return module

    def check_device_memory(
        self, checkpoint: Path, *, component: str, device: torch.device, platform: Platform
    ) -> int:
        return preflight.check_device_memory(
            open_checkpoint(checkpoint), component=component, device=device, platform=platform
        )

    # --- checkpoints and bad input -------------------------------------------------------------
    def inspect_checkpoint(
        self, path: str | os.PathLike[str]
    ) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        checkpoint = open_checkpoint(path)
        return {name: (info.dtype, info.shape) for name, info in checkpoint.tensors.items()}

    def read_checkpoint_tensor(
        self, path: str | os.PathLike[str], name: str, *, device: torch.device
    ) -> torch.Tensor:
        checkpoint = open_checkpoint(path)
        if name not in checkpoint.tensors:
            raise CheckpointError(
                os.fspath(path), name, "holds no tensor of this name; check the name or the path"
            )
        reader = TensorReader(checkpoint)
        try:
            return reader.read(name, device=device)
        finally:
            reader.close()


# Every capability of the seam, by part of the contract (the methods are defined above).
ReferenceAdapter.capabilities = frozenset(
    {
        PLANS,
        *(ZERO_COPY, DIRECT_DIT, FP8_DEFER, TENSOR_PARALLEL),
        VAE_STREAM,
        *(CLI_ARGS, ADMISSION, LOADER_SUPPORT, MEMORY_PREFLIGHT, PIPELINES, TEXT_ENCODERS),
        WHOLE_PIPELINE,
        CHECKPOINT_SAFETY,
    }
)
