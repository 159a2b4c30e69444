"""The benchmark's runs, each in a fresh process.

    python -m reference.bench.runner PATH DIR [--mode time|memory] [--warmup SMALL_DIR]
                                     [--threads N]

runs one path (`reference.bench.paths.PATHS`) on the checkpoints the benchmark wrote into DIR
(`shapes.json`, `dit/`, `vae/`) and prints one JSON line. `python -m reference bench` starts
`python -m reference.bench.runner --serve` instead, which imports torch once and then forks a
fresh child per run: every run starts from the same untouched process, without paying the
two-second torch import each time. The runner does no tensor work and never touches CUDA before
forking, so the children start clean. Before each run it reads the checkpoint files once, so the
page cache is warm.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reference.bench.paths import DIFFUSERS_FOLDER, MODES, PATHS, Job, library_missing, run
from reference.plan import CPU

__all__ = ["forked", "main", "preload", "serve", "warm"]


def preload() -> None:
    """Import everything a path imports lazily, so no child pays for (or grows by) an import.

    Building the models on meta and `to_empty` import torch's Python references for meta
    tensors (sympy, parts of dynamo): seconds and tens of MiB, once per process. A tiny build
    here does that before any fork; it allocates a few KiB and runs no CPU kernel.
    """
    import safetensors.torch  # noqa: F401

    from reference.kit.fakes.bench import BenchShapes

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


def warm(path: Path, buffer: bytearray) -> None:
    """Read a file once through the page cache, so every run finds it warm."""
    with path.open("rb", buffering=0) as f:
        while f.readinto(buffer):
            pass


def serve() -> int:
    """Answer each stdin line {"path", "folder", "mode", "warmup", "threads"} with a JSON line."""
    preload()
    # A child's cyclic GC would walk every object inherited from this process and so copy its
    # whole heap page by page (copy-on-write), charging a few hundred milliseconds to whichever
    # load allocates many Python objects first (a diffusers model's hundreds of modules).
    gc.freeze()
    buffer = bytearray(16 << 20)
    for line in sys.stdin:
        request = json.loads(line)
        warmup = request.get("warmup")
        job = Job(
            request["path"],
            Path(request["folder"]),
            request["mode"],
            warmup=Path(warmup) if warmup else None,
            threads=request.get("threads"),
        )
        for model in ("dit", "vae"):
            warm(job.checkpoint(model), buffer)
        for shard in sorted((job.folder / DIFFUSERS_FOLDER).glob("*/*.safetensors")):
            warm(shard, buffer)
        print(json.dumps(forked(job)), flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv == ["--serve"]:
        return serve()
    parser = argparse.ArgumentParser(prog="python -m reference.bench.runner", usage=__doc__)
    parser.add_argument("path", choices=sorted(PATHS))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--mode", choices=MODES, default="time")
    parser.add_argument("--warmup", type=Path)
    parser.add_argument("--threads", type=int)
    args = parser.parse_args(argv)
    print(json.dumps(run(Job(args.path, args.folder, args.mode, args.warmup, args.threads))))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
