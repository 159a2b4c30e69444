"""Where a CPU tensor's bytes live: in which file's memory map, at which offset of that file.

Adoption from a checkpoint file (ZC-2b, ZC-9) is judged from its outcome, whichever loader made
it: an adopted parameter's storage *is* the loader's map of the file, so its first byte lies in a
mapping of that very file, at the offset where the file's header puts that tensor's data. A copy
lies in anonymous memory. Linux lists every mapping of the process in /proc/self/maps.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch

from reference.kit.judging.evidence import safetensors_files

__all__ = ["MAPS", "Position", "file_position", "mapped_files", "maps_missing", "tensor_positions"]

MAPS = "/proc/self/maps"
Position = tuple[str, int]  # (real path of a file, byte offset in it)


def maps_missing() -> str | None:
    """Why mappings cannot be seen here (a test skips with it, crediting nothing), or None."""
    try:
        with open(MAPS, "rb") as f:
            f.readline()
    except OSError as exc:
        return f"no evidence of file mappings can be gathered here: needs Linux's {MAPS} ({exc})"
    return None


def file_position(tensor: torch.Tensor) -> Position | None:
    """The file and offset that `tensor`'s first byte maps, or None for memory no file backs."""
    if tensor.device.type != "cpu" or tensor.nbytes == 0:
        return None
    address = tensor.data_ptr()
    # The kernel lists the mappings by address, ascending, and writes the text as it is read:
    # the lines are read, and only their range parsed, up to the one holding `address` (a judge
    # asks once per tensor, of a process with hundreds of mappings). Bytes, not text: a path in
    # the list may be any bytes Linux allows in a name (a map of a folder named in Latin-1), and
    # such a line must not break the judging of every tensor after it.
    with open(MAPS, "rb") as f:
        for line in f:
            dash = line.index(b"-")
            start = int(line[:dash], 16)
            if start > address:
                return None
            if address >= int(line[dash + 1 : line.index(b" ", dash)], 16):
                continue
            fields = line.rstrip(b"\n").split(maxsplit=5)
            # Anonymous memory has no path; shared anonymous memory shows as /dev/zero.
            if len(fields) < 6 or not fields[5].startswith(b"/") or fields[5].startswith(b"/dev/"):
                return None
            path = os.path.realpath(os.fsdecode(fields[5]))
            return path, address - start + int(fields[2], 16)
    return None


def tensor_positions(checkpoint: Path) -> dict[str, Position]:
    """Where each tensor's data starts in the checkpoint's files (a file, an index or a folder)."""
    positions: dict[str, Position] = {}
    for path in safetensors_files(checkpoint):
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        real = os.path.realpath(path)
        for name, entry in header.items():
            if name != "__metadata__":
                positions[name] = (real, 8 + length + entry["data_offsets"][0])
    return positions


def mapped_files(positions: dict[str, Position]) -> set[str]:
    """The files a table of positions names."""
    return {path for path, _ in positions.values()}
