"""Safetensors checkpoints: files, shard index, header preflight and a tensor-at-a-time reader.

Headers are parsed and validated here, without reading tensor data, so a checkpoint can be checked
against a model before the model is touched (CKPT-3) and corrupt input becomes one clear
`CheckpointError` naming the file and the entry (CKPT-4). Only safetensors is read: pickle files
are refused without being opened (CKPT-1).

Tensors on CPU are views into a private (copy-on-write) memory map of the file: reading one
allocates nothing, and writing to it never reaches the file (ZC-13). Tensors for another device
are copied there one at a time from that map.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from reference.errors import CheckpointError

# Same bound as the safetensors library: larger headers are refused as corrupt.
MAX_HEADER_BYTES = 100 * 1024 * 1024
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
INDEX_SUFFIX = ".safetensors.index.json"

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
class ShardHeader:
    """The validated header of one safetensors file."""

    path: Path
    file_size: int
    tensors: tuple[TensorInfo, ...]
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Checkpoint:
    """A whole checkpoint (one file or several shards), known from its headers alone.

    Attributes:
        files: the safetensors files, in load order.
        tensors: every tensor by name; each name appears in exactly one file.
        metadata: the `__metadata__` of the first file (where configs sometimes hide).
    """

    files: tuple[Path, ...]
    tensors: Mapping[str, TensorInfo]
    metadata: Mapping[str, str] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(info.nbytes for info in self.tensors.values())

    @property
    def largest_tensor_bytes(self) -> int:
        return max((info.nbytes for info in self.tensors.values()), default=0)


def _fail(path: Path, entry: str | None, problem: str) -> CheckpointError:
    return CheckpointError(str(path), entry, problem)


def refuse_pickle(path: Path) -> None:
    """CKPT-1: refuse a pickle checkpoint without opening it."""
    if path.name.endswith(PICKLE_SUFFIXES):
        raise _fail(
            path,
            None,
            "is a pickle checkpoint; only safetensors is read, because unpickling can run code."
            " Convert it to .safetensors in a trusted environment first",
        )


def _parse_entry(path: Path, name: str, raw: object, data_start: int, data_len: int) -> TensorInfo:
    if not isinstance(raw, dict):
        raise _fail(path, name, f"header entry must be an object, got {type(raw).__name__}")
    dtype_code, shape, offsets = raw.get("dtype"), raw.get("shape"), raw.get("data_offsets")
    if not isinstance(dtype_code, str) or dtype_code not in DTYPES:
        raise _fail(path, name, f"unknown dtype {dtype_code!r}; known: {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise _fail(path, name, f"shape must be a list of non-negative integers, got {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise _fail(
            path, name, f"data_offsets must be [begin, end] with 0 <= begin <= end, got {offsets!r}"
        )
    begin, end = offsets
    if end > data_len:
        raise _fail(
            path,
            name,
            f"data_offsets {offsets} end beyond the data section ({data_len} bytes);"
            " the file is truncated or the header is wrong",
        )
    dtype = DTYPES[dtype_code]
    expected = math.prod(shape) * dtype.itemsize
    if end - begin != expected:
        raise _fail(
            path,
            name,
            f"data_offsets {offsets} span {end - begin} bytes but shape {shape} x {dtype_code}"
            f" needs {expected}",
        )
    return TensorInfo(name, path, dtype, tuple(shape), data_start + begin, data_start + end)


def read_header(path: Path) -> ShardHeader:
    """Read and validate one file's header without reading any tensor data.

    Raises:
        CheckpointError: for a missing, pickle, truncated or malformed file, naming the entry.
    """
    refuse_pickle(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise _fail(
                    path,
                    None,
                    f"file is {size} bytes; a safetensors file starts with an 8-byte header length",
                )
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
                raise _fail(
                    path,
                    None,
                    f"header length {header_len} exceeds the file ({size} bytes); the file is"
                    " truncated or not a safetensors file",
                )
            header_bytes = f.read(header_len)
    except FileNotFoundError:
        raise _fail(path, None, "file not found") from None
    try:
        header = json.loads(header_bytes)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(path, None, f"header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise _fail(path, None, f"header must be a JSON object, got {type(header).__name__}")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise _fail(path, "__metadata__", "must be an object of string to string")
    data_start = 8 + header_len
    data_len = size - data_start
    tensors = tuple(
        _parse_entry(path, name, raw, data_start, data_len) for name, raw in header.items()
    )
    previous: TensorInfo | None = None
    for info in sorted(tensors, key=lambda t: (t.start, t.end)):
        if previous is not None and info.start < previous.end:
            raise _fail(path, info.name, f"data overlaps tensor {previous.name!r}")
        previous = info
    return ShardHeader(path, size, tensors, metadata)


def _read_index(index_path: Path) -> dict[str, Path]:
    try:
        raw = json.loads(index_path.read_text())
    except FileNotFoundError:
        raise _fail(index_path, None, "index file not found") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(index_path, None, f"index is not valid JSON ({exc})") from None
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise _fail(
            index_path, "weight_map", "must be an object mapping tensor names to shard files"
        )
    base = index_path.parent
    shards: dict[str, Path] = {}
    for name, shard in weight_map.items():
        shard_path = base / shard
        if Path(shard).name != shard:
            raise _fail(index_path, name, f"shard {shard!r} must be a file name next to the index")
        shards[name] = shard_path
    return shards


def _merge(headers: list[ShardHeader]) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for header in headers:
        for info in header.tensors:
            if info.name in tensors:
                raise _fail(
                    info.file,
                    info.name,
                    f"tensor also present in {tensors[info.name].file.name}; each name must live in"
                    " exactly one shard",
                )
            tensors[info.name] = info
    return tensors


def _open_index(index_path: Path) -> Checkpoint:
    weight_map = _read_index(index_path)
    files = tuple(dict.fromkeys(weight_map.values()))
    for shard in files:
        if not shard.exists():
            names = sorted(n for n, f in weight_map.items() if f == shard)
            raise _fail(index_path, names[0], f"names shard {shard.name}, which does not exist")
    headers = [read_header(shard) for shard in files]
    tensors = _merge(headers)
    for name, shard in weight_map.items():
        if name not in tensors:
            raise _fail(index_path, name, f"index places it in {shard.name}, whose header lacks it")
        if tensors[name].file != shard:
            raise _fail(
                index_path,
                name,
                f"index places it in {shard.name}, but it is in {tensors[name].file.name}",
            )
    unlisted = sorted(set(tensors) - set(weight_map))
    if unlisted:
        raise _fail(
            tensors[unlisted[0]].file, unlisted[0], "tensor is in a shard but not in the index"
        )
    return Checkpoint(files, tensors, headers[0].metadata if headers else {})


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Resolve a checkpoint and validate all its headers (CKPT-1..4); reads no tensor data.

    Args:
        path: a `.safetensors` file, a `*.safetensors.index.json`, or a folder holding either
            (an index wins; otherwise every `*.safetensors` in the folder is a shard).

    Raises:
        CheckpointError: naming the file (and entry) at fault.
    """
    path = Path(path)
    if path.is_dir():
        indexes = sorted(path.glob(f"*{INDEX_SUFFIX}"))
        if len(indexes) > 1:
            raise _fail(path, None, f"holds {len(indexes)} shard indexes; keep exactly one")
        if indexes:
            return _open_index(indexes[0])
        files = sorted(path.glob("*.safetensors"))
        if not files:
            pickles = sorted(p for p in path.iterdir() if p.name.endswith(PICKLE_SUFFIXES))
            if pickles:
                refuse_pickle(pickles[0])
            raise _fail(path, None, "holds no *.safetensors file")
        headers = [read_header(f) for f in files]
        return Checkpoint(tuple(files), _merge(headers), headers[0].metadata)
    if path.name.endswith(INDEX_SUFFIX):
        return _open_index(path)
    header = read_header(path)
    return Checkpoint((path,), _merge([header]), header.metadata)


