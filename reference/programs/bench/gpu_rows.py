"""The GPU table's rows: one function per row, each taking the device, and one measured run.

    python -m reference.programs.bench.gpu_rows JOB_JSON [JOB_JSON ...]

runs each job (`GpuJob`, as JSON) in this process, in order, and prints one JSON line per job.
The GPU table (`reference.programs.bench.gpu`) spawns a fresh interpreter per job (the limit
rows, which map no file and keep no state, share one per repetition), so no CUDA state is
inherited and none is forked. The same functions run with the device "cpu" in the tests.

Kinds of row:
    reference  the reference's own loads onto the device: the bench's DiT (`dit_direct`), the
               Wan2.1-T2V-1.3B DiT through the DiT component loader (`wan_direct`), both in
               direct mode, and the bench's VAE streamed (`vae_stream`)
    peer       other loaders reading the same files onto the device
    limit      the machine's file-to-device limits (`reference.programs.bench.gpu_limits`)
    h2d        the copy engine alone (pinned host buffer to device)

A run: the CUDA context first; one unmeasured load of the warm-up folder (first calls, the
caching allocators' first blocks); the row's setup; the files put into the job's page-cache
state (`reference.programs.bench.cache`); then the load, timed or sampled for host memory
(`reference.report.memory.PeakSampler`), with `torch.cuda.max_memory_allocated` reset before
it. Figures (bytes are growth over the state before the load):
    cached       fraction of the row's file pages cached when the clock started
    load_s       wall time until every byte is on the device (the device synchronised)
    load_cpu_s   CPU time of the load (timed runs)
    device_peak  peak bytes allocated through torch on the device (CUDA); an allocator of a
                 library's own is not seen
    anon_peak, anon_end
                 peak and final anonymous host memory (sampled runs)
    device_bytes, host_bytes
                 bytes of the loaded tensors on the device, and left on the host
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reference.extras import install_hint
from reference.load.dit import load_dit
from reference.load.vae import load_vae
from reference.programs.bench import gpu_limits
from reference.programs.bench.cache import (
    CACHES,
    start_state,
)
from reference.programs.bench.paths import module_tensors
from reference.report.memory import PeakSampler, resident
from reference.request.plan import WeightLoadPlan

__all__ = [
    "GPU_ROWS",
    "KINDS",
    "LIMIT_MODEL",
    "MODES",
    "PEERS_EXTRA",
    "GpuJob",
    "GpuRow",
    "Landed",
    "RowSkipped",
    "as_request",
    "files_of",
    "job_of",
    "main",
    "run_row",
    "unavailable",
]

MODES = ("time", "memory")
KINDS = ("reference", "peer", "limit", "h2d")
LIMIT_MODEL = "limit"
"""Whose files the limit rows read: see `files_of`."""
PEERS_EXTRA = "peers"
"""The optional extra that installs the peer loaders (fastsafetensors, InstantTensor)."""


class RowSkipped(Exception):
    """A row's setup found it cannot run here; the message says why."""


@dataclass(frozen=True, kw_only=True)
class GpuJob:
    """One run of one row: the benchmark folder, the device, timed or sampled, warm or cold,
    and the warm-up folder loaded first (unmeasured)."""

    row: str
    folder: Path
    device: str = "cuda:0"
    mode: str = "time"
    cache: str = "warm"
    warmup: Path | None = None

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)


def job_of(request: dict[str, Any]) -> GpuJob:
    """The job a JSON request names (the fields of `GpuJob`; paths as strings)."""
    warmup = request.get("warmup")
    return GpuJob(
        row=request["row"],
        folder=Path(request["folder"]),
        device=request.get("device", "cuda:0"),
        mode=request.get("mode", "time"),
        cache=request.get("cache", "warm"),
        warmup=Path(warmup) if warmup else None,
    )


@dataclass(frozen=True)
class Landed:
    """What a row loaded: its tensors, a note on how (shown in the table), and what to call once
    they are counted (a library's buffer to free)."""

    tensors: tuple[torch.Tensor, ...]
    note: str = ""
    close: Callable[[], None] = field(default=lambda: None)

    @classmethod
    def of(
        cls, loaded: nn.Module | Mapping[str, torch.Tensor] | torch.Tensor, note: str = ""
    ) -> Landed:
        """A module's parameters and buffers, a state dict's tensors, or one tensor."""
        if isinstance(loaded, nn.Module):
            return cls(tuple(module_tensors(loaded)), note)
        if isinstance(loaded, torch.Tensor):
            return cls((loaded,), note)
        return cls(tuple(loaded.values()), note)


