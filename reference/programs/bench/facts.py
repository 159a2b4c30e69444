"""What the benchmark records of each checkpoint it writes, from the headers alone."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from reference.read.checkpoint import open_checkpoint

__all__ = ["checkpoint_facts", "write_bench_models"]


def checkpoint_facts(path: Path) -> dict[str, int]:
    """The tensor bytes, the file bytes, the largest tensor's bytes and the tensor count of the
    checkpoint at `path` (a file, an index or a folder)."""
    checkpoint = open_checkpoint(path)
    return {
        "bytes": checkpoint.total_bytes,
        "file_bytes": sum(f.stat().st_size for f in checkpoint.files),
        "largest_tensor_bytes": checkpoint.largest_tensor_bytes,
        "tensors": len(checkpoint.tensors),
    }


def write_bench_models(folder: Path, size_mib: int) -> dict[str, Any]:
    """Write the bench's DiT and VAE of about `size_mib` MiB into `folder` (shapes.json, dit/,
    vae/); their facts by model, and `size_mib`."""
    from fakes.bench import MIB, BenchShapes, write_bench_checkpoints

    shapes = BenchShapes.for_bytes(size_mib * MIB)
    folder.mkdir(parents=True, exist_ok=True)
    dit, vae = write_bench_checkpoints(folder, shapes)
    (folder / "shapes.json").write_text(json.dumps(asdict(shapes)))
    return {"size_mib": size_mib, "dit": checkpoint_facts(dit), "vae": checkpoint_facts(vae)}
