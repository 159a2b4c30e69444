"""A pipeline directory: `model_index.json` -> its components -> their model classes.

Layout (the Diffusers convention, as a diffusers pipeline's own `save_pretrained` writes it):

    PIPELINE_DIR/
      model_index.json        {"_class_name": ..., "<component>": ["<library>", "<ClassName>"],
                               "<absent component>": [null, null], "<setting>": <any JSON>, ...}
      <component>/config.json the model's constructor arguments (keys starting with "_" are
                              metadata; "quantization_config" declares a quantized checkpoint)
      <component>/*.safetensors  the weights, one file or shards with an index

Parsing reads `model_index.json` and each component's `config.json`, never weights. Model classes
are resolved by name through a `ModelRegistry`, a value the caller builds and passes in (the
command line builds it from the `MODEL_CLASSES` of each `--models` module); nothing is
imported by the name a config gives, so no code runs from a checkpoint. (A DiT, VAE or vocoder
whose entry names the `diffusers` library, or a vocoder whose entry names one of its pipeline
packages, is looked up among diffusers' own model classes instead; see
reference.place.diffusers_models.)
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from torch import nn

from reference.errors import ArgumentError, CheckpointError
from reference.files import MAX_CONFIG_BYTES, load_json, read_bounded
from reference.request.quantization import QuantizationSpec

__all__ = [
    "CONFIG",
    "MODEL_CLASSES",
    "MODEL_INDEX",
    "QUANTIZATION_CONFIG",
    "ComponentSpec",
    "ModelRegistry",
    "Pipeline",
    "diffusers_pipeline_package",
    "encoder_index",
    "is_component_entry",
    "is_encoder_component",
    "is_image_encoder_component",
    "is_text_encoder_component",
    "is_transformer_component",
    "names_diffusers_class",
    "read_pipeline",
]

MODEL_INDEX = "model_index.json"
MODEL_CLASSES = "MODEL_CLASSES"
"""The attribute a `--models` module defines: a mapping of class names to model classes."""
CONFIG = "config.json"
QUANTIZATION_CONFIG = "quantization_config"

_TRANSFORMER = re.compile(r"transformer(_[0-9]+)?")
DIFFUSERS = "diffusers"
DIFFUSERS_PIPELINES = "diffusers.pipelines"


def diffusers_pipeline_package(library: str) -> str | None:
    """`diffusers.pipelines.<library>` where `library` is one of diffusers' pipeline packages,
    as model_index.json names a model class a pipeline package defines (LTX-2's
    `"vocoder": ["ltx2", "LTX2Vocoder"]`); None otherwise, or without diffusers. Asked of the
    installed files: diffusers is not imported (seconds), so a library of another name costs
    nothing."""
    if not library.isidentifier() or library == DIFFUSERS:
        return None
    try:
        found = importlib.util.find_spec(DIFFUSERS)  # finds the package, imports nothing
    except (ImportError, ValueError):
        return None
    roots = (found.submodule_search_locations or []) if found is not None else []
    if any((Path(root) / "pipelines" / library / "__init__.py").is_file() for root in roots):
        return f"{DIFFUSERS_PIPELINES}.{library}"
    return None


def names_diffusers_class(library: str) -> bool:
    """Whether a model_index.json entry of `library` names diffusers' own class: the
    `diffusers` library, or one of its pipeline packages."""
    return library == DIFFUSERS or diffusers_pipeline_package(library) is not None


def is_transformer_component(name: str) -> bool:
    """Whether `name` is a DiT component: `transformer`, `transformer_2`, `transformer_3`, ..."""
    return _TRANSFORMER.fullmatch(name) is not None


_TEXT_ENCODER = re.compile(r"text_encoder(?:_([0-9]+))?")
_IMAGE_ENCODER = re.compile(r"image_encoder(?:_([0-9]+))?")


def is_text_encoder_component(name: str) -> bool:
    """Whether `name` is a text encoder: `text_encoder`, `text_encoder_2`, ..."""
    return _TEXT_ENCODER.fullmatch(name) is not None


def is_image_encoder_component(name: str) -> bool:
    """Whether `name` is an image encoder: `image_encoder`, `image_encoder_2`, ..."""
    return _IMAGE_ENCODER.fullmatch(name) is not None


def is_encoder_component(name: str) -> bool:
    """Whether `name` is a text or image encoder (TE): a component of the transformers library."""
    return is_text_encoder_component(name) or is_image_encoder_component(name)


def encoder_index(name: str) -> int:
    """The position of a text or image encoder in its row: 0 for `text_encoder`, 1 for
    `text_encoder_2`, ... (`--text-encoder-precisions` gives one value per position)."""
    found = _TEXT_ENCODER.fullmatch(name) or _IMAGE_ENCODER.fullmatch(name)
    if found is None or found.group(1) is None:
        return 0
    return max(int(found.group(1)) - 1, 0)


@dataclass(frozen=True)
class ComponentSpec:
    """One declared component of a pipeline.

    Attributes:
        name: the component's key in model_index.json (`transformer`, `vae`, ...).
        library: the library model_index.json names for its class.
        class_name: the model class name, resolved through a ModelRegistry.
        folder: the component's folder (config.json and weights).
        config: its config.json (read-only), or an empty mapping when it has none.
        quantization: the quantization its config declares, or None. A checkpoint that declares
            one is stored in that format, so `serialized` is True.
    """

    name: str
    library: str
    class_name: str
    folder: Path
    config: Mapping[str, Any]
    quantization: QuantizationSpec | None

    @property
    def init_kwargs(self) -> dict[str, Any]:
        """Constructor arguments: the config without metadata keys and quantization_config."""
        return {
            k: v
            for k, v in self.config.items()
            if not k.startswith("_") and k != QUANTIZATION_CONFIG
        }


@dataclass(frozen=True)
class Pipeline:
    """A parsed pipeline directory.

    Attributes:
        root: the pipeline directory.
        class_name: `_class_name` of model_index.json, or None.
        components: declared components by name, in model_index.json order.
        settings: the pipeline's own settings, by key, in model_index.json order: every entry
            that is neither metadata (a key starting with "_") nor a component (Wan's
            `boundary_ratio`, HunyuanDiT's `requires_safety_checker`, ...). Kept, never
            interpreted: they configure the pipeline's sampling, not its weights.
    """

    root: Path
    class_name: str | None
    components: Mapping[str, ComponentSpec]
    settings: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def names(self) -> tuple[str, ...]:
        """Declared component names, in model_index.json order."""
        return tuple(self.components)

    @property
    def transformer_components(self) -> tuple[str, ...]:
        """The DiT components the pipeline declares (`transformer`, `transformer_2`, ...)."""
        return tuple(name for name in self.components if is_transformer_component(name))

    def component(self, name: str) -> ComponentSpec:
        """The declared component `name`.

        Raises:
            CheckpointError: naming model_index.json and the declared components.
        """
        if name not in self.components:
            raise CheckpointError(
                str(self.root / MODEL_INDEX),
                name,
                f"no such component; declared: {', '.join(self.names) or 'none'}",
            )
        return self.components[name]


def _read_json(path: Path) -> dict[str, Any]:
    """A pipeline's JSON file (model_index.json, a config.json): bounded, within the JSON
    budget, strict (UTF-8, no key twice), an object."""
    raw = load_json(path, read_bounded(path, what=path.name, limit=MAX_CONFIG_BYTES), path.name)
    if not isinstance(raw, dict):
        raise CheckpointError(str(path), None, f"must be a JSON object, got {type(raw).__name__}")
    return raw


def _read_index(root: Path) -> dict[str, Any]:
    """model_index.json of the folder `root`, telling a missing folder from a missing index."""
    if not root.exists():
        raise CheckpointError(
            str(root), None, "does not exist; give the pipeline folder that holds model_index.json"
        )
    if not root.is_dir():
        raise CheckpointError(
            str(root),
            None,
            "is not a folder; give the pipeline folder that holds model_index.json",
        )
    index_path = root / MODEL_INDEX
    if not index_path.exists():
        raise CheckpointError(
            str(root),
            None,
            f"holds no {MODEL_INDEX}, so it is not a pipeline folder; give the folder a diffusers"
            " pipeline's save_pretrained wrote",
        )
    return _read_json(index_path)


def is_component_entry(entry: object) -> bool:
    """Whether a model_index.json value declares a component rather than a pipeline setting.

    diffusers writes a component as a two-element list `[library, class]`, and an absent one
    as `[null, null]`; a setting can be any JSON value, a list of two numbers included. So an
    entry is a component exactly when it is a two-element list holding a string or two nulls.
    """
    return (
        isinstance(entry, list)
        and len(entry) == 2
        and (any(isinstance(e, str) for e in entry) or entry == [None, None])
    )


def _quantization(path: Path, config: Mapping[str, Any]) -> QuantizationSpec | None:
    raw = config.get(QUANTIZATION_CONFIG)
    if raw is None:
        return None
    method = raw.get("quant_method") if isinstance(raw, dict) else None
    if not isinstance(method, str) or not method:
        raise CheckpointError(
            str(path),
            QUANTIZATION_CONFIG,
            'must be an object with a non-empty "quant_method", e.g. {"quant_method": "fp8"}',
        )
    return QuantizationSpec(method, serialized=True)


def _component(root: Path, name: str, entry: list[Any]) -> ComponentSpec:
    library, class_name = entry
    folder = root / name
    config_path = folder / CONFIG
    config = _read_json(config_path) if config_path.exists() else {}
    return ComponentSpec(
        name=name,
        library=library,
        class_name=class_name,
        folder=folder,
        config=MappingProxyType(config),
        quantization=_quantization(config_path, config),
    )


def read_pipeline(root: str | Path) -> Pipeline:
    """Parse a pipeline directory's model_index.json and its components' config.json files.

    An entry of model_index.json whose key starts with "_" is metadata; one that is a
    component entry (`is_component_entry`) declares a component, or marks it absent with
    `[null, null]` (skipped); any other is a pipeline setting, kept on `Pipeline.settings`.
    Weights are not opened.

    Raises:
        CheckpointError: naming the folder or file (and key) at fault: a folder that does not
            exist or holds no model_index.json, a malformed model_index.json or config.json, or
            a component entry that is not `["<library>", "<ClassName>"]`.
    """
    root = Path(root)
    index = _read_index(root)
    components: dict[str, ComponentSpec] = {}
    settings: dict[str, Any] = {}
    for name, entry in index.items():
        if name.startswith("_") or entry == [None, None]:
            continue
        if not is_component_entry(entry):
            settings[name] = entry
            continue
        if not all(isinstance(e, str) and e for e in entry):
            raise CheckpointError(
                str(root / MODEL_INDEX),
                name,
                f'must be ["<library>", "<ClassName>"] (or [null, null]), got {entry!r}',
            )
        components[name] = _component(root, name, entry)
    class_name = index.get("_class_name")
    return Pipeline(
        root=root,
        class_name=class_name if isinstance(class_name, str) else None,
        components=MappingProxyType(components),
        settings=MappingProxyType(settings),
    )


class ModelRegistry:
    """Model classes by class name. Filled explicitly; resolving never imports anything."""

    def __init__(self) -> None:
        self._classes: dict[str, type[nn.Module]] = {}

    def register(self, cls: type[nn.Module], *, name: str | None = None) -> type[nn.Module]:
        """Register `cls` under `name` (default: its `__name__`); usable as a decorator.

        Registering the same class again is a no-op.

        Raises:
            ArgumentError: when the name is taken by another class.
        """
        key = name or cls.__name__
        known = self._classes.get(key)
        if known is not None and known is not cls:
            raise ArgumentError(
                f"model class name {key!r} is already registered for"
                f" {known.__module__}.{known.__qualname__}; register {cls.__qualname__} under"
                " another name"
            )
        self._classes[key] = cls
        return cls

    def names(self) -> tuple[str, ...]:
        """Registered class names, sorted."""
        return tuple(sorted(self._classes))

    @classmethod
    def of(cls, classes: Mapping[str, type[nn.Module]]) -> ModelRegistry:
        """A registry holding `classes` (class name -> class)."""
        registry = cls()
        for name, model in classes.items():
            registry.register(model, name=name)
        return registry

    def resolve(
        self, class_name: str, *, component: ComponentSpec | None = None
    ) -> type[nn.Module]:
        """The model class registered as `class_name`.

        Args:
            class_name: the name model_index.json gives.
            component: the component asking, so the error can name its model_index.json entry.

        Raises:
            CheckpointError: when the class is not registered, naming model_index.json and the
                component (when given), the registered names and how to register one.
        """
        cls = self._classes.get(class_name)
        if cls is None:
            source = (
                "model registry"
                if component is None
                else str(component.folder.parent / MODEL_INDEX)
            )
            raise CheckpointError(
                source,
                None if component is None else component.name,
                f"model class {class_name!r} is not registered (registered:"
                f" {', '.join(self.names()) or 'none'}). A class of the diffusers library loads"
                ' when model_index.json names it as ["diffusers", "<Class>"] (install the'
                " [diffusers] extra); for your own class, pass --models MODULE, a module whose"
                f" {MODEL_CLASSES!r} maps class names to classes",
            )
        return cls
