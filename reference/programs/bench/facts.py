"""What the benchmark records of each checkpoint it writes, from the headers alone."""

from __future__ import annotations

from pathlib import Path

from reference.read.checkpoint import open_checkpoint

__all__ = ["checkpoint_facts"]


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
