"""The measured loading paths of the benchmark: one function per path, and one measured run.

`run(job)` measures one path once in the calling process: either timed (no sampler thread
competing with the load) or sampled for memory (`reference.report.memory.PeakSampler`). Everything a
path needs (imports, CUDA context, a pinned buffer, the warm-up) happens before the measured region,
and the loaded tensors are listed and counted after it. `reference.programs.bench.runner` runs each
job in a fresh process; `reference.programs.bench.command` orchestrates the runs and takes medians.

With a warm-up folder, the path first loads those (small) checkpoints, unmeasured, so the one-off
costs of a process's first load (first calls, lazy caches, the copy-on-write faults of a forked
child) are not charged to the measured load: they are a fixed few milliseconds, not a cost per
byte.

Each run starts from the page-cache state its job names (`reference.programs.bench.cache`): "warm"
reads the path's checkpoint files once, "cold" drops their pages, both right before the clock
starts; the fraction of their pages cached at that moment is the run's `cached` figure. A cold run
whose pages could not be dropped reports why (`skipped`) instead of figures.

The limit paths (`reference.programs.bench.limits`) read the whole DiT checkpoint file; the prefetch
path needs `reference.read.reading` (its `ReadOptions`), and is unavailable without it.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import importlib
import importlib.util
import inspect
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reference.errors import HostMemoryError
from reference.extras import install_hint
from reference.load.dit import DiTOptions, load_dit
from reference.load.vae import VAEOptions, load_vae
from reference.programs.bench import construction, limits, pipeline_rows
from reference.programs.bench.cache import (
    CACHES,
    start_state,
)
from reference.programs.bench.pipeline_rows import PIPELINE_FOLDER
from reference.read.reading import ReadOptions
from reference.report.memory import PeakSampler, resident
from reference.report.summary import LoadReport
from reference.request.plan import CPU, WeightLoadPlan

__all__ = [
    "CUDA",
    "DIFFUSERS_FOLDER",
    "MODES",
    "PATHS",
    "PIPELINE_FOLDER",
    "TEXT_ENCODER_FOLDER",
    "Job",
    "Loaded",
    "PathSpec",
    "built",
    "ddit_from_pretrained",
    "ddit_zero_copy",
    "diffusers_transformer",
    "dit",
    "file_mapped_bytes",
    "from_report",
    "full_state",
    "library_missing",
    "limit_paths",
    "module_tensors",
    "pinned_h2d",
    "pinned_host",
    "pipeline",
    "pipeline_pretrained",
    "prefetch_options",
    "read_all",
    "refused_copy",
    "run",
    "start_cache",
    "state_dict_load",
    "synchronize",
    "te_from_pretrained",
    "te_zero_copy",
    "text_encoder",
    "vae_stream",
]

CUDA = torch.device("cuda", 0)
MODES = ("time", "memory")
DIFFUSERS_FOLDER = "ddit"
"""The benchmark folder's diffusers pipeline (written when diffusers is installed)."""
TEXT_ENCODER_FOLDER = "te"
"""The benchmark folder's UMT5 text encoder pipeline (written when transformers is installed)."""


def library_missing(library: str | None) -> str | None:
    """Why a path's optional library cannot be used here, or None."""
    if library is None:
        return None
    if importlib.util.find_spec(library) is None:
        return f"{library} is not installed ({install_hint(library)})"
    return None


def prefetch_options() -> ReadOptions:
    """The default read options with prefetching on (the zero-copy path's opt-in)."""
    return ReadOptions(prefetch=True)


def refused_copy(job: Job) -> Loaded:
    """The copy path with half the checkpoint's bytes of host memory available: it must be
    refused (`HostMemoryError`) before it allocates; the figures are those of the refusal."""
    budget = job.files("dit")[0].stat().st_size // 2
    try:
        dit(job, device=CPU, adopt=False, host_bytes=budget)
    except HostMemoryError:
        return Loaded(torch.empty(0), copied=0)
    raise RuntimeError("the copy path loaded with half the memory it needs: it was not refused")


