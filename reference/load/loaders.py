"""Component loaders: one `load()` template that admits first, then loads (ADM-3, ADM-5).

`ComponentLoader.load` runs, in this order and nowhere else:
  1. the loader gate (reference.request.admission.check_loader): refuses a request this loader
  cannot
     honour, before FSDP decisions, quantization overrides or any file access; then
     `admit_model`: the model class resolves and can take what is asked of it (a quantization),
     still before any file is opened;
  2. the hooks `fsdp_enabled` and `quantization_for`, then the plan;
  3. `load_component`, the subclass's work. There is no fallback path: a refusal (any
     `LoadError`, the no-fallback error among them) propagates as raised, and anything else that
     fails inside the load (torch, the OS, the model class) is wrapped in `ComponentLoadError`
     naming the component and the cause.

A loader class declares its direct-GPU support once (`direct_support`); the loader gate and
`DIRECT_SUPPORT` (for callers that only know a loader's kind) read that one declaration.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from reference.errors import (
    LISTED,
    CheckpointError,
    ComponentLoadError,
    LoadError,
    StateMismatchError,
    listed,
    shown,
)
from reference.place.cast import cast_slots
from reference.place.host_memory import allocation_guard, construction_guard
from reference.place.records import TensorRecord
from reference.read.checkpoint import (
    Checkpoint,
    TensorReader,
    hidden_files,
    open_checkpoint,
    skipped_notes,
)
from reference.report.summary import LoadReport
from reference.request.admission import NO_DIRECT_SUPPORT, DirectSupport, check_loader
from reference.request.args import ServerArgs
from reference.request.model_index import (
    CONFIG,
    ComponentSpec,
    ModelRegistry,
    is_transformer_component,
)
from reference.request.plan import WeightLoadPlan, resolve_checkpoint_load_device
from reference.request.platform import SYSTEM, Platform
from reference.request.quantization import QuantizationSpec, requires_device_weight_processing

__all__ = [
    "DIRECT_SUPPORT",
    "TRANSFORMER_DIRECT_SUPPORT",
    "VAE_DIRECT_SUPPORT",
    "VOCODER_DIRECT_SUPPORT",
    "ComponentLoader",
    "LoadRequest",
    "LoadedComponent",
    "VocoderLoader",
    "build_module",
    "load_ordinarily",
    "load_state_ordinarily",
    "loader_kind",
]

# Declared support per loader kind (ADM-3). Loader classes point at these same values.
TRANSFORMER_DIRECT_SUPPORT = DirectSupport(dit_flag=True)
VAE_DIRECT_SUPPORT = DirectSupport(components=frozenset({"vae", "video_vae"}))
VOCODER_DIRECT_SUPPORT = NO_DIRECT_SUPPORT
DIRECT_SUPPORT: dict[str, DirectSupport] = {
    "transformer": TRANSFORMER_DIRECT_SUPPORT,
    "vae": VAE_DIRECT_SUPPORT,
    "vocoder": VOCODER_DIRECT_SUPPORT,
}


def loader_kind(component: str) -> str:
    """The kind of loader a component needs, by its name.

    Raises:
        LoadError: for a component no loader kind covers.
    """
    if is_transformer_component(component):
        return "transformer"
    if component in ("vae", "video_vae", "audio_vae"):
        return "vae"
    if component == "vocoder":
        return "vocoder"
    raise LoadError(
        f"component {component!r}: no loader covers it; known kinds: {', '.join(DIRECT_SUPPORT)}"
    )


@dataclass(frozen=True)
class LoadRequest:
    """Everything `load_component` needs, decided before it runs.

    Attributes:
        component: the component to load.
        args: the loading options.
        direct: direct-GPU loading was asked for and admitted by the loader gate.
        fsdp: the component is sharded with FSDP.
        quantization: the quantization in force (after overrides), or None.
        plan: the weight-load plan.
        dtype: the component's precision (PREC-1, `ServerArgs.precision_for`).
    """

    component: ComponentSpec
    args: ServerArgs
    direct: bool
    fsdp: bool
    quantization: QuantizationSpec | None
    plan: WeightLoadPlan
    dtype: torch.dtype


@dataclass(frozen=True)
class LoadedComponent:
    """A loaded component and the report of its load."""

    name: str
    module: nn.Module
    report: LoadReport


class ComponentLoader(ABC):
    """Base of every component loader. Subclasses implement `load_component` and declare
    `direct_support`; `load` is the template and is not overridden."""

    kind: ClassVar[str] = "component"
    direct_support: ClassVar[DirectSupport] = NO_DIRECT_SUPPORT
    supports_fsdp: ClassVar[bool] = False

    def __init__(
        self, *, registry: ModelRegistry | None = None, platform: Platform = SYSTEM
    ) -> None:
        self.registry = registry if registry is not None else ModelRegistry()
        self.platform = platform

    def supports_direct(self, component: str) -> bool:
        """Whether this loader can load `component` directly onto the GPU by any flag."""
        return component in self.direct_support.components or (
            self.direct_support.dit_flag and is_transformer_component(component)
        )

    def load(self, component: ComponentSpec, args: ServerArgs) -> LoadedComponent:
        """Load one component on its own: settle `args` on this loader's platform
        (`ServerArgs.on_platform`: without a runtime device the load runs on cuda:0 when the
        platform reports CUDA, else on the CPU), `admit` it, then `load_admitted`.

        Raises:
            As `admit` and `load_admitted`.
        """
        args = args.on_platform(self.platform)
        return self.load_admitted(component, args, direct=self.admit(component, args))

    def admit(self, component: ComponentSpec, args: ServerArgs) -> bool:
        """This loader's gates for `component` under settled `args`, before anything is built
        or read: its own direct-loading gate (ADM-3, ADM-5, DG-3b), then `admit_model`.
        Returns whether the component loads directly.

        Raises:
            ComponentCheckpointUnsupportedError: a request this loader cannot honour; never
                caught by a fallback.
            CheckpointError: the model class cannot be resolved or cannot take the request.
        """
        direct = check_loader(
            self.direct_support,
            component.name,
            args,
            loader=self.kind,
            checkpoint_quantization=component.quantization,
        )
        self.admit_model(component, args)
        return direct

    def load_admitted(
        self, component: ComponentSpec, args: ServerArgs, *, direct: bool
    ) -> LoadedComponent:
        """Load one component that `admit` passed (by `load`, or by
        `reference.load.pipeline.iter_load` for every component before the first load): the
        decisions, then the load (see the module docstring).

        Raises:
            LoadError: from the subclass's loading, naming what is at fault.
            ComponentLoadError: anything else that failed inside the load, naming the component.
        """
        fsdp = self.fsdp_enabled(component, args)
        quantization = self.quantization_for(component, args)
        request = LoadRequest(
            component=component,
            args=args,
            direct=direct,
            fsdp=fsdp,
            quantization=quantization,
            plan=self.plan_for(component, args, quantization=quantization, direct=direct),
            dtype=args.precision_for(component.name),
        )
        start = time.perf_counter()
        try:
            module, records = self.load_component(request)
        except LoadError:
            raise  # a refusal, as raised: an explicit request is honoured exactly or refused
        except Exception as exc:
            raise ComponentLoadError(component.name, exc, folder=str(component.folder)) from exc
        report = LoadReport(
            component=component.name,
            plan=request.plan,
            records=tuple(records),
            seconds=time.perf_counter() - start,
            notes=skipped_notes(hidden_files(component.folder)),
            precision=request.dtype,
        )
        return LoadedComponent(component.name, module, report)

    # --- hooks, in the order load() calls them ---------------------------------------------------

    def admit_model(self, component: ComponentSpec, args: ServerArgs) -> None:
        """Refuse, before any file is opened, a model this loader cannot build as asked.

        The base resolves the component's class in the registry. `reference.load.pipeline` runs
        this for every component before the first one loads, so a pipeline fails whole or not at
        all.

        Raises:
            CheckpointError: the class cannot be resolved.
        """
        self.registry.resolve(component.class_name, component=component)

    def fsdp_enabled(self, component: ComponentSpec, args: ServerArgs) -> bool:
        """Whether FSDP shards this component (only loaders that support it say yes)."""
        return self.supports_fsdp and args.fsdp_inference

    def quantization_for(
        self, component: ComponentSpec, args: ServerArgs
    ) -> QuantizationSpec | None:
        """The quantization in force: the one the checkpoint's config declares, if any."""
        return component.quantization

    def plan_for(
        self,
        component: ComponentSpec,
        args: ServerArgs,
        *,
        quantization: QuantizationSpec | None,
        direct: bool,
    ) -> WeightLoadPlan:
        """The component's plan (PLAN-2, DEV-1/2); direct mode loads on the runtime device."""
        offload = args.is_cpu_offloaded(component.name)
        device = resolve_checkpoint_load_device(
            args.device, component_cpu_offload=offload, quantization=quantization
        )
        return WeightLoadPlan.for_component(
            checkpoint_load_device=args.device if direct else device,
            needs_device_weight_postprocess=requires_device_weight_processing(quantization),
            component_cpu_offload=offload,
            load_full_state_dict_on_device=direct,
        )

    @abstractmethod
    def load_component(self, request: LoadRequest) -> tuple[nn.Module, list[TensorRecord]]:
        """Load the component as `request` says. Returns the module and one record per tensor."""


