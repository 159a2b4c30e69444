"""A checkpoint larger than the host's memory, loaded zero-copy under CPU offload.

    python -m reference.programs.bench.beyond_ram DIR [--gib N] [--shard-gib S]

writes (once) a sharded benchmark DiT of about N GiB into DIR (shards of S GiB, written one at
a time, so writing needs S GiB of memory, not N), then loads it with the reference's DiT loader
under the CPU-offload plan and prints one JSON line: the checkpoint's bytes, the host's total and
available memory, the load's time, and the process's anonymous and file-backed resident growth
over the load. Adoption maps the files and allocates nothing, so the load needs no memory for
the weights; their pages come from the page cache as a forward touches them. The copy path of
the same checkpoint is refused before it allocates (`HostMemoryError`); the line says so too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from reference.errors import HostMemoryError
from reference.load.dit import DiTOptions, load_dit
from reference.place.host_memory import available_host_bytes
from reference.report.memory import resident
from reference.request.plan import CPU, WeightLoadPlan

__all__ = ["load_beyond_ram", "main", "write_sharded"]

GIB = 1024**3
INDEX = "model.safetensors.index.json"


def write_sharded(folder: Path, *, target: int, shard_bytes: int) -> Path:
    """Write the benchmark DiT of about `target` bytes as shards of at most `shard_bytes` each
    (plus one tensor) and its index; returns the index (kept if already there)."""
    from fakes.bench import BenchShapes
    from fakes.checkpoints import write_checkpoint

    index = folder / INDEX
    if index.exists():
        return index
    shapes = BenchShapes.for_bytes(target)
    with torch.device("meta"):
        slots = shapes.dit().state_dict()
    groups: list[list[str]] = [[]]
    size = 0
    for name, slot in slots.items():
        if groups[-1] and size + slot.nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += slot.nbytes
    weight_map: dict[str, str] = {}
    generator = torch.Generator().manual_seed(0)
    for number, group in enumerate(groups, 1):
        shard = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        state = {
            name: torch.empty(slots[name].shape, dtype=slots[name].dtype).uniform_(
                -0.02, 0.02, generator=generator
            )
            for name in group
        }
        write_checkpoint(state, folder / "writing").rename(folder / shard)
        del state
        weight_map |= dict.fromkeys(group, shard)
    (folder / "writing").rmdir()
    (folder / "shapes.json").write_text(json.dumps(dataclasses.asdict(shapes)))
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


def load_beyond_ram(index: Path) -> dict[str, Any]:
    """Load `index`'s DiT zero-copy under CPU offload, then try its copy path; the figures."""
    from fakes.bench import BenchShapes
    from fakes.layers import LINEAR_KINDS

    shapes = BenchShapes(**json.loads((index.parent / "shapes.json").read_text()))
    plan = WeightLoadPlan.for_component(
        checkpoint_load_device=CPU,
        needs_device_weight_postprocess=False,
        component_cpu_offload=True,
    )
    total = sum(p.stat().st_size for p in index.parent.glob("*.safetensors"))
    host_total = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    before = resident()
    started = time.perf_counter()
    module, report = load_dit(shapes.dit, index, plan=plan, kinds=LINEAR_KINDS)
    seconds = time.perf_counter() - started
    after = resident()
    figures: dict[str, Any] = {
        "checkpoint_bytes": total,
        "host_total_bytes": host_total,
        "host_available_bytes": available_host_bytes(),
        "load_s": seconds,
        "adopted_bytes": report.adopted.bytes,
        "copied_bytes": report.copied.bytes,
        "anon_growth_bytes": after.anon - before.anon,
        "file_growth_bytes": after.file - before.file,
    }
    del module
    try:
        load_dit(shapes.dit, index, plan=plan, kinds=LINEAR_KINDS, options=DiTOptions(adopt=False))
    except HostMemoryError as refusal:
        figures["copy_path"] = f"refused: {refusal}"
    else:
        figures["copy_path"] = "loaded (it fitted in memory)"
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference.programs.bench.beyond_ram")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--gib", type=float, default=26.0, help="checkpoint size (default 26)")
    parser.add_argument("--shard-gib", type=float, default=2.0, help="shard size (default 2)")
    args = parser.parse_args(argv)
    args.folder.mkdir(parents=True, exist_ok=True)
    index = write_sharded(
        args.folder, target=int(args.gib * GIB), shard_bytes=int(args.shard_gib * GIB)
    )
    print(json.dumps(load_beyond_ram(index)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
