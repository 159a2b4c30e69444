"""Loading a whole pipeline: admit once, then each component through its loader.

    read_pipeline -> admit (pipeline gate, arguments gate) -> loader_for(component).load
    (loader gate first) -> plan -> checkpoint -> adopt / stream / copy -> post-load -> report

`load_pipeline` returns every component loaded, or raises; a caller never holds a pipeline with
some components missing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from reference.admission import admit
from reference.args import ServerArgs
from reference.errors import LoadError
from reference.loaders import ComponentLoader, LoadedComponent, VocoderLoader, loader_kind
from reference.model_loaders import TransformerLoader, VAELoader
from reference.pipeline import MODELS, ModelRegistry, read_pipeline
from reference.platform import SYSTEM, Platform

LOADERS: dict[str, type[ComponentLoader]] = {
    "transformer": TransformerLoader,
    "vae": VAELoader,
    "vocoder": VocoderLoader,
}
"""Loader classes by kind (see reference.loaders.loader_kind)."""


def loader_for(
    component: str, *, registry: ModelRegistry = MODELS, platform: Platform = SYSTEM
) -> ComponentLoader:
    """A loader instance for `component`.

    Raises:
        LoadError: for a component no loader kind covers.
    """
    return LOADERS[loader_kind(component)](registry=registry, platform=platform)


def iter_load(
    root: str | os.PathLike[str],
    args: ServerArgs,
    *,
    components: Sequence[str] | None = None,
    registry: ModelRegistry = MODELS,
    platform: Platform = SYSTEM,
) -> Iterator[LoadedComponent]:
    """`load_pipeline`, one component at a time (admission runs before the first)."""
    pipeline = read_pipeline(Path(root))
    admit(pipeline, args, platform=platform)
    names = components if components is not None else [n for n in pipeline.names if _has_loader(n)]
    for name in names:
        loader = loader_for(name, registry=registry, platform=platform)
        yield loader.load(pipeline.component(name), args)


def load_pipeline(
    root: str | os.PathLike[str],
    args: ServerArgs,
    *,
    components: Sequence[str] | None = None,
    registry: ModelRegistry = MODELS,
    platform: Platform = SYSTEM,
) -> tuple[LoadedComponent, ...]:
    """Admit `args` for the pipeline at `root`, then load its components in declared order.

    Args:
        root: the pipeline directory (model_index.json and one folder per component).
        args: the loading options.
        components: which components to load (default: every declared component that a loader
            covers; others, such as schedulers and tokenizers, are not weights and are skipped).
        registry: where model classes are resolved.
        platform: CUDA facts for admission and the memory preflight.

    Returns:
        The loaded components, in model_index.json order.

    Raises:
        ComponentCheckpointUnsupportedError, ArgumentError: a refused request, before any
            weight is read.
        LoadError: any failure while loading, naming the component.
    """
    return tuple(iter_load(root, args, components=components, registry=registry, platform=platform))


def _has_loader(component: str) -> bool:
    try:
        loader_kind(component)
    except LoadError:
        return False
    return True
