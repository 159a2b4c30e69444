"""Checkpoint writers: real safetensors files (single or sharded with an index) in a folder."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

__all__ = [
    "INDEX_NAME",
    "write_checkpoint",
    "write_misaligned_checkpoint",
    "write_sparse_checkpoint",
]

INDEX_NAME = "model.safetensors.index.json"


def write_checkpoint(
    state: Mapping[str, torch.Tensor],
    folder: Path,
    *,
    shards: int = 1,
    stem: str = "model",
    metadata: Mapping[str, str] | None = None,
    metadata_in: Sequence[int] | None = None,
) -> Path:
    """Write `state` as safetensors into `folder`.

    Args:
        state: tensors by name (moved to CPU, made contiguous).
        folder: created if missing.
        shards: 1 writes `<stem>.safetensors`; more writes `<stem>-0000i-of-0000n.safetensors`
            files (names spread round-robin in insertion order) plus
            `<stem>.safetensors.index.json`.
        metadata: the files' `__metadata__`.
        metadata_in: the shards (0-based) that carry `metadata`; default every one.

    Returns:
        The path a loader should be given: the single file, or the index.
    """
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in state.items()}
    meta = dict(metadata or {})
    if shards == 1:
        path = folder / f"{stem}.safetensors"
        save_file(tensors, str(path), metadata=meta)
        return path
    names = list(tensors)
    weight_map: dict[str, str] = {}
    for i in range(shards):
        shard_name = f"{stem}-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[i::shards]}
        carries = metadata_in is None or i in metadata_in
        save_file(part, str(folder / shard_name), metadata=meta if carries else {})
        weight_map.update({n: shard_name for n in part})
    index = folder / f"{stem}.safetensors.index.json"
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index.write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    return index


def write_misaligned_checkpoint(path: Path) -> Path:
    """A file of u8 (1 byte), then f16 (2 elements at an odd file offset), then f32 (aligned,
    not first), written byte by byte (safetensors' writer aligns nothing of the kind)."""
    f16 = torch.tensor([1.5, -2.0], dtype=torch.float16)
    f32 = torch.tensor([3.0], dtype=torch.float32)
    header = {
        "u8": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
        "f16": {"dtype": "F16", "shape": [2], "data_offsets": [1, 5]},
        "pad": {"dtype": "U8", "shape": [3], "data_offsets": [5, 8]},
        "f32": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # data section starts 8-aligned, as safetensors writes it
    data = b"\x07" + f16.numpy().tobytes() + b"\0\0\0" + f32.numpy().tobytes()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)
    return path


def write_sparse_checkpoint(folder: Path, sizes: Sequence[int]) -> Path:
    """Shards whose headers declare large tensors over data that is a hole: one U8 tensor
    `w<i>` of `sizes[i]` bytes per shard, each file as long as its header says (sparse, so a
    GiB costs no disk), and their index. For what reads headers only (a memory preflight):
    the data reads as zeros. Returns the index."""
    folder.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    for i, size in enumerate(sizes):
        shard = folder / f"model-{i + 1:05d}-of-{len(sizes):05d}.safetensors"
        header = {f"w{i}": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with shard.open("wb") as f:
            f.write(len(raw).to_bytes(8, "little") + raw)
            f.truncate(8 + len(raw) + size)
        weight_map[f"w{i}"] = shard.name
    index = folder / INDEX_NAME
    index.write_text(json.dumps({"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}))
    return index
