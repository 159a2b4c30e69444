"""The benchmark's runs, each in a fresh process.

    python -m reference.programs.bench.runner PATH DIR [--mode time|memory] [--warmup SMALL_DIR]
                                     [--threads N] [--cache warm|cold]

runs one path (`reference.programs.bench.paths.PATHS`) on the checkpoints the benchmark wrote into
DIR (`shapes.json`, `dit/`, `vae/`) and prints one JSON line. `python -m reference bench` starts
`python -m reference.programs.bench.runner --serve` instead, which imports torch once and then forks
a fresh child per run: every run starts from the same untouched process, without paying the
two-second torch import each time. The runner does no tensor work before forking. A run that
touches CUDA is spawned instead (a fresh interpreter running this module on that one job), and so
is every run once anything in the server has initialised CUDA: a forked child cannot use CUDA
that its parent initialised. The child itself puts the path's checkpoint files into
the job's page-cache state (warm or cold, `reference.programs.bench.cache`) before its clock starts:
a cold start needs that no process maps the files, which holds in a fresh child.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reference.programs.bench.cache import CACHES
from reference.programs.bench.paths import MODES, PATHS, Job, library_missing, run
from reference.request.plan import CPU

__all__ = ["forked", "isolated", "job_of", "main", "preload", "serve", "spawned"]


def preload() -> None:
    """Import everything a path imports lazily, so no child pays for (or grows by) an import.

    Building the models on meta and `to_empty` import torch's Python references for meta
    tensors (sympy, parts of dynamo): seconds and tens of MiB, once per process. A tiny build
    here does that before any fork; it allocates a few KiB and runs no CPU kernel.
    """
    import safetensors.torch  # noqa: F401

    from fakes.bench import BenchShapes

    tiny = BenchShapes.for_bytes(1 << 20)
    with torch.device("meta"):
        models: list[nn.Module] = [tiny.dit(), tiny.vae()]
    for model in models:
        model.to_empty(device=CPU)
    if library_missing("diffusers") is None:  # the diffusers paths' imports, once
        importlib.import_module("diffusers.models.transformers")


def forked(job: Job) -> dict[str, Any]:
    """Run `job` in a forked child of this (torch-imported, otherwise untouched) process."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; its coverage is not collected
        os.close(read_end)
        try:
            line = json.dumps(run(job))
        except BaseException:
            line = json.dumps({"path": job.path, "error": traceback.format_exc()})
        os.write(write_end, line.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return {"path": job.path, "error": f"the run died (wait status {status})"}
    result: dict[str, Any] = json.loads(data)
    return result


def spawned(job: Job) -> dict[str, Any]:
    """Run `job` in a fresh interpreter (`python -m reference.programs.bench.runner PATH DIR
    ...`)."""
    argv = [job.path, str(job.folder), "--mode", job.mode, "--cache", job.cache]
    if job.warmup is not None:
        argv += ["--warmup", str(job.warmup)]
    if job.threads is not None:
        argv += ["--threads", str(job.threads)]
    done = subprocess.run(
        [sys.executable, "-m", "reference.programs.bench.runner", *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip()[-4000:]
        return {"path": job.path, "error": f"the run exited {done.returncode}:\n{tail}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def isolated(job: Job) -> dict[str, Any]:
    """Run `job` in a fresh process: spawned where it touches CUDA or this process has
    initialised CUDA (a forked child could not use it), forked otherwise."""
    if PATHS[job.path].cuda or torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return spawned(job)
    return forked(job)


def job_of(request: dict[str, Any]) -> Job:
    """The job a request line {"path", "folder", "mode", "warmup", "threads", "cache"} names."""
    warmup = request.get("warmup")
    return Job(
        request["path"],
        Path(request["folder"]),
        request["mode"],
        warmup=Path(warmup) if warmup else None,
        threads=request.get("threads"),
        cache=request.get("cache", "warm"),
    )


def serve() -> int:
    """Answer each stdin line (a request, `job_of`) with a JSON line."""
    preload()
    # A child's cyclic GC would walk every object inherited from this process and so copy its
    # whole heap page by page (copy-on-write), charging a few hundred milliseconds to whichever
    # load allocates many Python objects first (a diffusers model's hundreds of modules).
    gc.freeze()
    for line in sys.stdin:
        print(json.dumps(isolated(job_of(json.loads(line)))), flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv == ["--serve"]:
        return serve()
    parser = argparse.ArgumentParser(
        prog="python -m reference.programs.bench.runner", usage=__doc__
    )
    parser.add_argument("path", choices=sorted(PATHS))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--mode", choices=MODES, default="time")
    parser.add_argument("--warmup", type=Path)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--cache", choices=CACHES, default="warm")
    args = parser.parse_args(argv)
    job = Job(args.path, args.folder, args.mode, args.warmup, args.threads, args.cache)
    print(json.dumps(run(job)))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
