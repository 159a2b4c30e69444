"""A corpus of bad checkpoints, generated into a folder (never committed as binaries).

Each case writes one broken checkpoint and says what a loader must answer: the file and entry the
error names, and words of the message. Valid input is built with safetensors itself, then broken
by editing header bytes, lengths, offsets or the index.
"""

from __future__ import annotations

import json
import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from fakes.checkpoints import write_checkpoint

__all__ = [
    "CASES",
    "BadCheckpoint",
    "join",
    "object_with_pairs",
    "small_state",
    "split",
    "write_bad_checkpoint",
]


@dataclass(frozen=True)
class BadCheckpoint:
    """One corpus entry, written.

    Attributes:
        case: the corpus entry's name.
        path: what to hand the loader (file, index or folder).
        file: the file name the error must name.
        entry: the tensor or field the error must name, or None for the whole file.
        words: a fragment of the expected message.
        also: other entries whose naming conforms as well, where one fault can be told from
            either side (two tensors that overlap: CKPT-4).
        or_refused_naming: where the case falls under an either-or rule, the files whose naming
            makes a refusal of the other branch conform: a folder of several unindexed files is
            read as one checkpoint (then `file`, `entry` and `words` describe the refusal) or
            refused naming its files (CKPT-2). Empty where only `file` and `entry` conform.
    """

    case: str
    path: Path
    file: str
    entry: str | None
    words: str
    also: tuple[str, ...] = ()
    or_refused_naming: tuple[str, ...] = ()

    @property
    def entries(self) -> tuple[str | None, ...]:
        """Every entry an error may name and conform: `entry`, then `also`."""
        return (self.entry, *self.also)

    def refused_the_other_way(self, error: BaseException) -> bool:
        """Whether `error` is a refusal of the other branch: its message names every file of
        `or_refused_naming` (never, where the case has no other branch)."""
        message = str(error)
        return bool(self.or_refused_naming) and all(f in message for f in self.or_refused_naming)

    @property
    def blamed_the_other_way(self) -> tuple[str, ...]:
        """What a refusal of the other branch may give as its file (a `CheckpointError`'s
        `file`), by name: the folder handed to the loader, or one of the files it names."""
        return (self.path.name, *self.or_refused_naming)


def small_state() -> dict[str, torch.Tensor]:
    """Three tensors of distinct dtypes: the valid starting point of every case."""
    g = torch.Generator().manual_seed(7)
    return {
        "proj.weight": torch.randn(8, 4, generator=g),
        "proj.bias": torch.randn(8, generator=g),
        "norm.weight": torch.ones(4, dtype=torch.bfloat16),
    }


