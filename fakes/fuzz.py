"""Hypothesis strategies for checkpoint fuzzing: valid checkpoints, then one mutation each.

A valid checkpoint is random small tensors (zero-size dims, 0-d tensors, bool, bf16, float8,
int64, ...) written by `write_checkpoint` as 1..3 shards. A mutation then edits one file: header
bytes, the header length, one entry's dtype / shape / offsets, a name, the metadata, the index,
or the file's length. Whether a mutation is harmless is judged afterwards from the bytes
(`same_meaning`), never assumed from its kind.

Settings profiles: `unit` (small, derandomized: the unit tier) and `fuzz` (many random
examples); `FUZZ_SETTINGS` is the one named by the HYPOTHESIS_PROFILE environment variable.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from fakes.checkpoints import write_checkpoint
from fakes.corrupt import object_with_pairs

__all__ = [
    "BAD_DTYPES",
    "BAD_SHARD_NAMES",
    "DTYPES",
    "DTYPE_CODES",
    "FUZZ_SETTINGS",
    "PROFILE",
    "Mutation",
    "checkpoints",
    "mutate",
    "names",
    "pack",
    "pairs_or_none",
    "same_meaning",
    "split",
    "tensors",
    "write",
]

settings.register_profile(
    "unit",
    max_examples=100,
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile(
    "fuzz",
    max_examples=3000,
    deadline=timedelta(seconds=5),  # a hang shows as a deadline failure
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "unit")
FUZZ_SETTINGS = settings.get_profile(PROFILE)

DTYPES = (
    torch.bool,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.int64,
    torch.float32,
    torch.float16,
    torch.int8,
    torch.uint8,
)
DTYPE_CODES = ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3")
BAD_DTYPES = ("F12", "", "f32", "F8_E4M3FN", "BOOLEAN", None, 4, ["F32"])
BAD_SHARD_NAMES = ("", ".", "..", "missing.safetensors", "../x.safetensors", "/abs.safetensors")


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    """A small tensor of any fuzzed dtype; 0-d and zero-size shapes included."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    count = 1
    for dim in shape:
        count *= dim
    raw = draw(st.binary(min_size=count * dtype.itemsize, max_size=count * dtype.itemsize))
    data = torch.tensor(list(raw), dtype=torch.uint8)
    if dtype == torch.bool:
        data &= 1  # only 0 and 1 are booleans
    return data.view(dtype).reshape(shape)


names = st.one_of(
    st.sampled_from(["w", "proj.weight", "proj.bias", "blocks.0.attn.qkv", "norm.scale"]),
    st.text(max_size=6),
).filter(lambda n: n != "__metadata__")


@st.composite
def checkpoints(draw: st.DrawFn) -> tuple[dict[str, torch.Tensor], int, dict[str, str]]:
    """A state dict, a shard count (1..3, at most one per tensor) and `__metadata__`."""
    state = draw(st.dictionaries(names, tensors(), min_size=1, max_size=5))
    shards = draw(st.integers(1, min(3, len(state))))
    metadata = draw(st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2))
    return state, shards, metadata


def write(state: dict[str, torch.Tensor], folder: Path, shards: int, meta: dict[str, str]) -> Path:
    """Write a drawn checkpoint; returns what a loader is given (file or index)."""
    return write_checkpoint(state, folder, shards=shards, metadata=meta)


def split(raw: bytes) -> tuple[bytes, bytes]:
    """A safetensors file's header bytes and data section (the file must be well formed)."""
    (n,) = struct.unpack("<Q", raw[:8])
    return raw[8 : 8 + n], raw[8 + n :]