def build_module(registry: ModelRegistry, spec: ComponentSpec) -> nn.Module:
    """Construct the component's model class from its config.json.

    Raises:
        CheckpointError: when the class is not registered or the config does not fit it.
        HostMemoryError: when constructing it would take more host memory than is available.
    """
    cls = registry.resolve(spec.class_name, component=spec)
    try:
        with allocation_guard(spec.name, config=spec.init_kwargs):
            return cls(**spec.init_kwargs)
    except TypeError as exc:
        raise CheckpointError(
            str(spec.folder / CONFIG), None, f"does not fit {cls.__name__}: {exc}"
        ) from None


def _names(names: list[str]) -> str:
    return f"[{listed(names)}]" if names else "none"


def load_state_ordinarily(
    module: nn.Module, component: ComponentSpec, device: torch.device, checkpoint: Checkpoint
) -> list[TensorRecord]:
    """The ordinary path: read each tensor onto `device` and copy it into the module's state.

    Names and shapes are checked against the headers before any tensor data is read, so a
    failure of torch's own copy afterwards is not a mismatch (the caller wraps it).

    Raises:
        CheckpointError: for unreadable weights.
        StateMismatchError: listing missing and unexpected names, or each wrong shape.
    """
    expected = module.state_dict()
    missing = sorted(set(expected) - set(checkpoint.tensors))
    unexpected = sorted(set(checkpoint.tensors) - set(expected))
    wrong = [
        f"'{shown(name)}' is {list(info.shape)} in {shown(info.file.name)}, the module expects"
        f" {list(expected[name].shape)}"
        for name, info in sorted(checkpoint.tensors.items())
        if name in expected and info.shape != tuple(expected[name].shape)
    ]
    if missing or unexpected or wrong:
        more = f" and {len(wrong) - LISTED} more" if len(wrong) > LISTED else ""
        raise StateMismatchError(
            f"component {component.name!r}: checkpoint in {shown(component.folder)} does not"
            f" match {type(module).__name__}; missing: {_names(missing)}; unexpected:"
            f" {_names(unexpected)}; wrong shapes:"
            f" {'; '.join(wrong[:LISTED]) + more or 'none'}"
        )
    reader = TensorReader(checkpoint)
    try:
        state = {name: reader.read(name, device=device) for name in reader}
        module.load_state_dict(state, strict=True)
    finally:
        reader.close()
    return [
        TensorRecord(
            name,
            "copied",
            expected[name].numel() * expected[name].element_size(),
            converted_from=t.dtype if t.dtype != expected[name].dtype else None,
            dtype=expected[name].dtype,
        )
        for name, t in state.items()
    ]


