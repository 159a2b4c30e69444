"""Component loaders: one `load()` template that admits first, then loads (ADM-3, ADM-5), and its
five kinds: the transformer (DiT), VAE, vocoder, encoder (text and image encoders) and module
(any other weight-bearing component) loaders.

`ComponentLoader.load` runs, in this order and nowhere else:
  1. the loader gate (reference.request.admission.check_loader): refuses a request this loader
     cannot honour, before FSDP decisions, quantization overrides or any file access; then
     `admit_model`: the model class resolves and can take what is asked of it (a quantization),
     still before any file is opened;
  2. the hooks `fsdp_enabled` and `quantization_for`, then the plan;
  3. `load_component`, the kind's work: `load_dit`, `load_vae`, `load_encoder` or the ordinary
     load (reference.load.dit, .vae, .encoder, .ordinary). There is no fallback path: a refusal (any
     `LoadError`, the no-fallback error among them) propagates as raised, and anything else that
     fails inside the load (torch, the OS, the model class) is wrapped in `ComponentLoadError`
     naming the component and the cause.

A direct request is checked against free device memory (DG-6) before any byte moves. A loader
class declares its direct-GPU support once (`direct_support`); the loader gate and
`DIRECT_SUPPORT` (for callers that only know a loader's kind) read that one declaration. The
base and its kinds share this file, so the template's call into a kind never returns into a
module above it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from reference.errors import ComponentCheckpointUnsupportedError, ComponentLoadError, LoadError
from reference.load.dit import DIT_DEFAULTS, DiTOptions, build_dit, load_dit
from reference.load.encoder import (
    ENCODER_DEFAULTS,
    EncoderModel,
    EncoderOptions,
    build_tied_encoder,
    load_encoder,
)
from reference.load.ordinary import build_for_real, load_ordinarily
from reference.load.pipeline_memory import ComponentNeeds, check_shapes, component_needs
from reference.load.vae import VAE_DEFAULTS, build_vae, load_vae
from reference.place import diffusers_models, transformers_models
from reference.place.adopt import LinearKinds
from reference.place.build import build_module, build_on_meta
from reference.place.cast import cast_slots
from reference.place.host_memory import construction_guard
from reference.read import preflight
from reference.read.checkpoint import (
    Checkpoint,
    hidden_files,
    is_model_folder,
    open_checkpoint,
    skipped_notes,
)
from reference.report.summary import LoadReport
from reference.request.admission import NO_DIRECT_SUPPORT, DirectSupport, check_loader
from reference.request.args import QUANTIZATION_FLAG, ServerArgs
from reference.request.model_index import (
    ComponentSpec,
    ModelRegistry,
    is_encoder_component,
    is_transformer_component,
    names_diffusers_class,
)
from reference.request.plan import WeightLoadPlan, resolve_checkpoint_load_device
from reference.request.platform import SYSTEM, Platform
from reference.request.precision import stored_dtype
from reference.request.quantization import QuantizationSpec, requires_device_weight_processing

__all__ = [
    "DIRECT_SUPPORT",
    "ENCODER_DIRECT_SUPPORT",
    "MODULE_DIRECT_SUPPORT",
    "TRANSFORMER_DIRECT_SUPPORT",
    "VAE_DIRECT_SUPPORT",
    "VOCODER_DIRECT_SUPPORT",
    "ComponentLoader",
    "DiTModel",
    "EncoderLoader",
    "LoadRequest",
    "LoadedComponent",
    "ModuleLoader",
    "OrdinaryLoader",
    "PreparedComponent",
    "TransformerLoader",
    "VAELoader",
    "VocoderLoader",
    "check_direct_memory",
    "loader_kind",
    "ordinarily",
    "takes_quantization",
]

# Declared support per loader kind (ADM-3). Loader classes point at these same values.
TRANSFORMER_DIRECT_SUPPORT = DirectSupport(dit_flag=True)
VAE_DIRECT_SUPPORT = DirectSupport(components=frozenset({"vae", "video_vae"}))
VOCODER_DIRECT_SUPPORT = NO_DIRECT_SUPPORT
ENCODER_DIRECT_SUPPORT = NO_DIRECT_SUPPORT
MODULE_DIRECT_SUPPORT = NO_DIRECT_SUPPORT
DIRECT_SUPPORT: dict[str, DirectSupport] = {
    "transformer": TRANSFORMER_DIRECT_SUPPORT,
    "vae": VAE_DIRECT_SUPPORT,
    "vocoder": VOCODER_DIRECT_SUPPORT,
    "encoder": ENCODER_DIRECT_SUPPORT,
    "module": MODULE_DIRECT_SUPPORT,
}


def loader_kind(component: str | ComponentSpec) -> str:
    """The kind of loader a component needs: by its name (`transformer*`, the VAEs, `vocoder`,
    `text_encoder*`, `image_encoder*`); given its spec, a component of no named kind whose
    folder holds a model (`is_model_folder`) is an `encoder` when model_index.json names
    `transformers` (any class it ships: AudioLDM 2's `language_model`), else a `module`
    (diffusers' own class or a registered one, the ordinary way: a UNet, LTX-2's
    `connectors`), so that no weight-bearing component is left out (PIPE-1).

    Raises:
        LoadError: for a component no loader kind covers (its folder holds no model).
    """
    name = component if isinstance(component, str) else component.name
    if is_transformer_component(name):
        return "transformer"
    if name in ("vae", "video_vae", "audio_vae"):
        return "vae"
    if is_encoder_component(name):
        return "encoder"
    model_library = (
        None
        if isinstance(component, str) or not is_model_folder(component.folder)
        else component.library
    )
    if model_library == transformers_models.LIBRARY:
        return "encoder"
    if name == "vocoder":
        return "vocoder"
    if model_library is not None:
        return "module"
    why = "no folder was given" if isinstance(component, str) else "its folder holds no model"
    raise LoadError(
        f"component {name!r}: no loader covers it: its name is of none of the named kinds and"
        f" {why} (a config.json or weight files); kinds: {', '.join(DIRECT_SUPPORT)}"
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
        prebuilt: the module `ComponentLoader.prepare` already built for this load, on meta
            (for real where its construction cannot run there: `build_checked`), its slots in
            their final dtypes and checked against the headers, which the load fills instead
            of building again (the ordinary way builds for real where it cannot:
            `reference.load.ordinary.load_ordinarily`); None: the load builds it.
        preflighted: the memory this load takes on its device was checked with every other
            component's (`reference.load.pipeline_memory.check_pipeline_memory`), so its own
            direct-mode check (DG-6) is not asked again while the others allocate.
    """

    component: ComponentSpec
    args: ServerArgs
    direct: bool
    fsdp: bool
    quantization: QuantizationSpec | None
    plan: WeightLoadPlan
    dtype: torch.dtype
    prebuilt: nn.Module | None = None
    preflighted: bool = False


@dataclass(frozen=True)
class LoadedComponent:
    """A loaded component and the report of its load."""

    name: str
    module: nn.Module
    report: LoadReport


@dataclass(frozen=True)
class PreparedComponent:
    """A component whose load is decided and checked, none of its tensor data read yet
    (`ComponentLoader.prepare`): the request to load it with, and what it will hold."""

    request: LoadRequest
    needs: ComponentNeeds


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
        return self.load_request(self.request_for(component, args, direct=direct))

    def request_for(
        self, component: ComponentSpec, args: ServerArgs, *, direct: bool
    ) -> LoadRequest:
        """The decisions for one admitted component, in order: FSDP, the quantization in
        force, the plan and the precision (nothing is built or read)."""
        fsdp = self.fsdp_enabled(component, args)
        quantization = self.quantization_for(component, args)
        return LoadRequest(
            component=component,
            args=args,
            direct=direct,
            fsdp=fsdp,
            quantization=quantization,
            plan=self.plan_for(component, args, quantization=quantization, direct=direct),
            dtype=self.precision_for(component, args),
        )

    def prepare(
        self, component: ComponentSpec, args: ServerArgs, *, direct: bool
    ) -> PreparedComponent:
        """Everything of an admitted component's load that can refuse it without reading tensor
        data (PIPE-2): the decisions (`request_for`), the headers, the build on meta the load
        will fill (`build_checked`), the checkpoint's names and shapes against its slots
        (CKPT-3), and what it will hold where it ends up (for the pipeline's memory preflight).
        The request comes back `preflighted`: the caller checks the memory of every
        component it prepares together (`check_pipeline_memory`), in place of each direct
        load's own device check (DG-6).

        Raises:
            LoadError: a refusal, naming the component.
            ComponentLoadError: anything else that failed in the build, naming the component.
        """
        request = self.request_for(component, args, direct=direct)
        try:
            module, checkpoint = self.build_checked(request)
            check_shapes(module, checkpoint, component=component.name)
        except LoadError:
            raise
        except Exception as exc:
            raise ComponentLoadError(component.name, exc, folder=str(component.folder)) from exc
        offloaded = args.is_cpu_offloaded(component.name) or request.plan.defer_cpu_offload
        needs = component_needs(
            module,
            checkpoint,
            component=component.name,
            device=torch.device("cpu") if offloaded else args.device,
            load_device=request.plan.checkpoint_load_device,
            adopts=self.adopts(request),
        )
        prepared = dataclasses.replace(request, prebuilt=module, preflighted=True)
        return PreparedComponent(prepared, needs)

    def build_checked(self, request: LoadRequest) -> tuple[nn.Module, Checkpoint]:
        """The component built on meta as its load will build it (slots in their final
        dtypes), within the host memory its checkpoint explains (CKPT-6), and its checkpoint's
        headers as the slots name them. The base builds on meta what the ordinary way builds
        (`model_builder`); the ordinary load fills it where nothing of it but its slots is
        on meta, and builds for real otherwise (`reference.load.ordinary.load_ordinarily`).
        A construction that cannot run on meta (one that reads a parameter's value) is built
        for real here instead, as the ordinary way builds it (ADM-6), within the budget of a
        real build: its weights are then allocated before a pipeline's memory preflight.

        Raises:
            LoadError: the build is refused (host memory, a class that cannot be built).
        """
        spec = request.component
        checkpoint = open_checkpoint(spec.folder)
        build = self.model_builder(spec)
        try:
            with construction_guard(
                spec.name, checkpoint_bytes=checkpoint.total_bytes, ordinary=False
            ):
                module = build_on_meta(build, component=spec.name, dtype=request.dtype)
        except LoadError:
            raise  # a refusal of the build itself (host memory, a config that does not fit)
        except Exception:
            module = build_for_real(spec, build, checkpoint)
        cast_slots(module, request.dtype)
        return module, checkpoint

    def model_builder(self, spec: ComponentSpec) -> Callable[[], nn.Module]:
        """Resolve the component's class now; return the build the ordinary way runs, from its
        config.json (the base: the registered class).

        Raises:
            CheckpointError: the class cannot be resolved.
        """
        return self.registered_builder(spec)

    def adopts(self, request: LoadRequest) -> bool:
        """Whether the load may keep CPU tensors as views of the files (zero-copy): the
        memory preflight then counts them as the files' pages, not the process's."""
        return False

    def load_request(self, request: LoadRequest) -> LoadedComponent:
        """Load one component as `request` decided it (`request_for`, or `prepare`'s request
        with the module it built): `load_component`, timed, and its report (the load's own
        records, events and steps; this request's plan and precision, the folder's notes).

        Raises:
            As `load_admitted`.
        """
        component = request.component
        start = time.perf_counter()
        try:
            module, own = self.load_component(request)
        except LoadError:
            raise  # a refusal, as raised: an explicit request is honoured exactly or refused
        except Exception as exc:
            raise ComponentLoadError(component.name, exc, folder=str(component.folder)) from exc
        report = LoadReport(
            component=component.name,
            plan=request.plan,
            records=own.records,
            seconds=time.perf_counter() - start,
            events=own.events,
            notes=skipped_notes(hidden_files(component.folder)),
            precision=request.dtype,
            steps=own.steps,
        )
        return LoadedComponent(component.name, module, report)

    # --- hooks, in the order load() calls them ---------------------------------------------------

    def admit_model(self, component: ComponentSpec, args: ServerArgs) -> None:
        """Refuse, before any file is opened, a model this loader cannot build as asked.

        The base resolves the component's class (`model_builder`). `reference.load.pipeline`
        runs this for every component before the first one loads, so a pipeline fails whole or
        not at all.

        Raises:
            CheckpointError: the class cannot be resolved.
        """
        self.model_builder(component)

    def precision_for(self, component: ComponentSpec, args: ServerArgs) -> torch.dtype:
        """The component's precision (PREC-1): `ServerArgs.precision_for`."""
        return args.precision_for(component.name)

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
    def load_component(self, request: LoadRequest) -> tuple[nn.Module, LoadReport]:
        """Load the component as `request` says. Returns the module and the load's own report
        (one record per tensor; its events and timed steps where the load has them), which
        `load_request` completes."""

    def registered_builder(self, spec: ComponentSpec, **extra: object) -> Callable[[], nn.Module]:
        """A zero-argument build of the component's registered class from its config.json (and
        `extra`); the class resolves now.

        Raises:
            CheckpointError: the class is not registered.
        """
        cls = self.registry.resolve(spec.class_name, component=spec)
        return functools.partial(build_module, cls, spec, **extra)


def ordinarily(
    request: LoadRequest, *, build: Callable[[], nn.Module], loader: ComponentLoader
) -> tuple[nn.Module, LoadReport]:
    """`reference.load.ordinary.load_ordinarily` as `request` decided it: the plan's load
    device, then CPU when the component is offloaded, else the runtime device; the module
    `prepare` built (`request.prebuilt`) filled where it can be. A component loaded alone has
    no such build: `loader.build_checked` makes it first and its slots are checked against the
    headers (CKPT-3), as `prepare` does.

    Building on meta and filling the build skips initialising every parameter that the
    checkpoint then overwrites. Measured on 2026-12-07 (2 cores, files cached,
    `VAELoader().load` onto the CPU): diffusers' fp32 `AutoencoderKLWan` at Wan2.1's config
    (485 MiB) loaded alone, as the first load of fresh processes, in 1.09 s building for real
    and 0.32 s filling the meta build (medians of 5)."""
    spec = request.component
    if request.prebuilt is None:
        module, checkpoint = loader.build_checked(request)
        check_shapes(module, checkpoint, component=spec.name)
        request = dataclasses.replace(request, prebuilt=module)
    target = "cpu" if request.args.is_cpu_offloaded(spec.name) else request.args.device
    module, records = load_ordinarily(
        spec,
        build=build,
        dtype=request.dtype,
        device=request.plan.checkpoint_load_device,
        target=target,
        prebuilt=request.prebuilt,
    )
    return module, LoadReport(component=spec.name, plan=request.plan, records=tuple(records))


class OrdinaryLoader(ComponentLoader):
    """Base of the loaders that load their components only the ordinary way (`ordinarily`:
    the meta build filled in place) and support no direct-GPU loading (ADM-3). A component
    whose model_index.json entry names diffusers or one of its pipeline packages is built from
    diffusers' own class (`diffusers_builder`); any other from the registry."""

    @abstractmethod
    def diffusers_builder(self, spec: ComponentSpec) -> Callable[[], nn.Module]:
        """Resolve the diffusers class that `spec` names now; return its `build()`.

        Raises:
            CheckpointError: not one of the diffusers classes this kind builds.
        """

    def model_builder(self, spec: ComponentSpec) -> Callable[[], nn.Module]:
        """Resolve the component's model class now; return a `build()` from its config.json.

        Raises:
            CheckpointError: the class cannot be resolved (unregistered, not a diffusers model
                class, or diffusers not installed).
        """
        if names_diffusers_class(spec.library):
            return self.diffusers_builder(spec)
        return self.registered_builder(spec)

    def load_component(self, request: LoadRequest) -> tuple[nn.Module, LoadReport]:
        return ordinarily(request, build=self.model_builder(request.component), loader=self)


class VocoderLoader(OrdinaryLoader):
    """Loads a vocoder the ordinary way. It supports no direct-GPU loading (ADM-3). A vocoder
    whose model_index.json entry names diffusers (`["diffusers", "MMAudioVocoder"]`) or one of
    its pipeline packages (`["ltx2", "LTX2Vocoder"]`) is built from diffusers' own class (see
    reference.place.diffusers_models); any other from the registry."""

    kind = "vocoder"
    direct_support = VOCODER_DIRECT_SUPPORT

    def diffusers_builder(self, spec: ComponentSpec) -> Callable[[], nn.Module]:
        return diffusers_models.vocoder_builder(spec)


class ModuleLoader(OrdinaryLoader):
    """Loads a weight-bearing component of no named kind (`loader_kind`: a UNet, a ControlNet,
    LTX-2's `connectors`) the ordinary way. It supports no direct-GPU loading (ADM-3). A
    component whose model_index.json entry names diffusers (`["diffusers",
    "UNet2DConditionModel"]`) or one of its pipeline packages (`["ltx2",
    "LTX2TextConnectors"]`) is built from diffusers' own model class
    (`diffusers_models.module_builder`); any other from the registry, refused at admission
    when it is not registered. Its precision defaults to the dtype its checkpoint stores
    (`ServerArgs.precision_or_stored`): no flag names it but `--component-precisions.<c>`."""

    kind = "module"
    direct_support = MODULE_DIRECT_SUPPORT

    def diffusers_builder(self, spec: ComponentSpec) -> Callable[[], nn.Module]:
        return diffusers_models.module_builder(spec)

    def precision_for(self, component: ComponentSpec, args: ServerArgs) -> torch.dtype:
        """Its `--component-precisions.<c>` entry, else the floating dtype its checkpoint
        stores (fp32 for a checkpoint with no floating tensor)."""
        return args.precision_or_stored(component.name, stored=_stored_dtype(component))


def _stored_dtype(component: ComponentSpec) -> torch.dtype:
    """The floating dtype most of the component's checkpoint bytes are stored in, read from
    its headers; fp32 for a checkpoint with no floating tensor."""
    checkpoint = open_checkpoint(component.folder)
    stored = stored_dtype((info.dtype, info.nbytes) for info in checkpoint.tensors.values())
    return stored or torch.float32


def check_direct_memory(request: LoadRequest, platform: Platform) -> None:
    """DG-6 for an admitted direct request: the headers' bytes must fit the device."""
    spec = request.component
    preflight.check_device_memory(
        open_checkpoint(spec.folder),
        component=spec.name,
        device=request.plan.checkpoint_load_device,
        platform=platform,
    )


def takes_quantization(cls: type[nn.Module]) -> bool:
    """Whether `cls(...)` accepts a `quantization=` keyword (named, or through `**kwargs`)."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):  # no introspectable signature: do not guess
        return False
    return any(
        p.name == "quantization" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters
    )


@dataclass(frozen=True)
class DiTModel:
    """How to build one DiT component: its class, a zero-argument factory, its linear kinds."""

    cls: type[nn.Module]
    construct: Callable[[], nn.Module]
    kinds: LinearKinds
    library: str


class TransformerLoader(ComponentLoader):
    """Loads DiT components (`transformer`, `transformer_2`, ...) through the full-state path.

    The class comes from diffusers' transformer package when model_index.json names the
    `diffusers` library (reference.place.diffusers_models), else from the registry. A class whose
    constructor takes `quantization=` is built with the quantization in force, so its layers get
    the matching quant methods; a quantization for a class that takes none is refused before any
    file is opened (FP8-5: never an unquantized model in its place). The serving stack's
    standard linear classes, which decide zero-copy adoption (ZC-3, ZC-4), come from `kinds`, or
    the class's own `linear_kinds` attribute; a class that declares none is plain torch, whose
    parameters are judged by ZC-2b.
    """

    kind = "transformer"
    direct_support: ClassVar[DirectSupport] = TRANSFORMER_DIRECT_SUPPORT

    def __init__(
        self,
        *,
        registry: ModelRegistry | None = None,
        platform: Platform = SYSTEM,
        kinds: LinearKinds | None = None,
        options: DiTOptions = DIT_DEFAULTS,
    ) -> None:
        super().__init__(registry=registry, platform=platform)
        self.kinds = kinds
        self.options = options

    def quantization_for(
        self, component: ComponentSpec, args: ServerArgs
    ) -> QuantizationSpec | None:
        """A requested quantization wins; else the one the checkpoint's config declares."""
        return args.quantization or component.quantization

    def model_for(self, spec: ComponentSpec) -> DiTModel:
        """Resolve the component's class (no file is opened).

        Raises:
            CheckpointError: the class cannot be resolved.
        """
        if spec.library == diffusers_models.LIBRARY:
            cls = diffusers_models.resolve_dit_class(spec)
            construct = diffusers_models.model_builder(spec, cls)
            return DiTModel(cls, construct, diffusers_models.PLAIN_TORCH_KINDS, spec.library)
        cls = self.registry.resolve(spec.class_name, component=spec)
        declared = self.kinds or getattr(cls, "linear_kinds", None)
        kinds = (
            declared if isinstance(declared, LinearKinds) else diffusers_models.PLAIN_TORCH_KINDS
        )
        return DiTModel(cls, self.registered_builder(spec), kinds, spec.library)

    def admit_model(self, component: ComponentSpec, args: ServerArgs) -> None:
        """The class resolves, and takes the quantization in force if there is one.

        Raises:
            CheckpointError: the class cannot be resolved.
            ComponentCheckpointUnsupportedError: quantization for a class that takes none.
        """
        model = self.model_for(component)
        quantization = self.quantization_for(component, args)
        if quantization is None or takes_quantization(model.cls):
            return
        if args.quantization is not None:
            source, fix = f"{QUANTIZATION_FLAG} {quantization.method}", f"Drop {QUANTIZATION_FLAG}"
        else:
            source = f"quantization {quantization.method!r} declared in its config.json"
            fix = "Use a checkpoint without quantization_config"
        raise ComponentCheckpointUnsupportedError(
            f"component {component.name!r}: {source} cannot be applied to"
            f" {model.library}.{model.cls.__name__}: its constructor takes no quantization= and"
            " its layers are plain torch.nn.Linear with no quant method to process the weights"
            " after loading, and the reference never returns an unquantized model instead."
            f" {fix}, or load a class built with quantized linear layers"
        )

    def construct(self, request: LoadRequest) -> tuple[DiTModel, Callable[[], nn.Module]]:
        """The component's model and the zero-argument build its load runs: the class with
        the quantization in force where it takes one."""
        spec = request.component
        model = self.model_for(spec)
        if takes_quantization(model.cls):
            return model, functools.partial(
                build_module, model.cls, spec, quantization=request.quantization
            )
        return model, model.construct

    def build_checked(self, request: LoadRequest) -> tuple[nn.Module, Checkpoint]:
        spec = request.component
        checkpoint = open_checkpoint(spec.folder)
        _, construct = self.construct(request)
        module = build_dit(
            construct, component=spec.name, dtype=request.dtype, checkpoint=checkpoint
        )
        return module, checkpoint

    def adopts(self, request: LoadRequest) -> bool:
        return self.options.adopt and not request.direct

    def load_component(self, request: LoadRequest) -> tuple[nn.Module, LoadReport]:
        spec = request.component
        if request.direct and not request.preflighted:
            check_direct_memory(request, self.platform)
        model, construct = self.construct(request)
        if request.prebuilt is not None:
            construct = functools.partial(_prebuilt, request.prebuilt)
        module, report = load_dit(
            construct,
            spec.folder,
            plan=request.plan,
            kinds=model.kinds,
            quantization=request.quantization,
            fsdp=request.fsdp,
            component=spec.name,
            dtype=request.dtype,
            options=self.options,
        )
        return module, report  # load_dit returns it in eval mode


class VAELoader(ComponentLoader):
    """Loads `vae`, `video_vae` and `audio_vae`: streamed when a direct request for `vae` or
    `video_vae` was admitted, else the ordinary way. A component whose model_index.json entry
    names the `diffusers` library is built from diffusers' own VAE class (see
    reference.place.diffusers_models); any other from the registry."""

    kind = "vae"
    direct_support: ClassVar[DirectSupport] = VAE_DIRECT_SUPPORT

    def model_builder(self, spec: ComponentSpec) -> Callable[[], nn.Module]:
        """Resolve the component's model class now; return a `build()` from its config.json.

        Raises:
            CheckpointError: the class cannot be resolved (unregistered, not a diffusers VAE
                class, or diffusers not installed).
        """
        if spec.library == diffusers_models.LIBRARY:
            return diffusers_models.vae_builder(spec)
        return self.registered_builder(spec)

    def build_checked(self, request: LoadRequest) -> tuple[nn.Module, Checkpoint]:
        if not request.direct:
            return super().build_checked(request)
        spec = request.component
        checkpoint = open_checkpoint(spec.folder)
        module = build_vae(
            self.model_builder(spec),
            checkpoint,
            component=spec.name,
            config=spec.config,
            dtype=request.dtype,
            steps=VAE_DEFAULTS.steps,
        )
        return module, checkpoint

    def load_component(self, request: LoadRequest) -> tuple[nn.Module, LoadReport]:
        spec = request.component
        build = self.model_builder(spec)
        if not request.direct:
            return ordinarily(request, build=build, loader=self)
        if not request.preflighted:
            check_direct_memory(request, self.platform)
        if request.prebuilt is not None:
            build = functools.partial(_prebuilt, request.prebuilt)
        module, report = load_vae(
            build,
            spec.folder,
            device=request.args.device,
            component=spec.name,
            config=spec.config,
            quantization=request.quantization,
            dtype=request.dtype,
        )
        return module, report  # load_vae returns it in eval mode


class EncoderLoader(ComponentLoader):
    """Loads text and image encoders (`text_encoder`, `text_encoder_2`, `image_encoder`, ...),
    and any other model of the transformers library (`loader_kind`: AudioLDM 2's
    `language_model`, a `SpeechT5HifiGan` vocoder), through
    `reference.load.encoder.load_encoder` (TE-1, TE-2). It supports no direct-GPU loading
    (ADM-3): a resident encoder is read straight onto its device anyway.

    A component whose model_index.json entry names the `transformers` library is built from
    transformers' own class (reference.place.transformers_models), refused at admission when it
    cannot be (TE-4); any other from the registry. Its precision defaults to the dtype its
    checkpoint stores (TE-3, `ServerArgs.precision_or_stored`).
    """

    kind = "encoder"
    direct_support: ClassVar[DirectSupport] = ENCODER_DIRECT_SUPPORT

    def __init__(
        self,
        *,
        registry: ModelRegistry | None = None,
        platform: Platform = SYSTEM,
        options: EncoderOptions = ENCODER_DEFAULTS,
    ) -> None:
        super().__init__(registry=registry, platform=platform)
        self.options = options

    def model_for(self, spec: ComponentSpec) -> EncoderModel:
        """Resolve the component's class now (no file is opened).

        Raises:
            ComponentCheckpointUnsupportedError: a transformers class that cannot be built (TE-4).
            CheckpointError: a class of another library that is not registered.
        """
        if spec.library == transformers_models.LIBRARY:
            cls = transformers_models.resolve_encoder_class(spec)
            build = transformers_models.encoder_builder(spec, cls)
        else:
            if spec.quantization is not None:
                transformers_models.resolve_encoder_class(spec)  # refuses the quantization
            build = self.registered_builder(spec)
        return EncoderModel(
            build,
            transformers_models.declared_ties,
            transformers_models.fp32_keeper,
            transformers_models.needs_no_initialisation,
            transformers_models.checkpoint_renames,
        )

    def admit_model(self, component: ComponentSpec, args: ServerArgs) -> None:
        """TE-4: the class resolves and can be built as asked, before any file is opened.

        Raises:
            ComponentCheckpointUnsupportedError, CheckpointError: as `model_for`.
        """
        self.model_for(component)

    def precision_for(self, component: ComponentSpec, args: ServerArgs) -> torch.dtype:
        """TE-3: the flags' precision for this encoder, else the floating dtype its checkpoint
        stores (read from the headers; fp32 for a checkpoint with no floating tensor); a
        `vocoder` of the transformers library (AudioLDM 2's `SpeechT5HifiGan`) takes the
        vocoder's precision (`ServerArgs.precision_or_stored`)."""
        return args.precision_or_stored(component.name, stored=_stored_dtype(component))

    def build_checked(self, request: LoadRequest) -> tuple[nn.Module, Checkpoint]:
        spec = request.component
        built = build_tied_encoder(
            self.model_for(spec),
            open_checkpoint(spec.folder),
            dtype=request.dtype,
            component=spec.name,
            steps=self.options.steps,
        )
        return built.module, built.opened

    def adopts(self, request: LoadRequest) -> bool:
        return self.options.adopt

    def load_component(self, request: LoadRequest) -> tuple[nn.Module, LoadReport]:
        spec = request.component
        model = self.model_for(spec)
        if request.prebuilt is not None:
            model = dataclasses.replace(model, build=functools.partial(_prebuilt, request.prebuilt))
        module, report = load_encoder(
            model,
            spec.folder,
            plan=request.plan,
            dtype=request.dtype,
            component=spec.name,
            options=self.options,
        )
        return module, report  # load_encoder returns it in eval mode


def _prebuilt(module: nn.Module) -> nn.Module:
    """The build of a load whose module `ComponentLoader.prepare` built already."""
    return module
