"""The transformer (DiT) and VAE component loaders, registered beside the vocoder loader.

Both run behind `ComponentLoader.load`, so the loader gate has already admitted the request when
`load_component` runs. A direct request is checked against free device memory (DG-6) before any
byte moves, then handed to the DiT full-state path or the VAE streaming path.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from reference.errors import ComponentCheckpointUnsupportedError
from reference.load.dit import load_dit
from reference.load.loaders import (
    TRANSFORMER_DIRECT_SUPPORT,
    VAE_DIRECT_SUPPORT,
    ComponentLoader,
    LoadRequest,
    build_module,
    load_ordinarily,
)
from reference.load.vae import load_vae
from reference.place import diffusers_models
from reference.place.adopt import LinearKinds
from reference.place.records import TensorRecord
from reference.read import preflight
from reference.read.checkpoint import open_checkpoint
from reference.request.admission import DirectSupport
from reference.request.args import QUANTIZATION_FLAG, ServerArgs
from reference.request.model_index import ComponentSpec, ModelRegistry
from reference.request.platform import SYSTEM, Platform
from reference.request.quantization import QuantizationSpec

__all__ = [
    "DiTModel",
    "TransformerLoader",
    "VAELoader",
    "check_direct_memory",
    "takes_quantization",
]


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
    ) -> None:
        super().__init__(registry=registry, platform=platform)
        self.kinds = kinds

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
        return DiTModel(
            cls, functools.partial(build_module, self.registry, spec), kinds, spec.library
        )

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

    def load_component(self, request: LoadRequest) -> tuple[nn.Module, list[TensorRecord]]:
        spec = request.component
        if request.direct:
            check_direct_memory(request, self.platform)
        model = self.model_for(spec)
        if takes_quantization(model.cls):
            kwargs = spec.init_kwargs
            cls = model.cls

            def construct() -> nn.Module:
                return cls(**kwargs, quantization=request.quantization)

        else:
            construct = model.construct
        module, report = load_dit(
            construct,
            spec.folder,
            plan=request.plan,
            kinds=model.kinds,
            quantization=request.quantization,
            fsdp=request.fsdp,
            component=spec.name,
            dtype=request.dtype,
        )
        return module, list(report.records)  # load_dit returns it in eval mode


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
        self.registry.resolve(spec.class_name, component=spec)
        return functools.partial(build_module, self.registry, spec)

    def admit_model(self, component: ComponentSpec, args: ServerArgs) -> None:
        """The class resolves (a diffusers VAE class, or a registered one).

        Raises:
            CheckpointError: the class cannot be resolved.
        """
        self.model_builder(component)

    def load_component(self, request: LoadRequest) -> tuple[nn.Module, list[TensorRecord]]:
        spec = request.component
        build = self.model_builder(spec)
        if not request.direct:
            return load_ordinarily(self.registry, request, build=build)
        check_direct_memory(request, self.platform)
        module, report = load_vae(
            build,
            spec.folder,
            device=request.args.device,
            component=spec.name,
            config=spec.config,
            quantization=request.quantization,
            dtype=request.dtype,
        )
        return module, list(report.records)  # load_vae returns it in eval mode
