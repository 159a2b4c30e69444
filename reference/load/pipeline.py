"""Loading a whole pipeline: every refusal first, then every component at once, all or nothing.

    read_pipeline -> admit (pipeline gate, arguments gate) -> for every component: its loader's
    gate, decisions, meta build and headers against slots -> one memory preflight per device
    -> the components load concurrently (`reference.load.together`), each through its loader
    -> the components in declared order, or the first failure with nothing kept

`load_pipeline` returns every component loaded, or raises; a caller never holds a pipeline with
some components missing, and a pipeline too big for a device is refused before any tensor of
any component is read (PIPE-1..4).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from reference.errors import ArgumentError, LoadError
from reference.load.dit import DiTOptions
from reference.load.encoder import EncoderOptions
from reference.load.loaders import (
    ComponentLoader,
    EncoderLoader,
    LoadedComponent,
    ModuleLoader,
    PreparedComponent,
    TransformerLoader,
    VAELoader,
    VocoderLoader,
    loader_kind,
)
from reference.load.pipeline_memory import check_pipeline_memory
from reference.load.together import run_together
from reference.request.admission import admit
from reference.request.args import ServerArgs
from reference.request.model_index import ComponentSpec, ModelRegistry, Pipeline, read_pipeline
from reference.request.platform import SYSTEM, Platform

__all__ = [
    "LOADERS",
    "PIPELINE_DEFAULTS",
    "PipelineOptions",
    "iter_load",
    "load_pipeline",
    "loader_for",
    "not_loaded",
    "prepare_pipeline",
]

LOADERS: dict[str, type[ComponentLoader]] = {
    "transformer": TransformerLoader,
    "vae": VAELoader,
    "vocoder": VocoderLoader,
    "encoder": EncoderLoader,
    "module": ModuleLoader,
}
"""Loader classes by kind (see reference.load.loaders.loader_kind)."""


def loader_for(
    component: str | ComponentSpec,
    *,
    registry: ModelRegistry | None = None,
    platform: Platform = SYSTEM,
    adopt: bool = True,
) -> ComponentLoader:
    """A loader instance for `component` (a name: its named kind; a spec: any weight-bearing
    component, `loader_kind`); `adopt` False: its DiT or encoder copies every tensor
    (`DiTOptions.adopt`, the benchmark's copy path).

    Raises:
        LoadError: for a component no loader kind covers.
    """
    kind = loader_kind(component)
    if kind == "transformer" and not adopt:
        return TransformerLoader(
            registry=registry, platform=platform, options=DiTOptions(adopt=False)
        )
    if kind == "encoder" and not adopt:
        return EncoderLoader(
            registry=registry, platform=platform, options=EncoderOptions(adopt=False)
        )
    return LOADERS[kind](registry=registry, platform=platform)


@dataclass(frozen=True, kw_only=True)
class PipelineOptions:
    """How a whole-pipeline load runs, apart from what it loads.

    Attributes:
        concurrency: components loading at the same time at most (1: one after another).
            Measured on a 2-core machine (see the module docstring): 3 loads a DiT, a text
            encoder and a VAE as fast as more threads, and a pipeline has rarely more
            weight-bearing components.
        adopt: False copies every tensor of the DiTs and encoders, eligible for zero-copy or
            not (the benchmark's copy path, as `DiTOptions.adopt`).
    """

    concurrency: int = 3
    adopt: bool = True

    def __post_init__(self) -> None:
        value = self.concurrency
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ArgumentError(
                f"PipelineOptions.concurrency must be an int of at least 1, not {value!r}"
            )


PIPELINE_DEFAULTS = PipelineOptions()


def prepare_pipeline(
    root: str | os.PathLike[str],
    args: ServerArgs,
    *,
    components: Sequence[str] | None = None,
    registry: ModelRegistry | None = None,
    platform: Platform = SYSTEM,
    adopt: bool = True,
) -> list[tuple[ComponentLoader, PreparedComponent]]:
    """Everything that can refuse the load of the pipeline at `root` without reading tensor
    data, for every component, before the first tensor of any is read (PIPE-2): the pipeline
    and arguments gates (ADM-1, ADM-2), each loader's own gate and class (ADM-3, TE-4), the
    decisions and precisions, each component's build on meta and its headers against its slots
    (CKPT-3), then one memory preflight per device for all of them together
    (`reference.load.pipeline_memory.check_pipeline_memory`).

    Returns:
        Each component to load with its loader, in model_index.json order.

    Raises:
        ComponentCheckpointUnsupportedError, ArgumentError, CheckpointError,
            StateMismatchError, HostMemoryError, DeviceMemoryError: a refusal, before any
            tensor data is read.
    """
    args = args.on_platform(platform)
    pipeline = read_pipeline(Path(root))
    admit(pipeline, args, platform=platform)
    names = (
        components
        if components is not None
        else [n for n in pipeline.names if _has_loader(pipeline.component(n))]
    )
    loaders = [
        (
            name,
            loader_for(pipeline.component(name), registry=registry, platform=platform, adopt=adopt),
        )
        for name in names
    ]
    direct = {name: loader.admit(pipeline.component(name), args) for name, loader in loaders}
    prepared = [
        (loader, loader.prepare(pipeline.component(name), args, direct=direct[name]))
        for name, loader in loaders
    ]
    check_pipeline_memory(
        [item.needs for _, item in prepared], platform=platform, pipeline=str(root)
    )
    return prepared


def iter_load(
    root: str | os.PathLike[str],
    args: ServerArgs,
    *,
    components: Sequence[str] | None = None,
    registry: ModelRegistry | None = None,
    platform: Platform = SYSTEM,
) -> Iterator[LoadedComponent]:
    """`load_pipeline`, one component at a time, in declared order.

    `prepare_pipeline` runs now, before this returns: every refusal that needs no tensor data
    comes first, for every component (PIPE-2). The returned iterator only loads.

    Raises:
        As `prepare_pipeline`.
    """
    prepared = prepare_pipeline(
        root, args, components=components, registry=registry, platform=platform
    )
    return (loader.load_request(item.request) for loader, item in prepared)


def not_loaded(pipeline: Pipeline) -> tuple[tuple[str, str], ...]:
    """The declared components that hold no model, each with why it is not loaded.

    They are listed, not refused: a scheduler, a tokenizer, a processor or a feature extractor
    holds no model weights. Every component whose folder holds a model (a `config.json` or
    weight files) has a loader (`loader_kind`), which loads it or refuses the pipeline.
    """
    skipped = []
    for name, spec in pipeline.components.items():
        if _has_loader(spec):
            continue
        what = f"{spec.library}.{spec.class_name}"
        lowered = (name + spec.class_name).lower()
        if "scheduler" in lowered:
            why = "a scheduler: settings, no weights"
        elif "tokenizer" in lowered or "processor" in lowered or "extractor" in lowered:
            why = "a tokenizer or processor: vocabulary and settings, no weights"
        elif not spec.folder.is_dir():
            why = f"no folder {name}/ beside model_index.json, so no weights to load"
        else:
            why = f"its folder {name}/ holds no config.json and no weight files"
        skipped.append((name, f"{what}: {why}"))
    return tuple(skipped)


def load_pipeline(
    root: str | os.PathLike[str],
    args: ServerArgs,
    *,
    components: Sequence[str] | None = None,
    registry: ModelRegistry | None = None,
    platform: Platform = SYSTEM,
    options: PipelineOptions = PIPELINE_DEFAULTS,
) -> tuple[LoadedComponent, ...]:
    """Load the pipeline at `root` whole: every refusal first, then the components at the same
    time, all or nothing (PIPE-1..4).

    Args:
        root: the pipeline directory (model_index.json and one folder per component).
        args: the loading options; without a runtime device, cuda:0 when `platform` reports
            CUDA, else the CPU.
        components: which components to load (default: every declared component whose folder
            holds a model; the others, such as schedulers and tokenizers, hold no weights:
            `not_loaded`).
        registry: where model classes are resolved.
        platform: CUDA facts for admission, free device and host memory for the preflight.
        options: how many components load at once (`PipelineOptions`).

    Returns:
        The loaded components, in model_index.json order, each what loading it alone gives.

    Raises:
        ComponentCheckpointUnsupportedError, ArgumentError, CheckpointError,
            StateMismatchError, HostMemoryError, DeviceMemoryError: a refusal, before any
            tensor data of any component is read (`prepare_pipeline`).
        LoadError: the first component that failed while loading, as it raised (a refusal's
            type, or `ComponentLoadError` for one that torch, the OS or the model class
            raised), naming it; the other components were stopped and nothing was kept.
    """
    prepared = prepare_pipeline(
        root,
        args,
        components=components,
        registry=registry,
        platform=platform,
        adopt=options.adopt,
    )
    jobs = [functools.partial(loader.load_request, item.request) for loader, item in prepared]
    names = [item.request.component.name for _, item in prepared]
    del prepared  # the jobs hold the modules now: a failure must leave nothing else holding them
    try:
        return tuple(run_together(jobs, names=names, concurrency=options.concurrency))
    except BaseException:
        jobs.clear()
        raise


def _has_loader(component: ComponentSpec) -> bool:
    try:
        loader_kind(component)
    except LoadError:
        return False
    return True