def pack(header: bytes, data: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header + data


def pairs_or_none(text: bytes) -> list[tuple[str, object]] | None:
    """The top-level pairs of a JSON object, duplicates kept; None when it is not one.

    Objects nested inside come back as tuples of pairs (arrays stay lists).
    """
    try:
        value = json.loads(text.decode("utf-8"), object_pairs_hook=tuple)
    except (ValueError, RecursionError):
        return None
    return list(value) if isinstance(value, tuple) else None


def same_meaning(before: bytes, after: bytes, *, index: bool) -> bool:
    """Whether `after` says exactly what `before` says (JSON formatting and key order aside)."""
    if before == after:
        return True
    if index:
        return _same_object(pairs_or_none(after), pairs_or_none(before))
    if len(after) < 8:
        return False
    header_before, data_before = split(before)
    (n,) = struct.unpack("<Q", after[:8])
    new = pairs_or_none(after[8 : 8 + n]) if 8 + n <= len(after) else None
    same_header = _same_object(new, pairs_or_none(header_before))
    return same_header and after[8 + n :] == data_before


def _same_object(a: list[tuple[str, object]] | None, b: list[tuple[str, object]] | None) -> bool:
    text = _canonical(a)
    return text is not None and text == _canonical(b)


def _canonical(pairs: list[tuple[str, object]] | None) -> str | None:
    """One text per meaning; None for no object, or one with a duplicate key at any depth."""

    def plain(value: object) -> object:
        if isinstance(value, tuple):
            keys = [k for k, _ in value]
            if len(set(keys)) != len(keys):
                raise KeyError(keys)
            return {k: plain(v) for k, v in value}
        return [plain(v) for v in value] if isinstance(value, list) else value

    if pairs is None:
        return None
    try:
        return json.dumps(plain(tuple(pairs)), sort_keys=True)
    except KeyError:
        return None


@dataclass(frozen=True)
class Mutation:
    """What was done: the kind of edit and the file it touched."""

    kind: str
    file: Path


def _entry_edit(data: st.DataObject, entry: dict[str, object]) -> object:
    field = data.draw(st.sampled_from(["dtype", "shape", "data_offsets", "drop", "extra", "type"]))
    offsets = entry["data_offsets"]
    assert isinstance(offsets, list)
    near = st.integers(-3, 3)
    if field == "dtype":
        entry["dtype"] = data.draw(st.sampled_from(DTYPE_CODES + BAD_DTYPES))
    elif field == "shape":
        dim = st.one_of(st.integers(-1, 5), st.sampled_from([2**40, 2**63, 2**64, 10**30]))
        bad = st.sampled_from([None, "3", [1.0], [True], [[2]]])
        entry["shape"] = data.draw(st.one_of(st.lists(dim, max_size=4), bad))
    elif field == "data_offsets":
        moved = st.tuples(near, near).map(lambda d: [offsets[0] + d[0], offsets[1] + d[1]])
        odd = st.sampled_from([[0], [0, 1, 2], [0.0, 4.0], [True, 4], None, [2**64, 2**64 + 4]])
        big = st.lists(st.integers(-(2**70), 2**70), min_size=2, max_size=2)
        entry["data_offsets"] = data.draw(st.one_of(moved, odd, big))
    elif field == "drop":
        del entry[data.draw(st.sampled_from(sorted(entry)))]
    elif field == "extra":
        entry["extra"] = data.draw(st.integers())
    else:
        return data.draw(st.sampled_from([None, 1, "x", [], [0, 4]]))
    return entry


def _header_edit(data: st.DataObject, raw: bytes) -> tuple[str, bytes]:
    header_bytes, body = split(raw)
    pairs = list(json.loads(header_bytes).items())
    entries = [i for i, (k, _) in enumerate(pairs) if k != "__metadata__"]
    kind = data.draw(st.sampled_from(["entry", "rename", "metadata", "reformat", "duplicate"]))
    i = data.draw(st.sampled_from(entries))
    name, entry = pairs[i]
    if kind == "entry":
        pairs[i] = (name, _entry_edit(data, dict(entry)))
    elif kind == "rename":
        other = st.sampled_from([k for k, _ in pairs])
        pairs[i] = (data.draw(st.one_of(names, other, st.just("__metadata__"))), entry)
    elif kind == "metadata":
        pairs = [p for p in pairs if p[0] != "__metadata__"]
        odd: st.SearchStrategy[object] = st.sampled_from([None, [], "x", {"k": 1}, {"k": None}])
        pairs.append(("__metadata__", data.draw(st.one_of(st.dictionaries(names, names), odd))))
    elif kind == "duplicate":
        pairs.append((name, entry))
    else:
        pairs = data.draw(st.permutations(pairs))
        indent = data.draw(st.one_of(st.none(), st.integers(0, 3)))
        text = json.dumps(dict(pairs), indent=indent).encode()
        return kind, pack(text + b" " * data.draw(st.integers(0, 9)), body)
    return kind, pack(object_with_pairs(pairs), body)


def _file_edit(data: st.DataObject, raw: bytes) -> tuple[str, bytes]:
    n = struct.unpack("<Q", raw[:8])[0]
    kind = data.draw(
        st.sampled_from(["header", "header-bytes", "header-length", "truncate", "append", "data"])
    )
    if kind == "header":
        return _header_edit(data, raw)
    if kind == "header-bytes":
        edited = bytearray(raw)
        for _ in range(data.draw(st.integers(1, 4))):
            edited[data.draw(st.integers(8, 7 + n))] = data.draw(st.integers(0, 255))
        return kind, bytes(edited)
    if kind == "header-length":
        length = st.one_of(st.integers(n - 16, n + 16), st.integers(0, 2**64 - 1))
        return kind, struct.pack("<Q", max(0, data.draw(length))) + raw[8:]
    if kind == "truncate":
        return kind, raw[: data.draw(st.integers(0, len(raw) - 1))]
    if kind == "append":
        return kind, raw + data.draw(st.binary(min_size=1, max_size=16))
    if len(raw) == 8 + n:
        return kind, raw  # no data section: nothing to flip
    edited = bytearray(raw)
    edited[data.draw(st.integers(8 + n, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    return kind, bytes(edited)


def _index_edit(data: st.DataObject, raw: bytes) -> tuple[str, bytes]:
    index = json.loads(raw)
    weight_map: dict[str, str] = index["weight_map"]
    shards = sorted(set(weight_map.values()))
    name = data.draw(st.sampled_from(sorted(weight_map)))
    kind = data.draw(
        st.sampled_from(["drop", "ghost", "retarget", "shard-name", "not-map", "garbage", "dup"])
    )
    if kind == "drop":
        del weight_map[name]
    elif kind == "ghost":
        weight_map[data.draw(names)] = data.draw(st.sampled_from(shards))
    elif kind == "retarget":
        weight_map[name] = data.draw(st.sampled_from(shards))
    elif kind == "shard-name":
        weight_map[name] = data.draw(st.sampled_from(BAD_SHARD_NAMES))
    elif kind == "not-map":
        index["weight_map"] = data.draw(st.sampled_from([None, [], "x", {"a": 1}]))
    elif kind == "dup":
        pairs: list[tuple[str, object]] = [*weight_map.items(), (name, shards[-1])]
        return kind, b'{"weight_map": ' + object_with_pairs(pairs) + b"}"
    else:
        return kind, data.draw(st.binary(max_size=32))
    return kind, json.dumps(index).encode()


def mutate(data: st.DataObject, folder: Path) -> Mutation:
    """Apply one drawn mutation to one file of the checkpoint in `folder` (or delete a shard)."""
    files = sorted(folder.iterdir())
    target = data.draw(st.sampled_from(files))
    raw = target.read_bytes()
    edit: Callable[[st.DataObject, bytes], tuple[str, bytes]]
    if target.name.endswith(".index.json"):
        if data.draw(st.integers(0, 9)) == 0:
            shard = data.draw(st.sampled_from([f for f in files if f != target]))
            shard.unlink()
            return Mutation("delete-shard", shard)
        edit = _index_edit
    else:
        edit = _file_edit
    kind, edited = edit(data, raw)
    target.write_bytes(edited)
    return Mutation(kind, target)