class TensorReader:
    """Reads a checkpoint's tensors one at a time, from a private memory map of each file.

    A CPU tensor returned by `read` is a view into the map (no allocation, copy-on-write); for any
    other device the bytes are copied there from the map. The reader never builds a state dict.
    """

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        self._maps: dict[Path, torch.Tensor] = {}

    def _map(self, info: TensorInfo) -> torch.Tensor:
        mapped = self._maps.get(info.file)
        if mapped is None:
            size = info.file.stat().st_size if info.file.exists() else -1
            if size < info.end:
                raise _fail(
                    info.file,
                    info.name,
                    f"file is {size} bytes but the tensor ends at byte {info.end}; it changed"
                    " since its header was read",
                )
            # shared=False maps the file privately: writes to a view never reach the file.
            storage = torch.UntypedStorage.from_file(str(info.file), shared=False, nbytes=size)
            mapped = torch.empty(0, dtype=torch.uint8).set_(storage)  # type: ignore[arg-type]
            self._maps[info.file] = mapped
        return mapped

    def read(self, name: str, *, device: torch.device) -> torch.Tensor:
        """One tensor, on `device`, with the dtype and shape of its header.

        Raises:
            KeyError: for a name the checkpoint does not hold.
        """
        info = self.checkpoint.tensors[name]
        raw = self._map(info)[info.start : info.end]
        if info.dtype.itemsize > 1 and info.start % info.dtype.itemsize:
            raw = raw.clone()  # misaligned in the file: a view of that dtype is impossible
        tensor = raw.view(info.dtype).view(info.shape)
        return tensor if device.type == "cpu" else tensor.to(device)

    def __iter__(self) -> Iterator[str]:
        """Tensor names in file order (each file read front to back)."""
        by_file = sorted(
            self.checkpoint.tensors.values(),
            key=lambda i: (self.checkpoint.files.index(i.file), i.start),
        )
        return iter([info.name for info in by_file])

    def close(self) -> None:
        """Drop the maps; tensors already handed out keep their own reference."""
        self._maps.clear()