def files_of(folder: Path, model: str) -> tuple[Path, ...]:
    """The checkpoint files of `model` ("dit", "vae": the bench's; "wan": the diffusers DiT;
    "limit": what the limit rows read, the Wan DiT's files where they were written, else the
    bench's DiT)."""
    wan = tuple(sorted((folder / "wan" / "transformer").glob("*.safetensors")))
    if model == "wan" or (model == LIMIT_MODEL and wan):
        return wan
    return (folder / ("dit" if model == LIMIT_MODEL else model) / "model.safetensors",)


def _shapes(folder: Path) -> Any:
    from fakes.bench import BenchShapes

    return BenchShapes(**json.loads((folder / "shapes.json").read_text()))


# --- reference rows ------------------------------------------------------------------------------


def dit_direct(folder: Path, device: torch.device, _: Any) -> Landed:
    """The reference DiT loader on the bench's DiT, direct mode: read straight onto `device`."""
    from fakes.layers import LINEAR_KINDS

    plan = WeightLoadPlan(checkpoint_load_device=device, load_full_state_dict_on_device=True)
    module, _report = load_dit(
        _shapes(folder).dit, files_of(folder, "dit")[0], plan=plan, kinds=LINEAR_KINDS
    )
    return Landed.of(module)


def wan_direct(folder: Path, device: torch.device, _: Any) -> Landed:
    """The reference's DiT component loader (`TransformerLoader`, the one `load_pipeline` runs)
    on the Wan DiT with `direct_gpu_weight_loading`, runtime device `device`, bf16.

    The loader's own gate admits direct mode on any runtime device; the pipeline's arguments
    gate would refuse it off CUDA (DG-2), so the CPU tests reach the same path through here."""
    from reference.load.loaders import TransformerLoader
    from reference.request.args import ServerArgs
    from reference.request.model_index import read_pipeline

    spec = read_pipeline(folder / "wan").component("transformer")
    args = ServerArgs(
        runtime_device=device, direct_gpu_weight_loading=True, dit_precision=torch.bfloat16
    )
    return Landed.of(TransformerLoader().load(spec, args).module)


def vae_stream(folder: Path, device: torch.device, _: Any) -> Landed:
    """The reference VAE loader streaming the bench's VAE onto `device` (built on meta)."""
    module, _report = load_vae(_shapes(folder).vae, files_of(folder, "vae")[0], device=device)
    return Landed.of(module)


# --- peers ---------------------------------------------------------------------------------------


def load_file_peer(model: str) -> Callable[[Path, torch.device, Any], Landed]:
    def load(folder: Path, device: torch.device, _: Any) -> Landed:
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for path in files_of(folder, model):
            state |= load_file(path, device=str(device))
        return Landed.of(state)

    return load


def wan_from_pretrained(folder: Path, device: torch.device, _: Any) -> Landed:
    """diffusers' own `from_pretrained(torch_dtype=bf16, device_map=<device>)`; where this
    diffusers refuses a device map, `from_pretrained` onto the CPU, then `.to(device)` (the
    note says which ran)."""
    diffusers = importlib.import_module("diffusers")  # the [diffusers] extra; untyped
    cls = diffusers.WanTransformer3DModel
    where = str(folder / "wan" / "transformer")
    try:
        module = cls.from_pretrained(where, torch_dtype=torch.bfloat16, device_map=str(device))
        note = f"device_map={device}"
    except (TypeError, ValueError, NotImplementedError):
        module = cls.from_pretrained(where, torch_dtype=torch.bfloat16).to(device)
        note = f".to({device})"
    return Landed.of(module, note)


def fastsafetensors_peer(model: str) -> Callable[[Path, torch.device, Any], Landed]:
    def load(folder: Path, device: torch.device, _: Any) -> Landed:
        fst = importlib.import_module("fastsafetensors")  # the [peers] extra; untyped
        loader = fst.SafeTensorsFileLoader(fst.SingleGroup(), device, nogds=True)
        loader.add_filenames({0: [str(path) for path in files_of(folder, model)]})
        buffer = loader.copy_files_to_device()
        tensors = tuple(buffer.get_tensor(name) for name in loader.get_keys())

        def close() -> None:
            buffer.close()
            loader.close()

        # its tensors are views of its device buffer, which close() frees
        return Landed(tensors, "nogds=True, views of its buffer", close)

    return load


