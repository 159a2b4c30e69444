"""CKPT-4 at the edges of the safetensors header: what is still a valid file, what is not.

A hand-written file per case (8-byte little-endian header length, JSON header, data section), so
each case sits exactly on one limit: the header length against the file size and the 100 MiB
bound, zero-sized tensors, element counts at 2**63, offsets that are not two plain integers,
metadata that is not string to string. Valid files must be listed (any loader); invalid ones
refused with a CheckpointError naming the file (any loader). The reference's own wording, and
the fields of its ShardHeader, are pinned by the reference_only tests at the end.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from reference.errors import CheckpointError
from reference.kit.judging.judge import refusal
from reference.kit.seam import CHECKPOINT_SAFETY, SeamLoader
from reference.read.header import MAX_HEADER_BYTES, read_header

pytestmark = pytest.mark.capability(CHECKPOINT_SAFETY)

F32 = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}


def shard(path: Path, header: object, data: bytes = b"", *, header_len: int | None = None) -> Path:
    """Write a safetensors file by hand; `header_len` overrides the true length field."""
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    length = len(raw) if header_len is None else header_len
    path.write_bytes(struct.pack("<Q", length) + raw + data)
    return path


def refused(loader: SeamLoader, path: Path) -> CheckpointError:
    err = refusal(lambda: loader.inspect_checkpoint(path), path.name, error=CheckpointError)
    assert isinstance(err, CheckpointError)
    return err


# --- valid at the edge: every loader lists them -------------------------------------------------


@pytest.mark.rule("CKPT-4")
@pytest.mark.parametrize(
    ("header", "data", "listed"),
    [
        ({}, b"", {}),
        (
            {"empty": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}},
            b"",
            {"empty": (torch.float32, (0,))},
        ),
        (
            {"huge_but_empty": {"dtype": "U8", "shape": [0, 2**62, 1], "data_offsets": [0, 0]}},
            b"",
            {"huge_but_empty": (torch.uint8, (0, 2**62, 1))},
        ),
        ({"w": F32}, b"\0" * 4, {"w": (torch.float32, (1,))}),
    ],
    ids=["no-tensors", "zero-length", "zero-dim-times-2**62", "no-metadata"],
)
def test_valid_edge_files_are_listed(
    loader: SeamLoader,
    tmp_path: Path,
    header: dict[str, Any],
    data: bytes,
    listed: dict[str, tuple[torch.dtype, tuple[int, ...]]],
) -> None:
    path = shard(tmp_path / "edge.safetensors", header, data)
    assert dict(loader.inspect_checkpoint(path)) == listed


# --- invalid at the edge: every loader refuses, naming the file -------------------------------

INVALID_ENTRIES = [
    pytest.param({"dtype": "F32", "shape": [1], "data_offsets": [0]}, id="one-offset"),
    pytest.param({"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 4]}, id="three-offsets"),
    pytest.param({"dtype": "F32", "shape": [1], "data_offsets": [0, 4.0]}, id="float-offset"),
    pytest.param({"dtype": "F32", "shape": [1], "data_offsets": [False, 4]}, id="bool-offset"),
    pytest.param({"dtype": "F32", "shape": [1], "data_offsets": "0-4"}, id="offsets-string"),
]


@pytest.mark.rule("CKPT-4")
@pytest.mark.parametrize("entry", INVALID_ENTRIES)
def test_invalid_entries_are_refused_naming_the_tensor(
    loader: SeamLoader, tmp_path: Path, entry: dict[str, Any]
) -> None:
    path = shard(tmp_path / "bad.safetensors", {"weight_x": entry}, b"\0" * 4)
    refusal(lambda: loader.inspect_checkpoint(path), path.name, "weight_x", error=CheckpointError)


@pytest.mark.rule("CKPT-4")
def test_2_to_the_63_elements_are_refused_even_when_empty(
    loader: SeamLoader, tmp_path: Path
) -> None:
    """torch counts elements in int64: a zero-sized dim does not make 2**63 others fit."""
    entry = {"dtype": "U8", "shape": [0, 2**63], "data_offsets": [0, 0]}
    path = shard(tmp_path / "big.safetensors", {"weight_x": entry})
    refusal(lambda: loader.inspect_checkpoint(path), path.name, "weight_x", error=CheckpointError)


@pytest.mark.rule("CKPT-4")
@pytest.mark.parametrize(
    "metadata", [{"format": 1}, {"1": ["pt"]}, "pt", ["format", "pt"]], ids=repr
)
def test_metadata_that_is_not_string_to_string_is_refused(
    loader: SeamLoader, tmp_path: Path, metadata: object
) -> None:
    path = shard(tmp_path / "meta.safetensors", {"__metadata__": metadata, "w": F32}, b"\0" * 4)
    err = refused(loader, path)
    assert "__metadata__" in str(err)


@pytest.mark.rule("CKPT-4")
def test_header_length_near_two_to_the_64_is_refused(loader: SeamLoader, tmp_path: Path) -> None:
    """A length with the top bit set is huge, never negative."""
    path = shard(tmp_path / "neg.safetensors", {"w": F32}, b"\0" * 4, header_len=2**64 - 1)
    refused(loader, path)


@pytest.mark.rule("CKPT-4")
def test_a_path_under_a_file_is_refused(loader: SeamLoader, tmp_path: Path) -> None:
    parent = tmp_path / "plain.txt"
    parent.write_text("not a folder")
    refusal(
        lambda: loader.inspect_checkpoint(parent / "model.safetensors"),
        "model.safetensors",
        error=CheckpointError,
    )


# --- the reference's own header fields and words ----------------------------------------------

ONLY = pytest.mark.reference_only("reads reference.read.header.read_header and pins its wording")


@pytest.mark.rule("CKPT-4")
@ONLY
def test_shard_header_fields(tmp_path: Path) -> None:
    path = shard(
        tmp_path / "one.safetensors", {"__metadata__": {"format": "pt"}, "w": F32}, b"1234"
    )
    header = read_header(path)
    assert header.path == path
    assert header.file_size == os.path.getsize(path)
    assert dict(header.metadata) == {"format": "pt"}
    assert [(t.name, t.start, t.end, t.nbytes) for t in header.tensors] == [
        ("w", header.file_size - 4, header.file_size, 4)
    ]


@pytest.mark.rule("CKPT-4")
@ONLY
def test_header_length_limit_is_inclusive(tmp_path: Path) -> None:
    """MAX_HEADER_BYTES itself passes the length rule (the bytes then fail as JSON); one more
    byte does not. The file is sparse: nothing is written but the length field."""
    for length, problem in [
        (MAX_HEADER_BYTES, "header is not valid JSON"),
        # It fits in the file: the cap is the cause, and the message says so.
        (
            MAX_HEADER_BYTES + 1,
            f"header length {MAX_HEADER_BYTES + 1} is over the cap of {MAX_HEADER_BYTES} bytes",
        ),
    ]:
        path = tmp_path / f"sparse{length}.safetensors"
        with path.open("wb") as f:
            f.write(struct.pack("<Q", length))
            f.truncate(8 + MAX_HEADER_BYTES + 1)
        with pytest.raises(CheckpointError) as caught:
            read_header(path)
        assert caught.value.problem.startswith(problem)
        path.unlink()


def _errors(tmp_path: Path) -> list[Any]:
    p = tmp_path
    four = b"\0" * 4
    f32 = {"dtype": "F32", "shape": [1]}
    return [
        (
            shard(
                p / "gap.safetensors", {"a": F32, "b": {**f32, "data_offsets": [8, 12]}}, four * 3
            ),
            "b",
            "data begins at byte 8 of the data section but the tensors before it end at byte 4:"
            " the data section has a gap; the offsets or the header length are wrong",
        ),
        (
            shard(p / "tail.safetensors", {"a": F32}, four * 2),
            None,
            "data section is 8 bytes but the tensors cover 4: bytes follow the last tensor; the"
            " header length is wrong or the file has bytes appended",
        ),
        (
            shard(
                p / "span.safetensors", {"a": F32, "b": {**f32, "data_offsets": [4, 12]}}, four * 3
            ),
            "b",
            "data_offsets [4, 12] span 8 bytes but shape [1] x F32 needs 4",
        ),
        (
            shard(p / "list.safetensors", {"a": [1, 2]}, four),
            "a",
            "header entry must be an object, got list",
        ),
        (
            shard(p / "short.safetensors", {"a": {**f32, "data_offsets": [0, 8]}}, four),
            "a",
            "data_offsets [0, 8] end beyond the data section (4 bytes); the file is truncated or"
            " the header is wrong",
        ),
        (
            shard(p / "array.safetensors", [1, 2]),
            None,
            "header must be a JSON object, got list",
        ),
        (
            shard(p / "text.safetensors", b"{nope"),
            None,
            "header is not valid JSON (Expecting property name enclosed in double quotes: line 1"
            " column 2 (char 1))",
        ),
        (
            shard(p / "meta.safetensors", {"__metadata__": {"a": 1}}),
            "__metadata__",
            "must be an object of string to string",
        ),
        (
            shard(p / "long.safetensors", {}, header_len=99),
            None,
            "header length 99 exceeds the file (10 bytes); the file is truncated or not a"
            " safetensors file",
        ),
        (
            shard(p / "top.safetensors", {}, header_len=2**64 - 1),
            None,
            "header length 18446744073709551615 exceeds the file (10 bytes); the file is"
            " truncated or not a safetensors file",
        ),
        (p / "missing.safetensors", None, "checkpoint file not found"),
        (
            p / "dir.safetensors",
            None,
            "is not a regular file (a folder, pipe, socket or device); give the checkpoint"
            " file itself",
        ),
        (
            p / "gap.safetensors" / "x.safetensors",
            None,
            "checkpoint file cannot be read (Not a directory)",
        ),
        (
            p / "model.bin",
            None,
            "is a pickle checkpoint; only safetensors is read, because unpickling can run code."
            " Convert it to .safetensors in a trusted environment first",
        ),
    ]


@pytest.mark.rule("CKPT-4", "CKPT-1")
@ONLY
def test_header_errors_name_file_entry_and_problem(tmp_path: Path) -> None:
    (tmp_path / "dir.safetensors").mkdir()
    for path, entry, problem in _errors(tmp_path):
        with pytest.raises(CheckpointError) as caught:
            read_header(path)
        err = caught.value
        assert (err.file, err.entry, err.problem) == (str(path), entry, problem), path.name
        where = str(path) if entry is None else f"{path} [{entry}]"
        assert str(err) == f"{where}: {problem}"


@pytest.mark.rule("CKPT-4")
@ONLY
def test_unknown_dtype_lists_the_known_ones(tmp_path: Path) -> None:
    path = shard(tmp_path / "dtype.safetensors", {"a": {**F32, "dtype": "F7"}}, b"\0" * 4)
    with pytest.raises(CheckpointError) as caught:
        read_header(path)
    assert caught.value.problem.startswith("unknown dtype 'F7'; known: F64, F32, F16, BF16, I64,")


@pytest.mark.rule("CKPT-4")
@ONLY
def test_a_header_nesting_too_deep_names_the_entry(tmp_path: Path) -> None:
    """The nesting refusal names the tensor whose entry nests (the CLI prints it in its line)."""
    raw = json.dumps({"a": F32})[:-1] + ', "w": ' + "[" * 40 + "]" * 40 + "}"
    path = shard(tmp_path / "deep.safetensors", raw.encode(), b"\0" * 4)
    with pytest.raises(CheckpointError) as caught:
        read_header(path)
    assert caught.value.entry == "w", str(caught.value)
    assert "nests deeper than" in caught.value.problem
