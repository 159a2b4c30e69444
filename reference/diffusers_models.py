"""VAE classes from the `diffusers` library, for components whose model_index.json entry names it.

A real pipeline folder declares its VAE as `"vae": ["diffusers", "AutoencoderKL"]`. The VAE loader
then builds that class from the component's config.json with the class's own `from_config` and
loads its safetensors weights with the same rules as every other VAE: streamed (ABI check,
preflight, per-tensor stream, post-load steps) when a direct request was admitted, else the
ordinary way.

Which names resolve: exactly the classes that diffusers' own VAE package,
`diffusers.models.autoencoders`, exports, that subclass diffusers' `ModelMixin` and are defined
in that package. The name from the config is looked up in that package's namespace (never
imported as a module path, never through diffusers' lazy top-level module, which would import
pipelines and whatever they pull in); any other name (a UNet, a pipeline, `os`, a dotted path) is
refused. diffusers decides what is a VAE; the direct-streaming rules then decide which of those
classes can be streamed, and refuse the others with the rule's error.

diffusers is optional: without it, a pipeline that names the library fails with an error naming
the extra to install.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from torch import nn

from reference.errors import CheckpointError
from reference.pipeline import CONFIG, MODEL_INDEX, QUANTIZATION_CONFIG, ComponentSpec

LIBRARY = "diffusers"
VAE_PACKAGE = "diffusers.models.autoencoders"
INSTALL_HINT = "pip install 'diffusion-loader-conformance[diffusers]'"


def import_vae_package(component: ComponentSpec) -> ModuleType:
    """diffusers' VAE package, imported on first use.

    Raises:
        CheckpointError: diffusers is not installed (or fails to import), naming model_index.json,
            the component, and the extra to install.
    """
    try:
        importlib.import_module(LIBRARY)
        return importlib.import_module(VAE_PACKAGE)
    except ImportError as exc:
        raise CheckpointError(
            str(component.folder.parent / MODEL_INDEX),
            component.name,
            f"names the {LIBRARY} library ({LIBRARY}.{component.class_name}), and {LIBRARY} cannot"
            f" be imported ({exc}); install the extra: {INSTALL_HINT}",
        ) from None


def vae_class_names(package: ModuleType) -> tuple[str, ...]:
    """The names `resolve_vae_class` accepts in this diffusers installation, sorted."""
    model_mixin = importlib.import_module(f"{LIBRARY}.models.modeling_utils").ModelMixin
    return tuple(
        sorted(
            name
            for name, obj in vars(package).items()
            if isinstance(obj, type)
            and issubclass(obj, model_mixin)
            and obj.__name__ == name
            and obj.__module__.startswith(f"{VAE_PACKAGE}.")
        )
    )


def resolve_vae_class(component: ComponentSpec) -> type[nn.Module]:
    """The diffusers VAE class that `component`'s model_index.json entry names.

    Raises:
        CheckpointError: diffusers is missing (naming the extra), or the name is not one of
            diffusers' VAE classes (listing those that are).
    """
    package = import_vae_package(component)
    names = vae_class_names(package)
    if component.class_name not in names:
        diffusers = importlib.import_module(LIBRARY)
        raise CheckpointError(
            str(component.folder.parent / MODEL_INDEX),
            component.name,
            f"{LIBRARY} class {component.class_name!r} is not a VAE class of {VAE_PACKAGE}"
            f" ({LIBRARY} {getattr(diffusers, '__version__', '?')}); the VAE loader builds only"
            f" those: {', '.join(names)}",
        )
    cls: type[nn.Module] = vars(package)[component.class_name]
    return cls


def vae_builder(component: ComponentSpec) -> Callable[[], nn.Module]:
    """Resolve the class now; return a `build()` that constructs it from config.json.

    `build()` calls the class's own `from_config` (which drops metadata keys and keys this
    diffusers version does not know), so it runs unchanged under `with torch.device("meta")`.
    `quantization_config` is left out, as for every other model class (ComponentSpec.init_kwargs);
    a quantized config is refused for direct loading before `build()` runs (VAE-12).

    Raises:
        CheckpointError: from `resolve_vae_class`; from `build()`, a config the class rejects,
            naming config.json.
    """
    cls = resolve_vae_class(component)
    diffusers_class: Any = cls  # ModelMixin's from_config is not part of nn.Module's type
    config: Mapping[str, Any] = {
        k: v for k, v in component.config.items() if k != QUANTIZATION_CONFIG
    }

    def build() -> nn.Module:
        try:
            module: nn.Module = diffusers_class.from_config(dict(config))
        except (TypeError, ValueError) as exc:
            raise CheckpointError(
                str(component.folder / CONFIG), None, f"does not fit {cls.__name__}: {exc}"
            ) from None
        return module

    return build
