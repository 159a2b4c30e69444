"""Broken whole-pipeline loading (PIPE-2..4): each the reference with one step done the way a
loader that "loads the whole pipeline" plausibly gets it wrong."""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import ClassVar

from safetensors.torch import load_file
from torch import nn

from fakes.broken.base import BrokenAdapter
from reference.errors import LoadError
from reference.kit.seam import ComponentRequest, LoadedPipeline, PipelineRequest
from reference.load import pipeline as load
from reference.load.loaders import ComponentLoader, LoadedComponent, LoadRequest, loader_kind
from reference.load.pipeline_memory import check_pipeline_memory
from reference.load.together import run_together
from reference.place.build import build_on_meta
from reference.request.admission import admit
from reference.request.args import own_server_args
from reference.request.model_index import ComponentSpec, ModelRegistry, read_pipeline

__all__ = [
    "BuildsDefaultsOnlyOnMeta",
    "FillsMetaBuildsByAssignment",
    "KeepsComponentsOfAFailedLoad",
    "LeavesOutWhatItCannotBuild",
    "LoadsOnlyTheKindsItKnowsByName",
    "PreflightsEachComponentAlone",
    "StagesEveryComponentAtOnce",
]


def _registry(request: PipelineRequest) -> ModelRegistry:
    registry = ModelRegistry()
    for class_name, cls in (request.models or {}).items():
        registry.register(cls, name=class_name)
    return registry


def _returned(request: PipelineRequest, loaded: list[LoadedComponent]) -> LoadedPipeline:
    skipped = load.not_loaded(read_pipeline(request.pipeline_dir))
    return LoadedPipeline(
        components={item.name: item.module for item in loaded},
        not_loaded=dict(skipped),
        reports=tuple(item.report for item in loaded),
    )


def _run_prepared(
    request: PipelineRequest,
    job: Callable[[ComponentLoader, LoadRequest], Callable[[], LoadedComponent]],
    *,
    concurrency: int | None = None,
) -> LoadedPipeline:
    """The reference's whole load with each component's load replaced: every refusal first
    (`prepare_pipeline`), then `job(loader, request)` of each component run together, at most
    `concurrency` at once (default: all)."""
    prepared = load.prepare_pipeline(
        request.pipeline_dir,
        own_server_args(request.args),
        registry=_registry(request),
        platform=request.platform,
    )
    jobs = [job(loader, item.request) for loader, item in prepared]
    names = [item.request.component.name for _, item in prepared]
    del prepared
    return _returned(request, run_together(jobs, names=names, concurrency=concurrency or len(jobs)))


class LeavesOutWhatItCannotBuild(BrokenAdapter):
    """Loads the components whose class it can build and leaves the others out, unreported,
    as a loader that skips "unknown" components does: a caller holds a pipeline with a
    weight-bearing component missing and no error (PIPE-1)."""

    name = "broken-leaves-out-what-it-cannot-build"
    breaks = frozenset({"PIPE-1"})

    def load_pipeline(self, request: PipelineRequest) -> LoadedPipeline:
        args = own_server_args(request.args).on_platform(request.platform)
        pipeline = read_pipeline(request.pipeline_dir)
        registry = _registry(request)
        buildable = []
        for name in pipeline.names:
            spec = pipeline.component(name)
            if _weightless(spec):
                continue
            try:
                load.loader_for(spec, registry=registry, platform=request.platform).admit_model(
                    spec, args
                )
            except LoadError:
                continue
            buildable.append(name)
        loaded = load.load_pipeline(
            request.pipeline_dir,
            args,
            components=buildable,
            registry=registry,
            platform=request.platform,
        )
        return _returned(request, list(loaded))


class PreflightsEachComponentAlone(BrokenAdapter):
    """Admits every component first, then checks and loads them one after another: each one's
    headers and memory are checked just before it loads, as upstream checks each component
    against what is free at that moment. A last component whose headers disagree is found
    after the first ones were read, and components that each fit but together do not are
    never refused as a whole (PIPE-2)."""

    name = "broken-preflights-each-component-alone"
    breaks = frozenset({"PIPE-2"})

    def load_pipeline(self, request: PipelineRequest) -> LoadedPipeline:
        args = own_server_args(request.args).on_platform(request.platform)
        pipeline = read_pipeline(request.pipeline_dir)
        admit(pipeline, args, platform=request.platform)
        registry = _registry(request)
        names = [n for n in pipeline.names if not _weightless(pipeline.component(n))]
        loaders = {
            n: load.loader_for(pipeline.component(n), registry=registry, platform=request.platform)
            for n in names
        }
        direct = {n: loaders[n].admit(pipeline.component(n), args) for n in names}
        loaded = []
        for name in names:
            prepared = loaders[name].prepare(pipeline.component(name), args, direct=direct[name])
            check_pipeline_memory(
                [prepared.needs], platform=request.platform, pipeline=str(request.pipeline_dir)
            )
            loaded.append(loaders[name].load_request(prepared.request))
        return _returned(request, loaded)


def _weightless(component: str | ComponentSpec) -> bool:
    """No loader kind covers `component` (by its name alone where a name is given)."""
    try:
        loader_kind(component)
    except Exception:
        return True
    return False


class LoadsOnlyTheKindsItKnowsByName(BrokenAdapter):
    """Loads the components its loaders know by name (DiTs, VAEs, vocoder, encoders) and
    lists every other one as not loaded, as a loader that decides what holds weights by a
    component's name does: LTX-2's `connectors` (a model folder of no named kind) are left
    out, so the caller holds a pipeline short of weights it needs (PIPE-1)."""

    name = "broken-loads-only-the-kinds-it-knows-by-name"
    breaks = frozenset({"PIPE-1"})

    def load_pipeline(self, request: PipelineRequest) -> LoadedPipeline:
        pipeline = read_pipeline(request.pipeline_dir)
        named = [n for n in pipeline.names if not _weightless(n)]
        loaded = load.load_pipeline(
            request.pipeline_dir,
            own_server_args(request.args),
            components=named,
            registry=_registry(request),
            platform=request.platform,
        )
        listed = {n: "not a kind this loader knows" for n in pipeline.names if n not in named}
        return LoadedPipeline(
            components={item.name: item.module for item in loaded},
            not_loaded=listed,
            reports=tuple(item.report for item in loaded),
        )


