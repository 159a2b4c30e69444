"""The transformer (DiT) and VAE component loaders, registered beside the vocoder loader.

Both run behind `ComponentLoader.load`, so the loader gate has already admitted the request when
`load_component` runs. A direct request is checked against free device memory (DG-6) before any
byte moves, then handed to the DiT full-state path or the VAE streaming path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ClassVar

from torch import nn

from reference import diffusers_models, preflight
from reference.admission import DirectSupport
from reference.adopt import LinearKinds
from reference.args import ServerArgs
from reference.checkpoint import open_checkpoint
from reference.dit import load_dit
from reference.errors import LoadError
from reference.loaders import (
    TRANSFORMER_DIRECT_SUPPORT,
    VAE_DIRECT_SUPPORT,
    ComponentLoader,
    LoadRequest,
    build_module,
    load_ordinarily,
)
from reference.pipeline import MODELS, ComponentSpec, ModelRegistry
from reference.platform import SYSTEM, Platform
from reference.quantization import QuantizationSpec
from reference.report import TensorRecord
from reference.vae import load_vae


def check_direct_memory(request: LoadRequest, platform: Platform) -> None:
    """DG-6 for an admitted direct request: the headers' bytes must fit the device."""
    spec = request.component
    preflight.check_device_memory(
        open_checkpoint(spec.folder),
        component=spec.name,
        device=request.plan.checkpoint_load_device,
        platform=platform,
    )


class TransformerLoader(ComponentLoader):
    """Loads DiT components (`transformer`, `transformer_2`, ...) through the full-state path.

    Model classes are built with `quantization=` the quantization in force, so their layers get
    the matching quant methods. The serving stack's standard linear classes, which decide
    zero-copy adoption (ZC-3, ZC-4), come from `kinds` or else from the model class's own
    `linear_kinds` attribute.
    """

    kind = "transformer"
    direct_support: ClassVar[DirectSupport] = TRANSFORMER_DIRECT_SUPPORT

    def __init__(
        self,
        *,
        registry: ModelRegistry = MODELS,
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

    def load_component(self, request: LoadRequest) -> tuple[nn.Module, list[TensorRecord]]:
        spec = request.component
        if request.direct:
            check_direct_memory(request, self.platform)
        cls = self.registry.resolve(spec.class_name, component=spec)
        kinds = self.kinds or getattr(cls, "linear_kinds", None)
        if not isinstance(kinds, LinearKinds):
            raise LoadError(
                f"component {spec.name!r}: {cls.__name__} names no standard linear classes; give"
                " the class a `linear_kinds = LinearKinds(...)` attribute or pass kinds= to"
                " the loader"
            )
        kwargs = spec.init_kwargs

        def build() -> nn.Module:
            return cls(**kwargs, quantization=request.quantization)

        module, report = load_dit(
            build,
            spec.folder,
            plan=request.plan,
            kinds=kinds,
            quantization=request.quantization,
            fsdp=request.fsdp,
            component=spec.name,
        )
        return module.eval(), list(report.records)


class VAELoader(ComponentLoader):
    """Loads `vae`, `video_vae` and `audio_vae`: streamed when a direct request for `vae` or
    `video_vae` was admitted, else the ordinary way. A component whose model_index.json entry
    names the `diffusers` library is built from diffusers' own VAE class (see
    reference.diffusers_models); any other from the registry."""

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

    def load_component(self, request: LoadRequest) -> tuple[nn.Module, list[TensorRecord]]:
        spec = request.component
        build = self.model_builder(spec)
        if not request.direct:
            return load_ordinarily(self.registry, request, build=build)
        check_direct_memory(request, self.platform)
        module, report = load_vae(
            build,
            spec.folder,
            device=request.args.runtime_device,
            component=spec.name,
            config=spec.config,
            quantization=request.quantization,
        )
        return module.eval(), list(report.records)