@dataclass
class Loaded:
    """What a path produced, and where its bytes went (None: every byte was copied).

    Only the load itself is timed; the tensors are listed and counted after the clock stops.
    """

    result: nn.Module | torch.Tensor
    adopted: int = 0
    copied: int | None = None
    streamed: int = 0
    # For a loader that reports no fates: bytes whose storage is a map of one of these files
    # count as adopted, the rest as copied (read off /proc/self/maps after the clock stops).
    mapped_from: tuple[Path, ...] = ()
    # Seconds per step of a load that timed its steps (`LoadReport.steps`): build, read, place.
    steps: tuple[tuple[str, float], ...] = ()

    def tensors(self) -> list[torch.Tensor]:
        if isinstance(self.result, torch.Tensor):
            return [self.result]
        return module_tensors(self.result)


@dataclass(frozen=True)
class Job:
    """One run: which path, on which benchmark folder, timed or sampled, warm or cold."""

    path: str
    folder: Path
    mode: str = "time"
    warmup: Path | None = None
    threads: int | None = None  # torch's intra-op threads for the run; None keeps torch's default
    cache: str = "warm"  # the page-cache state the run starts from: "warm" or "cold"

    @functools.cached_property
    def shapes(self) -> Any:
        """The models' constructor arguments (`fakes/bench.py: BenchShapes`), read
        once."""
        from fakes.bench import BenchShapes

        return BenchShapes(**json.loads((self.folder / "shapes.json").read_text()))

    def checkpoint(self, model: str) -> Path:
        return self.folder / model / "model.safetensors"

    def files(self, model: str) -> tuple[Path, ...]:
        """The checkpoint files `model` ("dit", "vae", "ddit", "te", "pipe") is read from."""
        if model in (DIFFUSERS_FOLDER, TEXT_ENCODER_FOLDER, PIPELINE_FOLDER):
            return tuple(sorted((self.folder / model).glob("*/*.safetensors")))
        if model.startswith(f"{PIPELINE_FOLDER}_"):  # one component of the pipeline
            component = model.removeprefix(f"{PIPELINE_FOLDER}_")
            return tuple(sorted((self.folder / PIPELINE_FOLDER / component).glob("*.safetensors")))
        return (self.checkpoint(model),)