def instanttensor_peer(model: str) -> Callable[[Path, torch.device, Any], Landed]:
    def load(folder: Path, device: torch.device, _: Any) -> Landed:
        instanttensor = importlib.import_module("instanttensor")  # the [peers] extra; untyped
        state: dict[str, torch.Tensor] = {}
        for path in files_of(folder, model):
            with instanttensor.safe_open(str(path), framework="pt", device=device.index or 0) as f:
                # its tensors live in a buffer it reuses: its documented use clones each
                state |= {name: tensor.clone() for name, tensor in f.tensors()}
        return Landed.of(state, "safe_open + clone")

    return load


# --- limits --------------------------------------------------------------------------------------


def staged_limit(threads: int, *, direct_io: bool) -> Callable[[Path, torch.device, Any], Landed]:
    def load(folder: Path, device: torch.device, stages: Any) -> Landed:
        files = files_of(folder, LIMIT_MODEL)
        return Landed.of(gpu_limits.staged(files, stages, device, direct_io=direct_io))

    return load


def staged_setup(threads: int, *, direct_io: bool) -> Callable[[Path, torch.device], Any]:
    def setup(folder: Path, device: torch.device) -> gpu_limits.Stages:
        if direct_io:
            reason = gpu_limits.direct_io_refused(files_of(folder, LIMIT_MODEL)[0])
            if reason is not None:
                raise RowSkipped(reason)
        return gpu_limits.Stages.make(threads, device)

    return setup


def pinned_setup(folder: Path, device: torch.device) -> torch.Tensor:
    return gpu_limits.read_pinned(files_of(folder, LIMIT_MODEL), device)


def pinned_h2d(folder: Path, device: torch.device, host: Any) -> Landed:
    return Landed.of(gpu_limits.host_to_device(host, device))


# --- the table -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GpuRow:
    """A row of the GPU table: its load, whose files it reads, its kind, and where it runs."""

    load: Callable[[Path, torch.device, Any], Landed]
    model: str  # "dit", "vae" (the bench's), "wan" (Wan2.1-T2V-1.3B), "limit" (`files_of`)
    kind: str  # one of KINDS
    about: str
    setup: Callable[[Path, torch.device], Any] = lambda folder, device: None
    library: str | None = None  # an optional library it needs
    cuda_only: bool = False  # it cannot run on the CPU at all
    caches: tuple[str, ...] = CACHES
    modes: tuple[str, ...] = MODES  # sampled runs (memory) go in the first of `caches` only
    # Its runs may share one fresh process with other such runs: it maps no file and leaves
    # nothing behind but blocks the allocators reuse (the limits); every other run gets its own.
    shares_process: bool = False


def _rows() -> dict[str, GpuRow]:
    rows = {
        "dit_direct": GpuRow(
            load=dit_direct,
            model="dit",
            kind="reference",
            about="reference DiT loader, the bench's DiT, direct mode",
        ),
        "wan_direct": GpuRow(
            load=wan_direct,
            model="wan",
            kind="reference",
            library="diffusers",
            about="reference DiT component loader, Wan2.1-T2V-1.3B, direct mode, bf16",
        ),
        "vae_stream": GpuRow(
            load=vae_stream,
            model="vae",
            kind="reference",
            about="reference VAE streaming onto the device",
        ),
    }
    for model in ("dit", "wan"):
        rows[f"{model}_load_file"] = GpuRow(
            load=load_file_peer(model),
            model=model,
            kind="peer",
            about="safetensors.torch.load_file(device=<device>)",
        )
    rows["wan_from_pretrained"] = GpuRow(
        load=wan_from_pretrained,
        model="wan",
        kind="peer",
        library="diffusers",
        about="diffusers WanTransformer3DModel.from_pretrained(torch_dtype=bf16, device_map)",
    )
    for model in ("dit", "wan"):
        rows[f"{model}_fastsafetensors"] = GpuRow(
            load=fastsafetensors_peer(model),
            model=model,
            kind="peer",
            library="fastsafetensors",
            about="fastsafetensors SafeTensorsFileLoader(nogds=True).copy_files_to_device()",
        )
        rows[f"{model}_instanttensor"] = GpuRow(
            load=instanttensor_peer(model),
            model=model,
            kind="peer",
            library="instanttensor",
            cuda_only=True,
            about="InstantTensor safe_open(device=<index>), each tensor cloned",
        )
    for n in gpu_limits.thread_ladder():
        rows[f"staged_{n}"] = GpuRow(
            load=staged_limit(n, direct_io=False),
            setup=staged_setup(n, direct_io=False),
            model=LIMIT_MODEL,
            kind="limit",
            modes=("time",),
            shares_process=True,
            about=f"limit: files -> pinned staging -> device, {n} reader threads, buffered",
        )
    for n in gpu_limits.thread_ladder():
        rows[f"staged_direct_{n}"] = GpuRow(
            load=staged_limit(n, direct_io=True),
            setup=staged_setup(n, direct_io=True),
            model=LIMIT_MODEL,
            kind="limit",
            modes=("time",),
            shares_process=True,
            caches=("cold",),  # O_DIRECT bypasses the page cache: every run is a cold read
            about=f"limit: the same, {n} reader threads, O_DIRECT",
        )
    rows["pinned_h2d"] = GpuRow(
        load=pinned_h2d,
        setup=pinned_setup,
        model=LIMIT_MODEL,
        kind="h2d",
        modes=("time",),
        shares_process=True,
        caches=("warm",),  # it reads no file while timed
        about="limit: the limit files' bytes from one pinned host buffer to the device, one copy",
    )
    return rows