def load_ordinarily(
    registry: ModelRegistry,
    request: LoadRequest,
    *,
    build: Callable[[], nn.Module] | None = None,
) -> tuple[nn.Module, list[TensorRecord]]:
    """Build the module (with `build`, else the registry's class from config.json), copy its
    checkpoint into it on the plan's device, then place it: on CPU when the component is
    offloaded, else on the runtime device. No direct-loading feature is involved (ADM-6).

    The module comes back as diffusers' `from_pretrained` gives it: in eval mode, each
    parameter's `requires_grad` as construction set it (VAE-10's rule for the streamed path)."""
    spec = request.component
    checkpoint = open_checkpoint(spec.folder)
    # The build may take no more host memory than its checkpoint explains: weights within
    # WIDEST_RATIO of it, tables within TABLE_FLOOR (a config.json sized past its weights).
    with construction_guard(
        spec.name, checkpoint_bytes=checkpoint.total_bytes, ordinary=True, config=spec.init_kwargs
    ):
        module = build_module(registry, spec) if build is None else build()
    cast_slots(module, request.dtype)  # PREC-1, PREC-2: the real slots, converted before loading
    records = load_state_ordinarily(module, spec, request.plan.checkpoint_load_device, checkpoint)
    target = "cpu" if request.args.is_cpu_offloaded(spec.name) else request.args.device
    return module.to(target).eval(), records


class VocoderLoader(ComponentLoader):
    """Loads a vocoder the ordinary way. It supports no direct-GPU loading (ADM-3)."""

    kind = "vocoder"
    direct_support = VOCODER_DIRECT_SUPPORT

    def load_component(self, request: LoadRequest) -> tuple[nn.Module, list[TensorRecord]]:
        return load_ordinarily(self.registry, request)
