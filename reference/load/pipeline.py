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

from reference.errors import LoadError
from reference.load.loaders import (
    ComponentLoader,
    EncoderLoader,
    LoadedComponent,
    TransformerLoader,
    VAELoader,
    VocoderLoader,
    loader_kind,
)
from reference.request.admission import admit
from reference.request.args import ServerArgs
from reference.request.model_index import ModelRegistry, Pipeline, read_pipeline
from reference.request.platform import SYSTEM, Platform

__all__ = ["LOADERS", "iter_load", "load_pipeline", "loader_for", "not_loaded"]

LOADERS: dict[str, type[ComponentLoader]] = {
    "transformer": TransformerLoader,
    "vae": VAELoader,
    "vocoder": VocoderLoader,
    "encoder": EncoderLoader,
}
"""Loader classes by kind (see reference.load.loaders.loader_kind)."""


def loader_for(
    component: str, *, registry: ModelRegistry | None = None, platform: Platform = SYSTEM
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
    registry: ModelRegistry | None = None,
    platform: Platform = SYSTEM,
) -> Iterator[LoadedComponent]:
    """`load_pipeline`, one component at a time.

    Admission runs now, before this returns, for every component, once: the pipeline and
    arguments gates, then each loader's own `admit` (its direct-loading gate, and its class
    resolves, importing the model library if it is one, and takes the quantization in force).
    The returned iterator only loads.

    Raises:
        ComponentCheckpointUnsupportedError, ArgumentError, CheckpointError: refused requests.
    """
    args = args.on_platform(platform)
    pipeline = read_pipeline(Path(root))
    admit(pipeline, args, platform=platform)
    names = components if components is not None else [n for n in pipeline.names if _has_loader(n)]
    loaders = [(name, loader_for(name, registry=registry, platform=platform)) for name in names]
    direct = {name: loader.admit(pipeline.component(name), args) for name, loader in loaders}
    return (
        loader.load_admitted(pipeline.component(name), args, direct=direct[name])
        for name, loader in loaders
    )


def not_loaded(pipeline: Pipeline) -> tuple[tuple[str, str], ...]:
    """The declared components no loader covers, each with why it is not loaded.

    They are listed, not refused: a scheduler, a tokenizer, a processor or a feature extractor
    holds no model weights. Every component with weights (DiTs, VAEs, vocoder, text and image
    encoders) has a loader; one no loader covers is listed with that reason.
    """
    skipped = []
    for name, spec in pipeline.components.items():
        if _has_loader(name):
            continue
        what = f"{spec.library}.{spec.class_name}"
        lowered = (name + spec.class_name).lower()
        if "scheduler" in lowered:
            why = "a scheduler: settings, no weights"
        elif "tokenizer" in lowered or "processor" in lowered or "extractor" in lowered:
            why = "a tokenizer or processor: vocabulary and settings, no weights"
        else:
            why = (
                f"no loader of the reference covers the component {name!r} (DiTs, VAEs,"
                f" vocoder, text and image encoders); load it with its own library"
                f" ({spec.library})"
            )
        skipped.append((name, f"{what}: {why}"))
    return tuple(skipped)


def load_pipeline(
    root: str | os.PathLike[str],
    args: ServerArgs,
    *,
    components: Sequence[str] | None = None,
    registry: ModelRegistry | None = None,
    platform: Platform = SYSTEM,
) -> tuple[LoadedComponent, ...]:
    """Admit `args` for the pipeline at `root`, then load its components in declared order.

    Args:
        root: the pipeline directory (model_index.json and one folder per component).
        args: the loading options; without a runtime device, cuda:0 when `platform` reports
            CUDA, else the CPU.
        components: which components to load (default: every declared component that a loader
            covers; others, such as schedulers and tokenizers, are not weights and are skipped).
        registry: where model classes are resolved.
        platform: CUDA facts for admission and the memory preflight.

    Returns:
        The loaded components, in model_index.json order.

    Raises:
        ComponentCheckpointUnsupportedError, ArgumentError: a refused request, before any
            weight is read.
        LoadError: any failure while loading, naming the component (`ComponentLoadError` for
            one that torch, the OS or the model class raised).
    """
    return tuple(iter_load(root, args, components=components, registry=registry, platform=platform))


def _has_loader(component: str) -> bool:
    try:
        loader_kind(component)
    except LoadError:
        return False
    return True
