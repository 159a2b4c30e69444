"""`python -m reference bench`: peak memory and time of every loading path, side by side.

    python -m reference bench [--size-mib N] [--sizes 64,256,...] [--reps R] [--threads T]
                              [--cache warm|cold|both] [--json PATH] [--plot PATH]
    python -m reference bench --gpu [--size-mib N] [--reps R] [--cache ...] [--json PATH]

`--gpu` runs only the GPU table (`reference.programs.bench.gpu`); the rest of this docstring is
the CPU table's.

For each size, a DiT and a VAE checkpoint of about N MiB are written into a temporary folder
(outside every measured run). Each path of `reference.programs.bench.paths.PATHS` then runs R times
timed and R times sampled for memory in each page-cache state (warm: its files read just before the
run; cold: their pages dropped just before it, `reference.programs.bench.cache`), each run in a
fresh process; the figures are medians per (path, cache). The ratios the project's performance
claims rest on are computed from them and checked against their targets
(`reference.programs.bench.ratios`). Linux only: memory is read from /proc/self/status.

The default run (512 MiB, 5 repetitions, both caches: about 300 runs) took 3 min 43 s on the
2 vCPUs this was written on, with other work sharing them (load average 4.3 before, 5.6 after);
`--cache warm --reps 1` is the quick look.

Figures per (path, cache) (bytes are growth over the process's state before the load):
    cached: fraction of the path's checkpoint pages in the page cache when the clock started
    load_s: wall time of the load
    resident_s: wall time of the load followed by one read of every loaded byte; for the lazy
        paths (adoption, load_file_assign) that is the time until every byte is resident
    load_cpu_s: CPU time of the load (all threads; steadier than wall time on a busy machine)
    open_s, build_s, read_s, place_s, finish_s: the reference DiT load's own steps (timed runs;
        `reference.report.steps`): build on meta with its guard, the reader made and waited on,
        the rest of placing the tensors
    anon_peak, file_peak: peak anonymous / file-backed resident memory during the load
    anon_end, file_end: the same right after the load
    anon_peak_read, file_peak_read: the peaks through the load and the read
    device_peak: peak CUDA memory allocated during the load (CUDA paths)
    adopted, copied, streamed: bytes by fate; host_anon_bytes: the loaded state in private memory
    throughput: the path's bytes (a limit's: the whole file's) over load_s
The `best_read` row is, per cache state, the fastest limit row (`reference.programs.bench.limits`),
named in its `of` field; the ratios divide by it. A (path, cache) that could not run holds
`skipped`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from reference.extras import install_hint
from reference.programs.bench.cache import CACHES
from reference.programs.bench.facts import checkpoint_facts, write_bench_models
from reference.programs.bench.paths import (
    DIFFUSERS_FOLDER,
    PATHS,
    PIPELINE_FOLDER,
    TEXT_ENCODER_FOLDER,
    PathSpec,
    library_missing,
)
from reference.programs.bench.ratios import compute_ratios
from reference.read.reading import ReadOptions
from reference.request.platform import SYSTEM, Platform, describe

__all__ = [
    "BEST_READ",
    "CACHE_CHOICES",
    "DEFAULT_REPS",
    "DEFAULT_SIZE_MIB",
    "MIB",
    "PRESSURE_COUNTERS",
    "WARMUP_MIB",
    "Runner",
    "ServerRunner",
    "bench_command",
    "best_read",
    "checkpoint_facts",
    "machine",
    "measure_size",
    "median_figures",
    "parse_sizes",
    "pressure_counters",
    "run_bench",
    "tensors_in_flight",
    "unavailable",
    "write_folder",
]

MIB = 1024 * 1024
DEFAULT_SIZE_MIB = 512
DEFAULT_REPS = 5
# Each run first loads checkpoints of this size through its path, unmeasured (see
# reference.programs.bench.paths).
WARMUP_MIB = 1
Runner = Callable[[dict[str, Any]], dict[str, Any]]
BEST_READ = "best_read"
CACHE_CHOICES = {"warm": ("warm",), "cold": ("cold",), "both": CACHES}


def write_folder(folder: Path, size_mib: int) -> dict[str, Any]:
    """Write the DiT and VAE checkpoints of one size and describe them; with diffusers
    installed, also a diffusers Wan DiT of about the same size (`ddit`); with transformers, a
    UMT5 text encoder of about the same size (`te`)."""
    from fakes.bench import write_diffusers_bench, write_pipeline_bench, write_text_encoder_bench

    facts = write_bench_models(folder, size_mib)
    if library_missing("diffusers") is None:
        ddit = write_diffusers_bench(folder / DIFFUSERS_FOLDER, size_mib * MIB)
        facts["ddit"] = checkpoint_facts(ddit)
    if library_missing("transformers") is None:
        te = write_text_encoder_bench(folder / TEXT_ENCODER_FOLDER, size_mib * MIB)
        facts["te"] = checkpoint_facts(te)
        if library_missing("diffusers") is None:
            pipe = pipeline_facts(write_pipeline_bench(folder / PIPELINE_FOLDER, size_mib * MIB))
            facts[PIPELINE_FOLDER] = pipe
            for name, part in pipe["components"].items():
                facts[f"{PIPELINE_FOLDER}_{name}"] = part
    return facts


def pipeline_facts(root: Path) -> dict[str, Any]:
    """The bench pipeline's bytes (file and tensor bytes of every component), and each
    component's."""
    parts = {
        folder.name: checkpoint_facts(folder)
        for folder in sorted(root.iterdir())
        if any(folder.glob("*.safetensors"))
    }
    totals = {
        key: sum(int(part[key]) for part in parts.values()) for key in ("bytes", "file_bytes")
    }
    return totals | {"components": parts}