GPU_ROWS: dict[str, GpuRow] = _rows()


def unavailable(row: GpuRow, device: torch.device) -> str | None:
    """Why `row` cannot run on `device` here (a missing library, a CUDA-only row), or None."""
    if row.cuda_only and device.type != "cuda":
        return f"{row.library or 'it'} loads onto CUDA devices only"
    if row.library is not None and importlib.util.find_spec(row.library) is None:
        extra = "diffusers" if row.library == "diffusers" else PEERS_EXTRA
        return f"{row.library} is not installed ({install_hint(extra)})"
    return None


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _start_cache(files: tuple[Path, ...], cache: str, *, cuda: bool) -> dict[str, Any]:
    if cache == "cold" or cuda:
        # the warm-up's modules sit in reference cycles: their maps of a file would keep its
        # pages, their device blocks would stay out of the allocator's reach
        gc.collect()
    return start_state(files, cache)


def run_row(job: GpuJob) -> dict[str, Any]:
    """Measure one row once in this process (see the module's docstring for the figures)."""
    row = GPU_ROWS[job.row]
    device = job.torch_device
    cuda = device.type == "cuda"
    result: dict[str, Any] = {"row": job.row, "mode": job.mode, "cache": job.cache}
    if cuda:
        torch.empty(1, device=device)  # the CUDA context is not part of any load
        result["device_name"] = torch.cuda.get_device_name(device)
    try:
        if job.warmup is not None:
            small = row.load(job.warmup, device, row.setup(job.warmup, device))
            _synchronize(device)
            small.close()
            del small
        state = row.setup(job.folder, device)
    except RowSkipped as skipped:
        return result | {"skipped": str(skipped)}
    result |= _start_cache(files_of(job.folder, row.model), job.cache, cuda=cuda)
    if "skipped" in result:
        return result
    device_start = 0
    if cuda:
        torch.cuda.empty_cache()  # the warm-up's blocks, collected by _start_cache
        torch.cuda.reset_peak_memory_stats(device)
        device_start = torch.cuda.memory_allocated(device)
    start = resident()
    if job.mode == "memory":
        with PeakSampler() as sampler:
            landed = row.load(job.folder, device, state)
            _synchronize(device)
        result |= {
            "anon_peak": sampler.peak.anon - start.anon,
            "anon_end": resident().anon - start.anon,
        }
    else:
        cpu, began = time.process_time(), time.perf_counter()
        landed = row.load(job.folder, device, state)
        _synchronize(device)
        result |= {"load_s": time.perf_counter() - began, "load_cpu_s": time.process_time() - cpu}
    if cuda:
        result["device_peak"] = torch.cuda.max_memory_allocated(device) - device_start
    result["device_bytes"] = sum(t.nbytes for t in landed.tensors if t.device == device)
    result["host_bytes"] = sum(t.nbytes for t in landed.tensors if t.device.type == "cpu")
    if landed.note:
        result["note"] = landed.note
    landed.close()
    return result


def main(argv: list[str]) -> int:
    """Run the jobs `argv` (one JSON request each) in order in this process, printing one JSON
    line per job; a job that fails prints {"row", "error": traceback} and the next one runs.
    Exits 1 when a job failed, else 0."""
    failed = False
    for text in argv:
        request = json.loads(text)
        try:
            line = json.dumps(run_row(job_of(request)))
        except Exception:
            line = json.dumps({"row": request.get("row"), "error": traceback.format_exc()})
            failed = True
        print(line, flush=True)
    return 1 if failed else 0


def as_request(job: GpuJob) -> dict[str, Any]:
    """`job` as the JSON request `job_of` reads back."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(job).items()}


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