def module_tensors(module: nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer (persistent or not), each storage view once."""
    seen: dict[tuple[int, int], torch.Tensor] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        seen.setdefault((tensor.data_ptr(), tensor.nbytes), tensor)
    return list(seen.values())


def from_report(module: nn.Module, report: LoadReport) -> Loaded:
    return Loaded(
        module,
        adopted=report.adopted.bytes,
        copied=report.copied.bytes,
        streamed=report.streamed.bytes,
        steps=report.steps,
    )


def file_mapped_bytes(tensors: list[torch.Tensor], files: tuple[Path, ...]) -> int:
    """Bytes of `tensors` whose first byte lies in a memory map of one of `files`."""
    wanted = {os.fsencode(path.resolve()) for path in files}
    ranges = []
    with open("/proc/self/maps", "rb") as maps:  # bytes: a mapped path may be any bytes
        for line in maps:
            fields = line.rstrip(b"\n").split(maxsplit=5)
            if len(fields) == 6 and fields[5] in wanted:
                start, end = (int(part, 16) for part in fields[0].split(b"-"))
                ranges.append((start, end))
    return sum(
        t.nbytes
        for t in tensors
        if t.device.type == "cpu" and any(s <= t.data_ptr() < e for s, e in ranges)
    )


def read_all(tensors: list[torch.Tensor]) -> int:
    """Read every byte of every tensor once (a max over its bytes); returns a checksum.

    On one CPU thread: the read is memory-bound, and on a busy machine a thread pool adds
    milliseconds of waiting per tensor, which would be charged to many-tensor models.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return sum(
            int(t.detach().reshape(-1).view(torch.uint8).amax()) for t in tensors if t.numel()
        )
    finally:
        torch.set_num_threads(threads)


def dit(
    job: Job,
    *,
    device: torch.device,
    adopt: bool = True,
    reading: ReadOptions | None = None,
    host_bytes: int | None = None,
    direct: bool | None = None,
) -> Loaded:
    """The reference DiT loader, reading as `reading` says and with `host_bytes` of host memory
    (the loader's defaults: None); in direct mode (`direct`, by default for a device other than
    the CPU) through the staging reader onto `device`, else CPU-offloaded."""
    from fakes.layers import LINEAR_KINDS

    direct = device.type != "cpu" if direct is None else direct
    plan = (
        WeightLoadPlan(checkpoint_load_device=device, load_full_state_dict_on_device=True)
        if direct
        else WeightLoadPlan.for_component(
            checkpoint_load_device=CPU,
            needs_device_weight_postprocess=False,
            component_cpu_offload=True,
        )
    )
    module, report = load_dit(
        job.shapes.dit,
        job.checkpoint("dit"),
        plan=plan,
        kinds=LINEAR_KINDS,
        options=DiTOptions(adopt=adopt, reading=reading, host_bytes=host_bytes),
    )
    return from_report(module, report)


def diffusers_transformer(job: Job) -> Any:
    """The `transformer` component of the benchmark's diffusers pipeline (`ddit/`)."""
    from reference.request.model_index import read_pipeline

    return read_pipeline(job.folder / DIFFUSERS_FOLDER).component("transformer")


def ddit_zero_copy(job: Job) -> Loaded:
    """The reference's pipeline loader on a diffusers DiT under CPU offload (ZC-2b)."""
    from reference.load.loaders import TransformerLoader
    from reference.request.args import ServerArgs

    args = ServerArgs(runtime_device=CPU, dit_cpu_offload=True, dit_precision=torch.bfloat16)
    loaded = TransformerLoader().load(diffusers_transformer(job), args)
    return from_report(loaded.module, loaded.report)


def ddit_from_pretrained(job: Job) -> Loaded:
    """diffusers' own `from_pretrained` of the same folder, in the same precision (bf16)."""
    diffusers = importlib.import_module("diffusers")  # the [diffusers] extra; untyped
    spec = diffusers_transformer(job)
    cls = getattr(diffusers, spec.class_name)
    module: nn.Module = cls.from_pretrained(str(spec.folder), torch_dtype=torch.bfloat16)
    return Loaded(module, mapped_from=tuple(sorted(spec.folder.glob("*.safetensors"))))


def text_encoder(job: Job) -> Any:
    """The `text_encoder` component of the benchmark's text encoder pipeline (`te/`)."""
    from reference.request.model_index import read_pipeline

    return read_pipeline(job.folder / TEXT_ENCODER_FOLDER).component("text_encoder")


def te_zero_copy(job: Job) -> Loaded:
    """The reference's encoder loader on a bf16 UMT5 encoder under CPU offload, in its stored
    dtype (TE-1, TE-3: the default)."""
    from reference.load.loaders import EncoderLoader
    from reference.request.args import ServerArgs

    args = ServerArgs(runtime_device=CPU, component_cpu_offload={"text_encoder": True})
    loaded = EncoderLoader().load(text_encoder(job), args)
    return from_report(loaded.module, loaded.report)


def te_from_pretrained(job: Job) -> Loaded:
    """transformers' own `from_pretrained` of the same folder, in the same precision (bf16)."""
    transformers = importlib.import_module("transformers")  # the [diffusers] extra; untyped
    spec = text_encoder(job)
    cls = getattr(transformers, spec.class_name)
    module: nn.Module = cls.from_pretrained(str(spec.folder), torch_dtype=torch.bfloat16)
    return Loaded(module, mapped_from=tuple(sorted(spec.folder.glob("*.safetensors"))))


def pipeline(job: Job, **how: Any) -> Loaded:
    """The reference's load of the benchmark's Wan pipeline (`pipeline_rows.load_whole`)."""
    module, fates, seconds = pipeline_rows.load_whole(job.folder / PIPELINE_FOLDER, **how)
    return Loaded(
        module,
        adopted=fates["adopted"],
        copied=fates["copied"],
        streamed=fates["streamed"],
        steps=seconds,
    )


def pipeline_pretrained(job: Job) -> Loaded:
    """diffusers' `DiffusionPipeline.from_pretrained` of the same pipeline, in bf16."""
    folder = job.folder / PIPELINE_FOLDER
    module = pipeline_rows.pipeline_from_pretrained(folder)
    return Loaded(module, mapped_from=job.files(PIPELINE_FOLDER))


def _pipeline_paths() -> dict[str, PathSpec]:
    """The whole-pipeline rows (`reference.programs.bench.pipeline_rows`): the copy path warm
    and cold, the others warm (their targets are warm)."""

    def row(
        load: Callable[[Job, Any], Loaded],
        about: str,
        *,
        cold: bool = True,
        model: str = PIPELINE_FOLDER,
    ) -> PathSpec:
        caches = CACHES if cold else ("warm",)
        return PathSpec(load, about=about, model=model, library="diffusers", caches=caches)

    specs = {
        "pipe_copy": row(
            lambda job, _: pipeline(job),
            "reference whole Wan pipeline, copy path, components at once",
        ),
        "pipe_copy_sequential": row(
            lambda job, _: pipeline(job, concurrency=1),
            "the same, one component after another (concurrency=1)",
        ),
        "pipe_offload": row(
            lambda job, _: pipeline(job, offload=True),
            "reference whole Wan pipeline, DiT and text encoder CPU-offloaded (zero-copy)",
            cold=False,
        ),
        "pipe_offload_sequential": row(
            lambda job, _: pipeline(job, offload=True, concurrency=1),
            "the same, one component after another",
            cold=False,
        ),
        "pipe_pretrained": row(
            lambda job, _: pipeline_pretrained(job),
            "diffusers' DiffusionPipeline.from_pretrained(torch_dtype=bf16), same folder",
            cold=False,
        ),
    }
    for name in pipeline_rows.COMPONENTS:
        specs[f"pipe_copy_{name}"] = row(
            functools.partial(_component_alone, name),
            f"the same pipeline's {name} alone, copy path",
            model=f"{PIPELINE_FOLDER}_{name}",
        )
    return specs


def _component_alone(name: str, job: Job, _: Any) -> Loaded:
    return pipeline(job, components=(name,))


def built(build: Callable[[], nn.Module]) -> Loaded:
    """A construction alone (`reference.programs.bench.construction`): its module is on meta,
    so no byte is counted and none is read after the clock stops."""
    build()
    return Loaded(torch.empty(0), copied=0)


def vae_stream(job: Job, *, device: torch.device, reading: ReadOptions | None = None) -> Loaded:
    module, report = load_vae(
        job.shapes.vae, job.checkpoint("vae"), device=device, options=VAEOptions(reading=reading)
    )
    return from_report(module, report)


def full_state(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a file read into private memory: the "full CPU state dict".

    safetensors >= 0.8 `load_file` returns views of a memory map by default; its "pread"
    backend reads the bytes instead. Without that backend each tensor is cloned as it is taken.
    """
    from safetensors.torch import load_file

    if "backend" in inspect.signature(load_file).parameters:
        return load_file(path, backend="pread")
    state = load_file(path)  # pragma: no cover - safetensors < 0.8
    return {name: state.pop(name).clone() for name in list(state)}  # pragma: no cover


def state_dict_load(job: Job, model: str, *, assign: bool, full: bool = False) -> Loaded:
    """A state dict from safetensors, then `load_state_dict` (`assign` on a meta-built module).

    `full` reads the whole state into private memory first (`full_state`); otherwise the state
    dict is what `safetensors.torch.load_file` returns by default. The module is built without
    initialisation (on meta, then `to_empty` unless `assign`), so only loading is timed.
    """
    from safetensors.torch import load_file

    with torch.device("meta"):
        module = getattr(job.shapes, model)()
    if not assign:
        module = module.to_empty(device=CPU)
    path = job.checkpoint(model)
    state = full_state(path) if full else load_file(path)
    module.load_state_dict(state, assign=assign)
    del state
    return Loaded(module)


def pinned_host(job: Job) -> torch.Tensor:
    path = job.checkpoint("dit")
    pinned = torch.empty(path.stat().st_size, dtype=torch.uint8, pin_memory=True)
    view = memoryview((ctypes.c_char * pinned.nbytes).from_address(pinned.data_ptr())).cast("B")
    with path.open("rb", buffering=0) as f:
        f.readinto(view)
    return pinned


def pinned_h2d(job: Job, pinned: torch.Tensor) -> Loaded:
    """The machine's host-to-device limit: one copy of the same bytes from pinned memory."""
    device = torch.empty(pinned.nbytes, dtype=torch.uint8, device=CUDA)
    device.copy_(pinned, non_blocking=True)
    return Loaded(device)


@dataclass(frozen=True)
class PathSpec:
    """A measured path: its load, whether it needs CUDA, and its untimed setup."""

    load: Callable[[Job, Any], Loaded]
    model: str = "dit"  # whose checkpoint: "dit", "vae", "ddit" (diffusers DiT), "te" (UMT5)
    cuda: bool = False
    library: str | None = None  # an optional library the path needs ("diffusers")
    setup: Callable[[Job], Any] = lambda job: None
    about: str = ""
    caches: tuple[str, ...] = CACHES  # the page-cache states it is measured in
    limit: bool = False  # a read limit: its bytes are the whole file's, and it competes for best


def limit_paths() -> dict[str, PathSpec]:
    """`readinto`, then `preadv_N` and `map_copy_N` for each N of `limits.thread_counts()`."""
    specs = {
        "readinto": PathSpec(
            lambda job, _: Loaded(limits.readinto(job.checkpoint("dit"))),
            about="limit: one readinto, fresh buffer",
            limit=True,
        )
    }
    for n in limits.thread_counts():
        specs[f"preadv_{n}"] = PathSpec(
            _threaded(limits.preadv, n),
            about=f"limit: os.preadv on {_threads(n)}, a share each, fresh buffer",
            limit=True,
        )
    for n in limits.thread_counts():
        specs[f"map_copy_{n}"] = PathSpec(
            _threaded(limits.map_copy, n),
            about=f"limit: copy_ from a private map on {_threads(n)}, a share each, fresh buffer",
            caches=("warm",),
            limit=True,
        )
    return specs


def _threads(n: int) -> str:
    return "1 thread" if n == 1 else f"{n} threads"


def _threaded(
    read: Callable[[Path, int], torch.Tensor], threads: int
) -> Callable[[Job, Any], Loaded]:
    def load(job: Job, _: Any) -> Loaded:
        return Loaded(read(job.checkpoint("dit"), threads))

    return load


PATHS: dict[str, PathSpec] = {
    "dit_zero_copy": PathSpec(
        lambda job, _: dit(job, device=CPU), about="reference DiT, CPU offload (zero-copy)"
    ),
    "dit_zero_copy_prefetch": PathSpec(
        lambda job, options: dit(job, device=CPU, reading=options),
        setup=lambda job: prefetch_options(),
        about="reference DiT, CPU offload (zero-copy), ReadOptions(prefetch=True)",
    ),
    "dit_copy": PathSpec(
        lambda job, options: dit(job, device=CPU, adopt=False, reading=options),
        setup=lambda job: ReadOptions(workers=0),
        about="reference DiT, copy path (adoption disabled) from the file's map, workers=0",
    ),
    "dit_copy_pool": PathSpec(
        lambda job, _: dit(job, device=CPU, adopt=False),
        about="reference DiT, copy path through the reader pool (its default, ReadOptions())",
    ),
    "dit_copy_refused": PathSpec(
        lambda job, _: refused_copy(job),
        caches=("warm",),
        about="reference DiT, copy path, half its bytes of host memory: refused",
    ),
    "dit_direct": PathSpec(
        lambda job, _: dit(job, device=CUDA), cuda=True, about="reference DiT, direct to CUDA"
    ),
    "dit_direct_cpu": PathSpec(
        lambda job, _: dit(job, device=CPU, direct=True),
        about="reference DiT, direct mode onto the CPU: the staging reader, the CPU engine",
    ),
    "vae_stream": PathSpec(
        lambda job, _: vae_stream(job, device=CPU),
        model="vae",
        about="reference VAE streaming to CPU",
    ),
    "vae_stream_pool": PathSpec(
        lambda job, options: vae_stream(job, device=CPU, reading=options),
        model="vae",
        setup=lambda job: ReadOptions(),
        about="reference VAE streaming to CPU through the reader pool, ReadOptions()",
    ),
    "vae_stream_cuda": PathSpec(
        lambda job, _: vae_stream(job, device=CUDA),
        model="vae",
        cuda=True,
        about="reference VAE streaming to CUDA",
    ),
    "vae_ordinary": PathSpec(
        lambda job, _: state_dict_load(job, "vae", assign=False, full=True),
        model="vae",
        about="VAE the ordinary way: full CPU state dict (pread), then load_state_dict",
    ),
    "load_file": PathSpec(
        lambda job, _: state_dict_load(job, "dit", assign=False),
        about="DiT baseline: load_file + load_state_dict",
    ),
    "load_file_assign": PathSpec(
        lambda job, _: state_dict_load(job, "dit", assign=True),
        about="DiT baseline: load_file + load_state_dict(assign=True) on meta",
    ),
    "ddit_zero_copy": PathSpec(
        lambda job, _: ddit_zero_copy(job),
        model="ddit",
        library="diffusers",
        about="reference pipeline loader, diffusers Wan DiT, CPU offload (zero-copy)",
    ),
    "wan14b_guarded": PathSpec(
        lambda job, _: built(construction.guarded_build),
        model="ddit",
        library="diffusers",
        caches=("warm",),  # it reads no file
        about="Wan2.1-T2V-14B DiT config, meta build as the reference builds it, guarded",
    ),
    "wan14b_unguarded": PathSpec(
        lambda job, _: built(construction.unguarded_build),
        model="ddit",
        library="diffusers",
        caches=("warm",),
        about="the same meta build without the construction guard",
    ),
    "ddit_pretrained": PathSpec(
        lambda job, _: ddit_from_pretrained(job),
        model="ddit",
        library="diffusers",
        about="diffusers' from_pretrained of the same Wan DiT",
    ),
    "te_zero_copy": PathSpec(
        lambda job, _: te_zero_copy(job),
        model=TEXT_ENCODER_FOLDER,
        library="transformers",
        about="reference encoder loader, bf16 UMT5 text encoder, CPU offload (zero-copy)",
    ),
    "te_pretrained": PathSpec(
        lambda job, _: te_from_pretrained(job),
        model=TEXT_ENCODER_FOLDER,
        library="transformers",
        about="transformers' from_pretrained of the same UMT5 encoder (torch_dtype=bf16)",
    ),
    **_pipeline_paths(),
    **limit_paths(),
    "pinned_h2d": PathSpec(
        pinned_h2d,
        cuda=True,
        setup=pinned_host,
        about="limit: pinned host-to-device copy",
        caches=("warm",),  # it reads no file while timed
    ),
}


def synchronize(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def start_cache(job: Job, files: tuple[Path, ...]) -> dict[str, Any]:
    """Put `files` into the job's page-cache state; {"cached": fraction}, or {"skipped": why}
    when a cold start was asked for and the pages could not be dropped."""
    # A loaded module can sit in a reference cycle that holds a map of the file until the next
    # collection (a warm-up's, or an earlier run's in the same process): mapped pages stay.
    gc.collect()
    return start_state(files, job.cache)


def run(job: Job) -> dict[str, Any]:
    """Measure one path once in this process; the result's fields are documented in bench.py."""
    spec = PATHS[job.path]
    if spec.cuda:
        torch.empty(1, device=CUDA)  # the CUDA context is not part of any load
    if job.threads is not None:
        torch.set_num_threads(job.threads)
    torch.zeros(1 << 16).sum()  # start the CPU thread pool before the clock
    if job.warmup is not None:
        small = Job(job.path, job.warmup)
        spec.load(small, spec.setup(small)).tensors()
        synchronize(spec.cuda)
    job.shapes  # noqa: B018 - read the shapes before the clock
    state = spec.setup(job)
    result: dict[str, Any] = {"path": job.path, "mode": job.mode, "cache": job.cache}
    result |= start_cache(job, job.files(spec.model))
    if "skipped" in result:
        return result
    device_start = 0
    if spec.cuda:
        torch.cuda.reset_peak_memory_stats(CUDA)
        device_start = torch.cuda.memory_allocated(CUDA)
    start = resident()
    if job.mode == "memory":
        with PeakSampler() as during_load:
            loaded = spec.load(job, state)
            synchronize(spec.cuda)
        end = resident()
        tensors = loaded.tensors()
        with PeakSampler() as during_read:
            read_all(tensors)
            synchronize(spec.cuda)
        result |= {
            "anon_peak": during_load.peak.anon - start.anon,
            "file_peak": during_load.peak.file - start.file,
            "anon_end": end.anon - start.anon,
            "file_end": end.file - start.file,
            "anon_peak_read": max(during_load.peak.anon, during_read.peak.anon) - start.anon,
            "file_peak_read": max(during_load.peak.file, during_read.peak.file) - start.file,
        }
        if spec.cuda:
            result["device_peak"] = torch.cuda.max_memory_allocated(CUDA) - device_start
    else:
        cpu, began = time.process_time(), time.perf_counter()
        loaded = spec.load(job, state)
        synchronize(spec.cuda)
        loaded_at, cpu_used = time.perf_counter(), time.process_time() - cpu
        tensors = loaded.tensors()
        read_began = time.perf_counter()
        read_all(tensors)
        synchronize(spec.cuda)
        result |= {
            "load_s": loaded_at - began,
            # the load, then one read of every byte: for a lazily mapped state (adoption,
            # load_file_assign) the time until every byte is resident in this process
            "resident_s": loaded_at - began + time.perf_counter() - read_began,
            "load_cpu_s": cpu_used,
        }
        # the load's own steps, timed only here: a sampler thread would be charged to them
        result |= {f"{step}_s": seconds for step, seconds in loaded.steps}
    total = sum(t.nbytes for t in tensors)
    host = sum(t.nbytes for t in tensors if t.device.type == "cpu")
    if loaded.mapped_from:
        loaded.adopted = file_mapped_bytes(tensors, loaded.mapped_from)
        loaded.copied = total - loaded.adopted
    result |= {
        "adopted": loaded.adopted,
        "copied": total if loaded.copied is None else loaded.copied,
        "streamed": loaded.streamed,
        # the loaded state held in this process's private memory (adopted bytes are the file's)
        "host_anon_bytes": host - loaded.adopted,
    }
    return result
