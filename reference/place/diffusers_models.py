"""Model classes from the `diffusers` library, for components whose model_index.json entry names it.

A real pipeline folder declares its VAE as `"vae": ["diffusers", "AutoencoderKL"]` and its DiT as
`"transformer": ["diffusers", "WanTransformer3DModel"]`. The loaders then build that class from
the component's config.json with the class's own `from_config` and load its safetensors weights
with the same rules as every other model: a VAE streamed (ABI check, preflight, per-tensor
stream, post-load steps) when a direct request was admitted, else the ordinary way; a DiT through
the full-state path, where its plain torch parameters are adopted under the rules (ZC-2b).

Which names resolve: exactly the classes that diffusers' own model packages export
(`diffusers.models.autoencoders` for VAEs, `diffusers.models.transformers` for DiTs; both are
what `diffusers.models` re-exports), that subclass diffusers' `ModelMixin` and are defined in
that package. The name from the config is looked up in that package's namespace (never
imported as a module path, never through diffusers' lazy top-level module, which would import
pipelines and whatever they pull in); any other name (a UNet, a pipeline, `os`, a dotted path) is
refused. diffusers decides what is a VAE; the direct-streaming rules then decide which of those
classes can be streamed, and refuse the others with the rule's error. A vocoder resolves among
`diffusers.models.autoencoders` too (diffusers keeps its vocoders there), or, where
model_index.json names one of diffusers' pipeline packages as its library (LTX-2's
`["ltx2", "LTX2Vocoder"]`), among the model classes that package defines, by name. A
component of no named kind (a UNet, LTX-2's `connectors`) resolves the same way, among every
model class of `diffusers.models` or of the pipeline package its entry names.

diffusers is optional: without it, a pipeline that names the library fails with an error naming
the extra to install.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, TypeGuard

from torch import nn

from reference.errors import CheckpointError
from reference.extras import install_hint
from reference.place.adopt import LinearKinds
from reference.place.host_memory import allocation_guard
from reference.request.model_index import (
    CONFIG,
    MODEL_INDEX,
    QUANTIZATION_CONFIG,
    ComponentSpec,
    diffusers_pipeline_package,
)

__all__ = [
    "DIT_PACKAGE",
    "LIBRARY",
    "MODELS_PACKAGE",
    "PLAIN_TORCH_KINDS",
    "VAE_PACKAGE",
    "NoStandardLinear",
    "NoUnquantizedMethod",
    "import_model_package",
    "model_builder",
    "model_class_names",
    "module_builder",
    "resolve_dit_class",
    "resolve_model_class",
    "resolve_pipeline_model_class",
    "resolve_vae_class",
    "vae_builder",
    "vocoder_builder",
]

LIBRARY = "diffusers"
VAE_PACKAGE = "diffusers.models.autoencoders"
DIT_PACKAGE = "diffusers.models.transformers"
MODELS_PACKAGE = "diffusers.models"


def import_model_package(component: ComponentSpec, package: str) -> ModuleType:
    """One of diffusers' model packages (VAE_PACKAGE, DIT_PACKAGE), imported on first use.

    Raises:
        CheckpointError: diffusers is not installed (or fails to import), naming model_index.json,
            the component, and the extra to install.
    """
    try:
        importlib.import_module(LIBRARY)
        return importlib.import_module(package)
    except ImportError as exc:
        raise CheckpointError(
            str(component.folder.parent / MODEL_INDEX),
            component.name,
            f"names the {LIBRARY} library ({LIBRARY}.{component.class_name}), and {LIBRARY} cannot"
            f" be imported ({exc}); install it: {install_hint(LIBRARY)}",
        ) from None


def _defines_model_class(obj: object, name: str, package_name: str) -> TypeGuard[type[nn.Module]]:
    """Whether `obj`, found under `name` in package `package_name`, is a diffusers model class
    (a `ModelMixin`) of that name which the package itself defines."""
    model_mixin = importlib.import_module(f"{LIBRARY}.models.modeling_utils").ModelMixin
    return (
        isinstance(obj, type)
        and issubclass(obj, model_mixin)
        and obj is not model_mixin
        and obj.__name__ == name
        and obj.__module__.startswith(f"{package_name}.")
    )


@functools.cache  # a package's classes do not change; each component load asks again
def model_class_names(package: ModuleType, package_name: str) -> tuple[str, ...]:
    """The ModelMixin classes `package` (named `package_name`) defines and exports, sorted."""
    return tuple(
        sorted(
            name
            for name, obj in vars(package).items()
            if _defines_model_class(obj, name, package_name)
        )
    )


def resolve_model_class(component: ComponentSpec, package_name: str, kind: str) -> type[nn.Module]:
    """The class of diffusers' model package `package_name` that `component` names.

    Raises:
        CheckpointError: diffusers is missing (naming the extra), or the name is not one of the
            classes the package exports (listing those that are).
    """
    package = import_model_package(component, package_name)
    names = model_class_names(package, package_name)
    if component.class_name not in names:
        diffusers = importlib.import_module(LIBRARY)
        raise CheckpointError(
            str(component.folder.parent / MODEL_INDEX),
            component.name,
            f"{LIBRARY} class {component.class_name!r} is not a {kind} class of {package_name}"
            f" ({LIBRARY} {getattr(diffusers, '__version__', '?')}); the {kind} loader builds only"
            f" those: {', '.join(names)}",
        )
    cls: type[nn.Module] = vars(package)[component.class_name]
    return cls


def resolve_vae_class(component: ComponentSpec) -> type[nn.Module]:
    """The diffusers VAE class that `component`'s model_index.json entry names.

    Raises:
        CheckpointError: as `resolve_model_class`.
    """
    return resolve_model_class(component, VAE_PACKAGE, "VAE")


def resolve_pipeline_model_class(
    component: ComponentSpec, package_name: str, kind: str
) -> type[nn.Module]:
    """The diffusers model class (a `ModelMixin`) that `component` names and that package
    `package_name` (a pipeline package, or `diffusers.models`) defines, looked up by name in
    the package (as diffusers' own `from_pretrained` does), never imported from a path the
    config gives.

    Raises:
        CheckpointError: diffusers is missing, or the name is not such a class.
    """
    package = import_model_package(component, package_name)
    name = component.class_name
    try:
        found = getattr(package, name) if name.isidentifier() else None
    except (AttributeError, ImportError):
        found = None
    if _defines_model_class(found, name, package_name):
        return found
    raise CheckpointError(
        str(component.folder.parent / MODEL_INDEX),
        component.name,
        f"{name!r} is not a {LIBRARY} model class of {package_name}; the {kind} loader builds"
        f" only the model classes (ModelMixin) a {LIBRARY} package defines. To load the"
        f" pipeline without it, mark it absent in {MODEL_INDEX} ([null, null], as diffusers"
        f" writes a component passed as None), or name the other components to load",
    )


def vocoder_builder(component: ComponentSpec) -> Callable[[], nn.Module]:
    """Resolve a vocoder's diffusers class now: one of `diffusers.models.autoencoders` (where
    diffusers keeps its vocoders: `["diffusers", "MMAudioVocoder"]`), or one a pipeline package
    defines (`["ltx2", "LTX2Vocoder"]`); return a `build()` from its config.json.

    Raises:
        CheckpointError: as `resolve_model_class` and `resolve_pipeline_model_class`.
    """
    package = diffusers_pipeline_package(component.library)
    if package is None:
        return model_builder(component, resolve_model_class(component, VAE_PACKAGE, "vocoder"))
    return model_builder(component, resolve_pipeline_model_class(component, package, "vocoder"))


def module_builder(component: ComponentSpec) -> Callable[[], nn.Module]:
    """Resolve the diffusers class of a component of no named kind now: any model class of
    `diffusers.models` where model_index.json names `diffusers` (`["diffusers",
    "UNet2DConditionModel"]`), or one a pipeline package defines (LTX-2's `["ltx2",
    "LTX2TextConnectors"]`); return a `build()` from its config.json.

    Raises:
        CheckpointError: as `resolve_pipeline_model_class`.
    """
    package = diffusers_pipeline_package(component.library) or MODELS_PACKAGE
    return model_builder(component, resolve_pipeline_model_class(component, package, "module"))


def vae_builder(component: ComponentSpec) -> Callable[[], nn.Module]:
    """Resolve the VAE class now; return a `build()` that constructs it from config.json.

    A quantized config is refused for direct loading before `build()` runs (VAE-12).

    Raises:
        CheckpointError: from `resolve_vae_class`; from `build()`, a config the class rejects,
            naming config.json.
    """
    return model_builder(component, resolve_vae_class(component))


class NoStandardLinear(nn.Module):
    """No layer of a diffusers model is one of a serving stack's standard linears."""


class NoUnquantizedMethod:
    """No layer of a diffusers model carries a quant method."""


PLAIN_TORCH_KINDS = LinearKinds(
    replicated=NoStandardLinear,
    column_parallel=NoStandardLinear,
    row_parallel=NoStandardLinear,
    unquantized_method=NoUnquantizedMethod,
)
"""The linear kinds of a plain-torch model: none. Its parameters carry no `weight_loader`, so
the zero-copy rule judges them by ZC-2b (ZC-1, ZC-6..8), never by ZC-3..5."""


def resolve_dit_class(component: ComponentSpec) -> type[nn.Module]:
    """The diffusers DiT class that `component`'s model_index.json entry names.

    Raises:
        CheckpointError: as `resolve_model_class`.
    """
    return resolve_model_class(component, DIT_PACKAGE, "transformer")


def model_builder(component: ComponentSpec, cls: type[nn.Module]) -> Callable[[], nn.Module]:
    """A `build()` that constructs diffusers class `cls` from the component's config.json.

    `build()` calls the class's own `from_config` (which drops metadata keys and keys this
    diffusers version does not know), so it runs unchanged under any default-device context.
    `quantization_config` is left out, as for every other model class
    (ComponentSpec.init_kwargs): a diffusers class takes no reference quantization, so a
    quantized request is refused before `build()` runs.

    Raises:
        CheckpointError: from `build()`, a config the class rejects, naming config.json.
        HostMemoryError: from `build()`, a construction past the host's memory.
    """
    diffusers_class: Any = cls  # ModelMixin's from_config is not part of nn.Module's type
    config: Mapping[str, Any] = {
        k: v for k, v in component.config.items() if k != QUANTIZATION_CONFIG
    }

    def build() -> nn.Module:
        try:
            # The guard names the config's keys when the construction is refused.
            with allocation_guard(component.name, config=config):
                module: nn.Module = diffusers_class.from_config(dict(config))
        except (TypeError, ValueError, KeyError, AssertionError) as exc:
            raise CheckpointError(
                str(component.folder / CONFIG), None, f"does not fit {cls.__name__}: {exc}"
            ) from None
        return module

    return build