def unavailable(
    spec: PathSpec, no_cuda: str | None, facts: Mapping[str, Any] | None = None
) -> str | None:
    """Why a path cannot run here (no CUDA, a missing library or module, its model's folder
    not written: the pipeline needs diffusers and transformers), or None."""
    if spec.cuda and no_cuda is not None:
        return no_cuda
    missing = library_missing(spec.library)
    if missing is None and facts is not None and spec.model not in facts:
        missing = library_missing("transformers") or f"{spec.model}/ was not written"
    return missing


def tensors_in_flight() -> int:
    """K, the tensors the reader pool holds at once by default (`ReadOptions().max_tensors`)."""
    return ReadOptions().max_tensors


def best_read(paths: Mapping[str, Mapping[str, Any]], cache: str) -> dict[str, Any] | None:
    """The fastest measured limit row in `cache` (its figures, and its name as `of`), or None."""
    measured = {
        name: figures[cache]
        for name, figures in paths.items()
        if figures.get("limit") and "throughput" in figures.get(cache, {})
    }
    if not measured:
        return None
    name = max(measured, key=lambda n: measured[n]["throughput"])
    return {k: v for k, v in measured[name].items() if k != "runs"} | {"of": name}


def median_figures(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    keys = {k for run in runs for k, v in run.items() if isinstance(v, (int, float))}
    return {k: statistics.median(r[k] for r in runs if k in r) for k in sorted(keys)}


class ServerRunner:
    """One `python -m reference.programs.bench.runner --serve` process; each job runs in a fresh
    fork."""

    def __init__(self) -> None:
        root = Path(__file__).resolve().parents[2]  # the folder holding the reference package
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", "reference.programs.bench.runner", "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def __call__(self, job: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the benchmark runner exited ({self.process.wait()})")
        result: dict[str, Any] = json.loads(line)
        return result

    def close(self) -> None:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.close()
        self.process.wait()
        self.process.stdout.close()


def measure_size(
    folder: Path,
    facts: dict[str, Any],
    *,
    reps: int,
    runner: Runner,
    no_cuda: str | None,
    warmup: Path,
    threads: int | None = None,
    caches: Sequence[str] = CACHES,
) -> dict[str, Any]:
    """Run every path `reps` times in each mode and each of `caches` that the path is measured
    in (repetition-major, so noise spreads evenly). A cold run that could not drop its pages
    marks that (path, cache) skipped, and it is not run again."""
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    refused: dict[tuple[str, str], str] = {}
    for _ in range(reps):
        for name, spec in PATHS.items():
            if unavailable(spec, no_cuda, facts) is not None:
                continue
            for cache in (c for c in caches if c in spec.caches):
                for mode in ("time", "memory"):
                    if (name, cache) in refused:
                        break
                    job: dict[str, Any] = {"path": name, "folder": str(folder), "mode": mode}
                    job |= {"warmup": str(warmup), "threads": threads, "cache": cache}
                    result = runner(job)
                    if "error" in result:
                        raise RuntimeError(
                            f"bench path {name} ({mode}, {cache}) failed:\n{result['error']}"
                        )
                    if "skipped" in result:
                        refused[name, cache] = result["skipped"]
                        break
                    runs.setdefault((name, cache), []).append(result)
    paths: dict[str, dict[str, Any]] = {}
    for name, spec in PATHS.items():
        reason = unavailable(spec, no_cuda, facts)
        if reason is not None:
            paths[name] = {"skipped": reason, "about": spec.about}
            continue
        model_bytes = facts[spec.model]["file_bytes" if spec.limit else "bytes"]
        row: dict[str, Any] = {"about": spec.about, "model": spec.model, "bytes": model_bytes}
        row["limit"] = spec.limit
        for cache in (c for c in caches if c in spec.caches):
            if (name, cache) in refused:
                row[cache] = {"skipped": refused[name, cache]}
                continue
            figures: dict[str, Any] = median_figures(runs[name, cache])
            figures["throughput"] = model_bytes / figures["load_s"]
            row[cache] = figures | {"runs": runs[name, cache]}
        paths[name] = row
    best: dict[str, Any] = {"about": "limit: the fastest limit row of each cache state"}
    best |= {"model": "dit", "bytes": facts["dit"]["file_bytes"], "limit": False}
    for cache in caches:
        fastest = best_read(paths, cache)
        if fastest is not None:
            best[cache] = fastest
    size = facts | {"paths": paths | {BEST_READ: best}, "caches": list(caches)}
    size["vae_tensors_in_flight"] = tensors_in_flight()
    size["ratios"] = compute_ratios(size)
    return size


# The kernel's counters of memory-pressure work (Linux's /proc/vmstat): a cold read that needs
# free pages and finds memory fragmented stalls in compaction or reclaim, and its CPU time
# grows with it. Measured here after an hour of runs had filled and fragmented memory: cold reads
# of 512 MiB took 0.6-1.1 s of CPU instead of about 0.3 s; after the page cache was dropped
# and memory compacted, no stall and 0.3 s again.
PRESSURE_COUNTERS = ("compact_stall", "allocstall_normal", "allocstall_movable")


def pressure_counters(path: Path = Path("/proc/vmstat")) -> dict[str, int]:
    """The counters of `PRESSURE_COUNTERS` this kernel has, now ({} where there is none)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    fields = dict(line.split(maxsplit=1) for line in lines if " " in line)
    return {name: int(fields[name]) for name in PRESSURE_COUNTERS if name in fields}


def machine(platform: Platform, threads: int | None) -> dict[str, Any]:
    import torch

    return {
        "platform": describe(platform),
        "cpus": os.cpu_count(),
        "torch_threads": threads or torch.get_num_threads(),
        "kernel": os.uname().release,
        "load_average": list(os.getloadavg()),
        "pressure_before": pressure_counters(),
    }


def run_bench(
    sizes: Sequence[int],
    *,
    reps: int,
    command: str,
    threads: int | None = None,
    caches: Sequence[str] = CACHES,
    platform: Platform = SYSTEM,
    runner: Runner | None = None,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """Measure every path at every size; returns the JSON document (see the module docstring)."""
    no_cuda = None if platform.cuda_available() else f"no CUDA device ({describe(platform)})"
    document: dict[str, Any] = {
        "schema": "reference-bench/2",
        "command": command,
        "repetitions": reps,
        "machine": machine(platform, threads),
    }
    server = ServerRunner() if runner is None else None
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="reference-bench-") as tmp:
            warmup = Path(tmp) / "warmup"
            write_folder(warmup, WARMUP_MIB)
            for size_mib in sizes:
                folder = Path(tmp) / f"{size_mib}mib"
                log(f"writing {size_mib} MiB DiT and VAE checkpoints into {folder}")
                facts = write_folder(folder, size_mib)
                log(
                    f"measuring {size_mib} MiB: {reps} repetitions of each path, timed and"
                    f" sampled, page cache {' and '.join(caches)}"
                )
                run = runner or server
                assert run is not None
                results.append(
                    measure_size(
                        folder,
                        facts,
                        reps=reps,
                        runner=run,
                        no_cuda=no_cuda,
                        warmup=warmup,
                        threads=threads,
                        caches=caches,
                    )
                )
    finally:
        if server is not None:
            server.close()
    document["machine"]["load_average_after"] = list(os.getloadavg())
    document["machine"]["pressure_after"] = pressure_counters()
    document["sizes"] = results
    document["ratios"] = results[-1]["ratios"]
    return document


def parse_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--sizes takes MiB as integers, like 64,256; got {text!r}"
        ) from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--sizes needs positive MiB values; got {text!r}")
    return tuple(sorted(set(sizes)))


def bench_command(
    argv: Sequence[str], *, platform: Platform = SYSTEM, runner: Runner | None = None
) -> int:
    """`python -m reference bench ...`; returns the exit status (0 also when a target is missed).
    `runner` runs each job of the CPU table (default: a fresh fork or interpreter per run,
    `ServerRunner`); `--gpu` runs `reference.programs.bench.gpu.gpu_command`."""
    from reference.programs.bench.report import format_document, plot_available, write_plot

    parser = argparse.ArgumentParser(
        prog="python -m reference bench",
        description="Peak memory and time of every loading path, side by side.",
    )
    parser.add_argument(
        "--size-mib", type=int, default=DEFAULT_SIZE_MIB, help="checkpoint size (default 512)"
    )
    parser.add_argument("--sizes", type=parse_sizes, help="several sizes in MiB: 64,256,1024")
    parser.add_argument(
        "--reps", type=int, help="repetitions (default 5; with --gpu, 1: see --gpu)"
    )
    parser.add_argument(
        "--threads", type=int, help="torch intra-op threads in the runs (default: torch's own)"
    )
    parser.add_argument(
        "--cache",
        choices=sorted(CACHE_CHOICES),
        default="both",
        help="page-cache state of the runs: warm, cold or both (default both)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the figures as JSON")
    parser.add_argument("--plot", type=Path, metavar="PATH", help="write a PNG (needs matplotlib)")
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="run only the GPU table (needs CUDA; exits 2 without it): the reference's direct"
        " DiT loads (the bench's DiT and the Wan2.1-T2V-1.3B DiT, 2.8 GB in bf16) and its VAE"
        " stream onto the device, the peers on the same files (safetensors load_file,"
        " diffusers from_pretrained; fastsafetensors and InstantTensor where installed) and the"
        " file-to-device limits, warm and cold, with their ratios and targets. Sized to fit a"
        " few minutes on one GPU: 1 repetition unless --reps, --size-mib 512 for the bench's"
        " models, about 20 fresh interpreters of a few seconds each (one per reference or peer"
        " run, one for all the limit runs)",
    )
    args = parser.parse_args(argv)
    if not Path("/proc/self/status").exists():
        print("bench: needs Linux (memory figures come from /proc/self/status)", file=sys.stderr)
        return 2
    if args.gpu:
        if args.sizes or args.plot or args.threads:
            parser.error("--gpu takes --size-mib, --reps, --cache and --json only")
        if min(args.size_mib, 1 if args.reps is None else args.reps) < 1:
            parser.error("--size-mib and --reps must be at least 1")
        from reference.programs.bench.gpu import gpu_command

        return gpu_command(
            argv,
            size_mib=args.size_mib,
            reps=args.reps,
            caches=CACHE_CHOICES[args.cache],
            json_path=args.json,
            platform=platform,
        )
    reps = DEFAULT_REPS if args.reps is None else args.reps
    if args.plot and not plot_available():
        print(
            f"bench: --plot needs matplotlib; install it: {install_hint('plot')}",
            file=sys.stderr,
        )
        return 2
    if min(args.size_mib, reps, args.threads or 1) < 1:
        parser.error("--size-mib, --reps and --threads must be at least 1")
    sizes = args.sizes or (args.size_mib,)
    command = shlex.join(["python", "-m", "reference", "bench", *argv])
    document = run_bench(
        sizes,
        reps=reps,
        command=command,
        threads=args.threads,
        caches=CACHE_CHOICES[args.cache],
        platform=platform,
        runner=runner,
    )
    print(format_document(document))
    if args.json:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.plot:
        write_plot(document, args.plot)
    return 0