def split(path: Path) -> tuple[dict[str, object], bytes]:
    """A valid file's header (as JSON) and its data section."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def join(header: dict[str, object] | bytes, data: bytes) -> bytes:
    """Bytes of a file from a header (JSON object or raw bytes) and a data section."""
    encoded = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + data


def object_with_pairs(pairs: list[tuple[str, object]]) -> bytes:
    """A JSON object that may name a key twice (json.dumps cannot write one)."""
    return ("{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in pairs) + "}").encode()


def _valid(folder: Path) -> Path:
    return write_checkpoint(small_state(), folder)


def _rewrite(folder: Path, edit: Callable[[dict[str, object], bytes], bytes]) -> Path:
    path = _valid(folder)
    header, data = split(path)
    path.write_bytes(edit(header, data))
    return path


def _entry(header: dict[str, object], name: str) -> dict[str, object]:
    value = header[name]
    assert isinstance(value, dict)
    return value


def _empty(folder: Path) -> BadCheckpoint:
    path = folder / "model.safetensors"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return BadCheckpoint("empty-file", path, path.name, None, "8-byte header length")


def _truncated_header(folder: Path) -> BadCheckpoint:
    path = _valid(folder)
    path.write_bytes(path.read_bytes()[:40])
    return BadCheckpoint("truncated-in-header", path, path.name, None, "exceeds the file")


def _truncated_data(folder: Path) -> BadCheckpoint:
    path = _valid(folder)
    last = _last(split(path)[0])
    path.write_bytes(path.read_bytes()[:-3])
    return BadCheckpoint("truncated-in-data", path, path.name, last, "end beyond the data section")


def _header_too_long(folder: Path) -> BadCheckpoint:
    path = _rewrite(folder, lambda h, d: struct.pack("<Q", 10**9) + join(h, d)[8:])
    return BadCheckpoint("header-length-beyond-file", path, path.name, None, "exceeds the file")


def _not_json(folder: Path) -> BadCheckpoint:
    path = _rewrite(folder, lambda h, d: join(b"{not json at all", d))
    return BadCheckpoint("header-not-json", path, path.name, None, "not valid JSON")


def _json_list(folder: Path) -> BadCheckpoint:
    path = _rewrite(folder, lambda h, d: join(b"[1, 2, 3]", d))
    return BadCheckpoint("header-json-wrong-shape", path, path.name, None, "must be a JSON object")


def _entry_not_object(folder: Path) -> BadCheckpoint:
    def edit(h: dict[str, object], d: bytes) -> bytes:
        h["proj.bias"] = [0, 32]
        return join(h, d)

    path = _rewrite(folder, edit)
    return BadCheckpoint("entry-wrong-shape", path, path.name, "proj.bias", "must be an object")


def _offsets_outside(folder: Path) -> BadCheckpoint:
    def edit(h: dict[str, object], d: bytes) -> bytes:
        _entry(h, "proj.bias")["data_offsets"] = [len(d) + 8, len(d) + 40]
        return join(h, d)

    path = _rewrite(folder, edit)
    return BadCheckpoint(
        "offsets-outside-data", path, path.name, "proj.bias", "end beyond the data section"
    )


def _offsets_overlap(folder: Path) -> BadCheckpoint:
    """`proj.weight` starts 16 bytes inside `proj.bias`; the data section is cut to match, so
    the overlap is the only fault (no gap, no trailing bytes) and either tensor may be named."""

    def edit(h: dict[str, object], d: bytes) -> bytes:
        offsets = {name: _entry(h, name)["data_offsets"] for name in small_state()}
        assert offsets == {
            "proj.bias": [0, 32],
            "proj.weight": [32, 160],
            "norm.weight": [160, 168],
        }, offsets
        _entry(h, "proj.weight")["data_offsets"] = [16, 144]
        _entry(h, "norm.weight")["data_offsets"] = [144, 152]
        return join(h, d[:32] + d[48:160] + d[160:])

    path = _rewrite(folder, edit)
    return BadCheckpoint(
        "offsets-overlap",
        path,
        path.name,
        "proj.weight",
        "overlaps tensor 'proj.bias'",
        also=("proj.bias",),
    )


def _offsets_wrong_size(folder: Path) -> BadCheckpoint:
    def edit(h: dict[str, object], d: bytes) -> bytes:
        _entry(h, "proj.bias")["shape"] = [9]
        return join(h, d)

    path = _rewrite(folder, edit)
    return BadCheckpoint("offsets-not-shape-x-dtype", path, path.name, "proj.bias", "needs 36")


def _unknown_dtype(folder: Path) -> BadCheckpoint:
    def edit(h: dict[str, object], d: bytes) -> bytes:
        _entry(h, "norm.weight")["dtype"] = "F12"
        return join(h, d)

    path = _rewrite(folder, edit)
    return BadCheckpoint("unknown-dtype", path, path.name, "norm.weight", "unknown dtype 'F12'")


def _name_in_two_shards(folder: Path) -> BadCheckpoint:
    folder.mkdir(parents=True, exist_ok=True)
    state = small_state()
    write_checkpoint(state, folder, stem="part-a")
    write_checkpoint({"proj.bias": state["proj.bias"]}, folder, stem="part-b")
    # Read as one checkpoint, `proj.bias` is in two of its files (CKPT-4); a loader may refuse
    # the unindexed folder naming both files instead (CKPT-2). Never: one file read silently.
    return BadCheckpoint(
        "name-in-two-shards",
        folder,
        "part-b.safetensors",
        "proj.bias",
        "also present in",
        or_refused_naming=("part-a.safetensors", "part-b.safetensors"),
    )


def _index_missing_shard(folder: Path) -> BadCheckpoint:
    index = write_checkpoint(small_state(), folder, shards=2)
    missing = json.loads(index.read_text())["weight_map"]["proj.bias"]
    (folder / missing).unlink()
    return BadCheckpoint(
        "index-names-missing-shard", index, index.name, "proj.bias", "does not exist"
    )


def _index_disagrees(folder: Path) -> BadCheckpoint:
    index = write_checkpoint(small_state(), folder, shards=2)
    raw = json.loads(index.read_text())
    raw["weight_map"]["extra.weight"] = raw["weight_map"]["proj.weight"]
    index.write_text(json.dumps(raw))
    return BadCheckpoint(
        "index-disagrees-with-shards", index, index.name, "extra.weight", "header lacks it"
    )


def _index_not_json(folder: Path) -> BadCheckpoint:
    index = write_checkpoint(small_state(), folder, shards=2)
    index.write_text("{")
    return BadCheckpoint("index-not-json", index, index.name, None, "index is not valid JSON")


def _pickle(folder: Path) -> BadCheckpoint:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "pytorch_model.bin"
    path.write_bytes(pickle.dumps({"proj.weight": [1.0, 2.0]}))
    return BadCheckpoint("pickle-bin", path, path.name, None, "pickle checkpoint")


def _last(header: dict[str, object]) -> str:
    ends = {k: _entry(header, k)["data_offsets"] for k in header if k != "__metadata__"}
    return max(ends, key=lambda k: ends[k][1])  # type: ignore[index]


def _duplicate_name(folder: Path) -> BadCheckpoint:
    path = _rewrite(
        folder, lambda h, d: join(object_with_pairs([*h.items(), ("proj.bias", h["proj.bias"])]), d)
    )
    return BadCheckpoint(
        "header-duplicate-name", path, path.name, "proj.bias", "names 'proj.bias' twice"
    )


def _header_length_short(folder: Path) -> BadCheckpoint:
    # The JSON still parses, but 8 bytes of padding now open the data section and shift it.
    path = _rewrite(folder, lambda h, d: join(json.dumps(h).encode(), b" " * 8 + d))
    return BadCheckpoint(
        "header-length-short", path, path.name, None, "bytes follow the last tensor"
    )


def _trailing_bytes(folder: Path) -> BadCheckpoint:
    path = _rewrite(folder, lambda h, d: join(h, d + b"\0" * 4))
    return BadCheckpoint(
        "bytes-after-last-tensor", path, path.name, None, "bytes follow the last tensor"
    )


def _offsets_gap(folder: Path) -> BadCheckpoint:
    def edit(h: dict[str, object], d: bytes) -> bytes:
        offsets = _entry(h, _last(h))["data_offsets"]
        assert isinstance(offsets, list)
        begin, end = offsets
        _entry(h, _last(h))["data_offsets"] = [begin + 8, end + 8]
        return join(h, d[:begin] + b"\0" * 8 + d[begin:])

    path = _rewrite(folder, edit)
    last = _last(split(path)[0])
    return BadCheckpoint("offsets-leave-a-gap", path, path.name, last, "data section has a gap")


def _shape_too_large(folder: Path) -> BadCheckpoint:
    def edit(h: dict[str, object], d: bytes) -> bytes:
        h["huge.empty"] = {"dtype": "F32", "shape": [2**40, 2**40, 0], "data_offsets": [0, 0]}
        return join(h, d)

    path = _rewrite(folder, edit)
    return BadCheckpoint("shape-too-large", path, path.name, "huge.empty", "too large for a tensor")


def _number_too_long(folder: Path) -> BadCheckpoint:
    path = _rewrite(folder, lambda h, d: join(b'{"a": ' + b"1" * 5000 + b"}", d))
    return BadCheckpoint("header-number-too-long", path, path.name, "a", "digits")


def _nested_too_deep(folder: Path) -> BadCheckpoint:
    path = _rewrite(folder, lambda h, d: join(b"[" * 100_000, d))
    return BadCheckpoint("header-nested-too-deep", path, path.name, None, "not valid JSON")


def _header_utf16(folder: Path) -> BadCheckpoint:
    path = _rewrite(folder, lambda h, d: join(json.dumps(h).encode("utf-16"), d))
    return BadCheckpoint("header-not-utf8", path, path.name, None, "not valid JSON")


def _shard_is_a_folder(folder: Path) -> BadCheckpoint:
    (folder / "model.safetensors").mkdir(parents=True)
    return BadCheckpoint(
        "shard-is-a-folder", folder, "model.safetensors", None, "not a regular file"
    )


def _index_names_a_folder(folder: Path) -> BadCheckpoint:
    index = write_checkpoint(small_state(), folder, shards=2)
    raw = json.loads(index.read_text())
    raw["weight_map"]["proj.bias"] = ".."
    index.write_text(json.dumps(raw))
    return BadCheckpoint(
        "index-names-a-folder", index, index.name, "proj.bias", "must be a file name"
    )


def _index_duplicate_name(folder: Path) -> BadCheckpoint:
    index = write_checkpoint(small_state(), folder, shards=2)
    weight_map = json.loads(index.read_text())["weight_map"]
    pairs = [*weight_map.items(), ("proj.bias", weight_map["proj.weight"])]
    index.write_bytes(b'{"weight_map": ' + object_with_pairs(pairs) + b"}")
    return BadCheckpoint(
        "index-duplicate-name", index, index.name, "proj.bias", "names 'proj.bias' twice"
    )


def _missing_file(folder: Path) -> BadCheckpoint:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.safetensors"
    return BadCheckpoint("missing-file", path, path.name, None, "file not found")


def _shape_negative(folder: Path) -> BadCheckpoint:
    def edit(h: dict[str, object], d: bytes) -> bytes:
        _entry(h, "proj.weight")["shape"] = [-8, -4]
        return join(h, d)

    path = _rewrite(folder, edit)
    return BadCheckpoint("shape-negative", path, path.name, "proj.weight", "non-negative integers")


def _offsets_reversed(folder: Path) -> BadCheckpoint:
    def edit(h: dict[str, object], d: bytes) -> bytes:
        offsets = _entry(h, "proj.bias")["data_offsets"]
        assert isinstance(offsets, list)
        _entry(h, "proj.bias")["data_offsets"] = offsets[::-1]
        return join(h, d)

    path = _rewrite(folder, edit)
    return BadCheckpoint("offsets-reversed", path, path.name, "proj.bias", "0 <= begin <= end")


CASES: dict[str, Callable[[Path], BadCheckpoint]] = {
    "empty-file": _empty,
    "truncated-in-header": _truncated_header,
    "truncated-in-data": _truncated_data,
    "header-length-beyond-file": _header_too_long,
    "header-not-json": _not_json,
    "header-json-wrong-shape": _json_list,
    "entry-wrong-shape": _entry_not_object,
    "offsets-outside-data": _offsets_outside,
    "offsets-overlap": _offsets_overlap,
    "offsets-not-shape-x-dtype": _offsets_wrong_size,
    "unknown-dtype": _unknown_dtype,
    "name-in-two-shards": _name_in_two_shards,
    "index-names-missing-shard": _index_missing_shard,
    "index-disagrees-with-shards": _index_disagrees,
    "index-not-json": _index_not_json,
    "pickle-bin": _pickle,
    "header-duplicate-name": _duplicate_name,
    "header-length-short": _header_length_short,
    "bytes-after-last-tensor": _trailing_bytes,
    "offsets-leave-a-gap": _offsets_gap,
    "shape-too-large": _shape_too_large,
    "header-number-too-long": _number_too_long,
    "header-nested-too-deep": _nested_too_deep,
    "header-not-utf8": _header_utf16,
    "shard-is-a-folder": _shard_is_a_folder,
    "index-names-a-folder": _index_names_a_folder,
    "index-duplicate-name": _index_duplicate_name,
    "missing-file": _missing_file,
    "shape-negative": _shape_negative,
    "offsets-reversed": _offsets_reversed,
}


def write_bad_checkpoint(case: str, folder: Path) -> BadCheckpoint:
    """Write corpus entry `case` into `folder` (created) and describe the expected error."""
    return CASES[case](folder)
