"""One safetensors file's header: read, parsed and validated without reading tensor data.

A header is checked as strictly as the format demands, so corrupt input becomes one clear
`CheckpointError` naming the file and the entry (CKPT-4): JSON that is UTF-8 with unique names;
known dtypes; shapes that fit a tensor; offsets whose spans match shape x dtype and tile the data
section exactly (no overlap, no gap, nothing after the last tensor). Pickle files are refused
without being opened (CKPT-1); anything that is not a regular file is refused before it is opened.
"""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from reference.files import (
    checkpoint_error,
    load_json,
    no_cyclic_gc,
    open_regular,
    regular_file_size,
)

__all__ = [
    "DTYPES",
    "MAX_HEADER_BYTES",
    "PICKLE_SUFFIXES",
    "FileIdentity",
    "ShardHeader",
    "TensorInfo",
    "read_header",
    "refuse_pickle",
]

# The safetensors library's own bound (MAX_HEADER_SIZE, 100,000,000 bytes): a larger header is
# refused as corrupt, so a file the library refuses is refused here too.
MAX_HEADER_BYTES = 100_000_000
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
for _code, _name in (("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64")):
    if hasattr(torch, _name):
        DTYPES[_code] = getattr(torch, _name)


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: its file and absolute byte range, dtype and shape."""

    name: str
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class FileIdentity:
    """Which file a path named when its header was read: a file replaced (renamed over),
    rewritten or resized since then differs in one of these."""

    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, status: os.stat_result) -> FileIdentity:
        return cls(status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)


@dataclass(frozen=True)
class ShardHeader:
    """The validated header of one safetensors file, and the identity of the file it is in."""

    path: Path
    file_size: int
    tensors: tuple[TensorInfo, ...]
    metadata: Mapping[str, str] = field(default_factory=dict)
    identity: FileIdentity | None = None


def refuse_pickle(path: Path) -> None:
    """CKPT-1: refuse a pickle checkpoint without opening it."""
    if path.name.endswith(PICKLE_SUFFIXES):
        raise checkpoint_error(
            path,
            None,
            "is a pickle checkpoint; only safetensors is read, because unpickling can run code."
            " Convert it to .safetensors in a trusted environment first",
        )


def _parse_entry(path: Path, name: str, raw: object, data_start: int, data_len: int) -> TensorInfo:
    if not isinstance(raw, dict):
        raise checkpoint_error(
            path, name, f"header entry must be an object, got {type(raw).__name__}"
        )
    dtype_code, shape, offsets = raw.get("dtype"), raw.get("shape"), raw.get("data_offsets")
    if not isinstance(dtype_code, str) or dtype_code not in DTYPES:
        raise checkpoint_error(
            path, name, f"unknown dtype {dtype_code!r}; known: {', '.join(DTYPES)}"
        )
    # One pass per entry (a header may hold a million): `type(d) is int` also refuses bools.
    numel, bound = 1, 1  # torch multiplies every dim, zeros as ones, with an overflow check
    if not isinstance(shape, list):
        numel = -1
        shape = []
    for d in shape:
        if type(d) is not int or d < 0:
            numel = -1
            break
        numel *= d
        bound *= d or 1
    if numel < 0:
        raise checkpoint_error(
            path, name, f"shape must be a list of non-negative integers, got {raw.get('shape')!r}"
        )
    if bound >= 2**63:
        raise checkpoint_error(
            path, name, f"shape {shape} is too large for a tensor (2**63 elements or more)"
        )
    if (
        type(offsets) is not list
        or len(offsets) != 2
        or type(offsets[0]) is not int
        or type(offsets[1]) is not int
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise checkpoint_error(
            path, name, f"data_offsets must be [begin, end] with 0 <= begin <= end, got {offsets!r}"
        )
    begin, end = offsets
    if end > data_len:
        raise checkpoint_error(
            path,
            name,
            f"data_offsets {offsets} end beyond the data section ({data_len} bytes);"
            " the file is truncated or the header is wrong",
        )
    dtype = DTYPES[dtype_code]
    expected = numel * dtype.itemsize
    if end - begin != expected:
        raise checkpoint_error(
            path,
            name,
            f"data_offsets {offsets} span {end - begin} bytes but shape {shape} x {dtype_code}"
            f" needs {expected}",
        )
    return TensorInfo(name, path, dtype, tuple(shape), data_start + begin, data_start + end)


def _check_coverage(
    path: Path, tensors: tuple[TensorInfo, ...], data_start: int, size: int
) -> None:
    """The tensors tile the data section exactly: no overlap, no gap, nothing after the last.

    This is the safetensors format's own rule. It also catches a header length that is off by a
    few bytes while the header still parses, which would otherwise shift every tensor silently.
    """
    ordered = sorted(tensors, key=lambda t: (t.start, t.end))
    for previous, info in itertools.pairwise(ordered):
        if info.start < previous.end:
            raise checkpoint_error(path, info.name, f"data overlaps tensor {previous.name!r}")
    covered = data_start
    for info in ordered:
        if info.start != covered:
            raise checkpoint_error(
                path,
                info.name,
                f"data begins at byte {info.start - data_start} of the data section but the"
                f" tensors before it end at byte {covered - data_start}: the data section has a"
                " gap; the offsets or the header length are wrong",
            )
        covered = info.end
    if covered != size:
        raise checkpoint_error(
            path,
            None,
            f"data section is {size - data_start} bytes but the tensors cover"
            f" {covered - data_start}: bytes follow the last tensor; the header length is wrong or"
            " the file has bytes appended",
        )


def read_header(path: Path) -> ShardHeader:
    """Read and validate one file's header without reading any tensor data.

    Raises:
        CheckpointError: for a missing, unreadable, pickle, truncated or malformed file, or one
            that is not a regular file (a folder, or a pipe that would block), naming the entry.
    """
    refuse_pickle(path)
    regular_file_size(path, what="checkpoint file")
    fd, status = open_regular(path, what="checkpoint file")
    try:
        size = status.st_size
        prefix = _read_at(fd, 8, 0)
        if len(prefix) < 8:
            raise checkpoint_error(
                path,
                None,
                f"file is {size} bytes; a safetensors file starts with an 8-byte header length",
            )
        (header_len,) = struct.unpack("<Q", prefix)
        if 8 + header_len > size:
            raise checkpoint_error(
                path,
                None,
                f"header length {header_len} exceeds the file ({size} bytes); the file is"
                " truncated or not a safetensors file",
            )
        if header_len > MAX_HEADER_BYTES:
            raise checkpoint_error(
                path,
                None,
                f"header length {header_len} is over the cap of {MAX_HEADER_BYTES} bytes that"
                " safetensors itself sets; no loader reads such a header. Re-save the checkpoint"
                " with safetensors",
            )
        header_bytes = _read_at(fd, header_len, 8)
    except OSError as exc:
        raise checkpoint_error(path, None, f"cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    # A header may hold a million entries: no cyclic collection while they are built (see
    # `no_cyclic_gc`).
    with no_cyclic_gc():
        header = load_json(path, header_bytes, "header")
        if not isinstance(header, dict):
            raise checkpoint_error(
                path, None, f"header must be a JSON object, got {type(header).__name__}"
            )
        metadata = header.pop("__metadata__", {})
        if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise checkpoint_error(path, "__metadata__", "must be an object of string to string")
        data_start = 8 + header_len
        data_len = size - data_start
        tensors = tuple(
            _parse_entry(path, name, raw, data_start, data_len) for name, raw in header.items()
        )
        _check_coverage(path, tensors, data_start, size)
    return ShardHeader(path, size, tensors, metadata, FileIdentity.of(status))


def _read_at(fd: int, count: int, offset: int) -> bytes:
    """Exactly `count` bytes from `offset` of `fd`, or fewer at the end of the file."""
    chunks, done = [], 0
    while done < count:
        chunk = os.pread(fd, min(count - done, 1 << 24), offset + done)
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)