class KeepsComponentsOfAFailedLoad(BrokenAdapter):
    """Keeps every component it loaded in a cache of its own, to spare a retry the work, and
    does not empty it when another component fails: the failed load's modules stay alive and
    hold their memory (PIPE-3)."""

    name = "broken-keeps-components-of-a-failed-load"
    breaks = frozenset({"PIPE-3"})
    cache: ClassVar[list[nn.Module]] = []

    def load_pipeline(self, request: PipelineRequest) -> LoadedPipeline:
        return _run_prepared(
            request, lambda loader, job: functools.partial(self._cached, loader, job), concurrency=3
        )

    @classmethod
    def _cached(cls, loader: ComponentLoader, request: LoadRequest) -> LoadedComponent:
        if request.prebuilt is not None:
            cls.cache.append(request.prebuilt)
        return loader.load_request(request)


class StagesEveryComponentAtOnce(BrokenAdapter):
    """Reads each component's whole checkpoint into host memory before placing it (a staging
    copy), concurrently, and frees the copies only once every component is in: the host
    holds every component twice at the peak (PIPE-4)."""

    name = "broken-stages-every-component-at-once"
    breaks = frozenset({"PIPE-4"})

    def load_pipeline(self, request: PipelineRequest) -> LoadedPipeline:
        prepared = load.prepare_pipeline(
            request.pipeline_dir,
            own_server_args(request.args),
            registry=_registry(request),
            platform=request.platform,
        )
        everyone = threading.Barrier(len(prepared))
        jobs: list[Callable[[], LoadedComponent]] = [
            functools.partial(self._staged, loader, item.request, everyone)
            for loader, item in prepared
        ]
        names = [item.request.component.name for _, item in prepared]
        del prepared
        return _returned(request, run_together(jobs, names=names, concurrency=len(jobs)))

    @staticmethod
    def _staged(
        loader: ComponentLoader, request: LoadRequest, everyone: threading.Barrier
    ) -> LoadedComponent:
        folder = request.component.folder
        staged = [
            {k: v.clone() for k, v in load_file(str(f)).items()}
            for f in sorted(folder.glob("*.safetensors"))
        ]
        try:
            loaded = loader.load_request(request)
        except BaseException:
            everyone.abort()  # the others stop waiting for this one
            raise
        everyone.wait(timeout=60)
        del staged
        return loaded


class FillsMetaBuildsByAssignment(BrokenAdapter):
    """Loads a whole pipeline's ordinary components (no direct request) into the modules its
    checks built on meta with `load_state_dict(assign=True)`, the meta-init idiom, instead of
    building them for real or filling the objects construction made: every slot gets a new
    tensor of the right value, but a non-persistent buffer construction computed on meta stays
    there, and a handle construction kept on a parameter still holds the meta one (ADM-6)."""

    name = "broken-fills-meta-builds-by-assignment"
    breaks = frozenset({"ADM-6"})

    def load_pipeline(self, request: PipelineRequest) -> LoadedPipeline:
        return _run_prepared(
            request, lambda loader, job: functools.partial(self._assigned, loader, job)
        )

    @staticmethod
    def _assigned(loader: ComponentLoader, request: LoadRequest) -> LoadedComponent:
        meta = request.prebuilt
        if meta is None or request.direct or loader_kind(request.component.name) != "vae":
            return loader.load_request(request)
        # The state as the ordinary way gives it (its values, dtypes, device), assigned.
        loaded = loader.load_request(dataclasses.replace(request, prebuilt=None))
        meta.load_state_dict(loaded.module.state_dict(), assign=True)
        return dataclasses.replace(loaded, module=meta.train(loaded.module.training))


class BuildsDefaultsOnlyOnMeta(BrokenAdapter):
    """Builds each ordinary component (a VAE or vocoder with no direct request) on meta, to fill
    that build, and has no real build to turn to where the construction cannot run there: a
    class whose construction reads a value of its own weights, which the ordinary way loads,
    fails to load, alone or in a whole pipeline (ADM-6)."""

    name = "broken-builds-defaults-only-on-meta"
    breaks = frozenset({"ADM-6"})

    def load_pipeline_component(self, request: ComponentRequest) -> nn.Module:
        _build_on_meta(request.pipeline_dir, (request.component,), request.models)
        return super().load_pipeline_component(request)

    def load_pipeline(self, request: PipelineRequest) -> LoadedPipeline:
        names = read_pipeline(request.pipeline_dir).names
        _build_on_meta(request.pipeline_dir, names, request.models)
        return super().load_pipeline(request)


def _build_on_meta(
    pipeline_dir: Path, names: tuple[str, ...], models: Mapping[str, type[nn.Module]] | None
) -> None:
    """Each ordinary component of `names` whose class the test hands over, built on meta."""
    pipeline = read_pipeline(pipeline_dir)
    for name in names:
        if name not in ORDINARY:
            continue
        spec = pipeline.component(name)
        cls = (models or {}).get(spec.class_name)
        if cls is not None:
            build_on_meta(functools.partial(cls, **spec.init_kwargs), component=name)


ORDINARY = ("vae", "video_vae", "audio_vae", "vocoder")
"""The components the reference loads the ordinary way when no direct request names them."""
