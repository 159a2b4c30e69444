"""Model classes of the `transformers` library: the text and image encoders of real pipelines
(TE-1, TE-4).

A real pipeline folder declares its encoders as `"text_encoder": ["transformers",
"UMT5EncoderModel"]`. The encoder loader builds that class from the component's config.json
(`cls(cls.config_class.from_dict(config))`, under the meta build: parameters and persistent
buffers on `meta`, no initialisation of their values, no host allocation for them), re-ties the
slots the class declares tied (TE-2) and loads its safetensors weights with the DiT's steps.

Which names resolve: a class that transformers' own top-level namespace exports and that
subclasses its `PreTrainedModel` (never a dotted path, never a module a config names). A class
this transformers lacks, custom code (`auto_map`), a `quantization_config` (the reference
implements none for encoders) and transformers not installed are refused at admission, before
any tensor data is read, naming the component, the class and the fix (TE-4).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

import torch
from torch import nn

from reference.errors import CheckpointError, ComponentCheckpointUnsupportedError
from reference.extras import install_hint
from reference.place.host_memory import allocation_guard
from reference.request.model_index import CONFIG, MODEL_INDEX, QUANTIZATION_CONFIG, ComponentSpec

__all__ = [
    "AUTO_MAP",
    "EXTRA",
    "LIBRARY",
    "checkpoint_renames",
    "declared_ties",
    "encoder_builder",
    "fp32_keeper",
    "import_transformers",
    "needs_no_initialisation",
    "resolve_encoder_class",
]

LIBRARY = "transformers"
EXTRA = "diffusers"  # the extra that brings transformers with diffusers
AUTO_MAP = "auto_map"


def _where(component: ComponentSpec) -> str:
    return f"component {component.name!r} ({LIBRARY}.{component.class_name})"


def import_transformers(component: ComponentSpec) -> ModuleType:
    """transformers, imported on first use.

    Raises:
        ComponentCheckpointUnsupportedError: transformers cannot be imported, naming the
            component, the class and the extra to install (TE-4).
    """
    try:
        return importlib.import_module(LIBRARY)
    except ImportError as exc:
        raise ComponentCheckpointUnsupportedError(
            f"{_where(component)}: names the {LIBRARY} library, and {LIBRARY} cannot be imported"
            f" ({exc}); install it: {install_hint(EXTRA)}"
        ) from None


def resolve_encoder_class(component: ComponentSpec) -> type[nn.Module]:
    """The transformers class `component`'s model_index.json entry names, refused before any
    tensor data is read when the reference cannot build it as transformers would (TE-4).

    Raises:
        ComponentCheckpointUnsupportedError: custom code (`auto_map` in its config.json), a
            `quantization_config`, transformers missing, or a class this transformers does not
            export as a model; each naming the component, the class and the fix.
    """
    where = _where(component)
    if AUTO_MAP in component.config:
        raise ComponentCheckpointUnsupportedError(
            f"{where}: its {CONFIG} declares custom code ({AUTO_MAP}), and the reference runs no"
            " code from a checkpoint. Use a checkpoint of a class transformers ships, or name your"
            f" own class under your own library in {MODEL_INDEX} and register it with --models"
        )
    if QUANTIZATION_CONFIG in component.config:
        method = component.quantization.method if component.quantization else "?"
        raise ComponentCheckpointUnsupportedError(
            f"{where}: its {CONFIG} declares quantization {method!r}, which the encoder loader"
            " does not implement, and the reference never loads an encoder unquantized nor"
            " through another library instead. Use an unquantized checkpoint of the encoder"
        )
    transformers = import_transformers(component)
    base = getattr(transformers, "PreTrainedModel", None)
    name = component.class_name
    cls: object = None
    if name.isidentifier() and not name.startswith("_"):
        try:
            cls = getattr(transformers, name, None)
        except ImportError:  # an export whose optional dependency is missing
            cls = None
    if not (isinstance(cls, type) and isinstance(base, type) and issubclass(cls, base)):
        version = getattr(transformers, "__version__", "?")
        raise ComponentCheckpointUnsupportedError(
            f"{where}: {LIBRARY} {version} has no model class {name!r} (named in"
            f" {component.folder.parent / MODEL_INDEX}); install a {LIBRARY} that ships it"
            f" (pip install -U {LIBRARY}), or name your own class under your own library there"
            " and register it with --models"
        )
    found: type[nn.Module] = cls  # type: ignore[assignment]  # a PreTrainedModel subclass
    return found


def encoder_builder(component: ComponentSpec, cls: type[nn.Module]) -> Callable[[], nn.Module]:
    """A `build()` that constructs transformers class `cls` from the component's config.json,
    as `from_pretrained` does (`cls(config)` of the class's own config class), without reading
    the config file again.

    Raises:
        CheckpointError: from `build()`, a config the class rejects, naming config.json.
        HostMemoryError: from `build()`, a construction past the host's memory.
    """
    model_class: Any = cls  # PreTrainedModel's config_class is not part of nn.Module's type
    config: Mapping[str, Any] = dict(component.config)

    def build() -> nn.Module:
        try:
            with allocation_guard(component.name, config=config):
                module: nn.Module = model_class(model_class.config_class.from_dict(dict(config)))
        except (TypeError, ValueError, KeyError, AttributeError, AssertionError) as exc:
            raise CheckpointError(
                str(component.folder / CONFIG), None, f"does not fit {cls.__name__}: {exc}"
            ) from None
        return module

    return build


def declared_ties(module: nn.Module) -> dict[str, str]:
    """The slots `module`'s class ties, as transformers declares them for this config: tied
    name -> the name it shares storage with (T5's `encoder.embed_tokens.weight` ->
    `shared.weight`); empty for a class that ties nothing."""
    expand = getattr(module, "get_expanded_tied_weights_keys", None)
    if callable(expand):
        ties = expand(all_submodels=True)
    else:
        ties = getattr(module, "all_tied_weights_keys", None) or {}
    return {str(target): str(source) for target, source in dict(ties).items()}


def checkpoint_renames(
    module: nn.Module, names: Iterable[str], *, component: str
) -> dict[str, str]:
    """The checkpoint names transformers renames for `module`'s class when it loads it, as
    `from_pretrained` renames them: checkpoint name -> slot name, for each of `names` it
    changes. transformers 5 saves some classes under their former layout and maps it back on
    load (its own `conversion_mapping`: Gemma 3's `language_model.model.*` ->
    `model.language_model.*`), and adds or strips the class's `base_model_prefix`. Asked of
    transformers' own tables (a library's rules, not a copy of them), only where some name is
    not a slot's; a transformers without them (4.x) renames nothing here.

    Raises:
        ComponentCheckpointUnsupportedError: a name transformers would not only rename but
            convert (merge, split, transpose: its `WeightConverter`s), which the encoder loader
            does not implement; before any tensor is read.
    """
    slots = dict.fromkeys(module.state_dict(keep_vars=True), True)
    names = list(names)
    if all(name in slots for name in names):
        # Every name is a slot's (T5, UMT5, CLIP, ...): nothing to ask. transformers builds its
        # tables on first use, 0.1 s of a process's cold start (measured on 2 cores).
        return {}
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import (
            WeightConverter,
            WeightRenaming,
            rename_source_key,
        )
    except ImportError:
        return {}
    transforms = get_model_conversion_mapping(module)  # type: ignore[arg-type]
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    prefix = getattr(module, "base_model_prefix", None) or None
    renames: dict[str, str] = {}
    for name in names:
        renamed, converted = rename_source_key(name, renamings, converters, prefix, slots)
        if renamed not in slots and name in slots:
            renamed, converted = rename_source_key(name, [], [], prefix, slots)
        if converted is not None and renamed in slots:
            raise ComponentCheckpointUnsupportedError(
                f"component {component!r} ({LIBRARY}.{type(module).__name__}): its checkpoint"
                f" tensor {name!r} is stored in a layout transformers converts on load"
                f" ({converted!r} -> {renamed!r}), which the encoder loader does not"
                " implement; load this component with transformers' own from_pretrained, or"
                " use a checkpoint in the layout the class holds"
            )
        if renamed != name:
            renames[name] = renamed
    return renames


def needs_no_initialisation(module: nn.Module, tensor: torch.Tensor) -> None:
    """Mark a slot sent to meta as transformers marks loaded weights (`_is_hf_initialized`), so
    the class's own `init_weights` skips it: nothing to initialise, the checkpoint fills it. A
    torch layer that registers it (`nn.Linear`, `nn.Embedding`, ...: parameters only) is marked
    too, so it is not even visited; a transformers layer is visited, since its initialisation may
    also fill a non-persistent buffer."""
    tensor._is_hf_initialized = True  # type: ignore[attr-defined]
    if type(module).__module__.startswith("torch.nn."):
        module.__dict__["_is_hf_initialized"] = True  # a plain attribute, as transformers sets it


def fp32_keeper(module: nn.Module, dtype: torch.dtype) -> Callable[[str], bool]:
    """TE-3, PREC-2: which state keys of a transformers model stay fp32 under precision
    `dtype`, as `from_pretrained(torch_dtype=dtype)` keeps them: the class's
    `_keep_in_fp32_modules` under fp16 only, its `_keep_in_fp32_modules_strict` under fp16 and
    bf16, each entry a pattern searched anywhere in the key (`*` any run of characters), as
    transformers matches them."""
    patterns: list[str] = []
    if dtype == torch.float16:
        patterns.extend(getattr(module, "_keep_in_fp32_modules", None) or ())
    if dtype in (torch.float16, torch.bfloat16):
        patterns.extend(getattr(module, "_keep_in_fp32_modules_strict", None) or ())
    if not patterns:
        return lambda key: False
    search = re.compile("|".join(p.replace("*", ".*") for p in sorted(patterns))).search
    return lambda key: search(key) is not None
