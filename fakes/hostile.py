"""Hostile inputs: files a loader must refuse without hanging, exploding or printing raw bytes.

A sibling of `fakes/corrupt.py`. Those entries are malformed safetensors; these are
what a shared folder, a hostile upload or another filesystem can put where a loader looks: special
files where weights or JSON should be, links that loop or dangle, paths that are not UTF-8, headers
and JSON that are legal but explode when parsed, names carrying control characters, and config.json
values that make a model's constructor ask for terabytes.

`WEIGHT_CASES` write into a checkpoint folder (a corpus checkpoint's, or a corpus pipeline's
emptied component folder, `corpus_pipeline(root, emptied=...)`); `PIPELINE_CASES` break a corpus
pipeline's `model_index.json` or one component's `config.json`. Each returns a `Hostile`: what to
hand the loader and what the one-line refusal must name. `tests/unit/test_hostile_corpus.py`
runs every entry through every loading path and the command line, each attempt in a child
process with a deadline and a memory bound.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from fakes.blocking import make_blocking_file
from fakes.checkpoints import write_checkpoint
from fakes.corrupt import join, small_state, split

__all__ = [
    "PIPELINE_CASES",
    "SIZING_CASES",
    "UNKNOWN_NAME",
    "WEIGHT_CASES",
    "Hostile",
    "write_hostile_json",
    "write_pipeline_case",
    "write_weight_case",
]

UNKNOWN_NAME = "proj.weight\n\x00\x1b[2Kgone"
"""A tensor name with a newline, a NUL and the escape that clears a terminal's line."""


@dataclass(frozen=True)
class Hostile:
    """One hostile input, written.

    Attributes:
        case: the entry's name.
        path: what to hand a checkpoint path (a file, an index or the folder).
        names: texts of which the refusal must contain at least one (the file at fault, as far
            as it can be printed: a name that is not UTF-8 is named by its printable part).
        may_load: the input is well formed enough that loading it is no fault (the entry
            judges only how a refusal is written, if there is one).
        memory: the input makes construction ask for more memory than any host has; the
            refusal may be a MemoryError (a refusal before allocating) as well as a ValueError.
    """

    case: str
    path: Path
    names: tuple[str, ...]
    may_load: bool = False
    memory: bool = False


def _shard(folder: Path) -> Path:
    return write_checkpoint(small_state(), folder)


def _non_utf8_name(folder: Path) -> Hostile:
    folder.mkdir(parents=True, exist_ok=True)
    raw = os.path.join(os.fsencode(folder), b"\xff-model.safetensors")
    with open(raw, "wb") as f:  # a header length far beyond the file
        f.write((1 << 20).to_bytes(8, "little") + b"{}")
    return Hostile("file-name-not-utf8", folder, ("-model.safetensors",))


def _special(kind: str) -> Callable[[Path], Hostile]:
    def write(folder: Path) -> Hostile:
        shard = make_blocking_file(kind, folder / "model.safetensors")
        return Hostile(f"shard-is-a-{kind}", folder, (shard.name,))

    return write


def _link(target: str, case: str) -> Callable[[Path], Hostile]:
    def write(folder: Path) -> Hostile:
        folder.mkdir(parents=True, exist_ok=True)
        link = folder / "model.safetensors"
        link.symlink_to(target)
        # A folder scan that skips what is not a regular file finds no weights: naming the
        # folder then names what is at fault as well.
        return Hostile(case, folder, (link.name, str(folder)))

    return write


def _index(kind: str) -> Callable[[Path], Hostile]:
    def write(folder: Path) -> Hostile:
        shard = _shard(folder)
        shard.rename(folder / "model-00001-of-00001.safetensors")
        index = folder / "model.safetensors.index.json"
        if kind == "sparse-4-gib":
            with index.open("wb") as f:  # 4 GiB that take no disk
                f.truncate(4 * 1024**3)
        else:
            make_blocking_file(kind, index)
        return Hostile(f"index-is-a-{kind}", index, (index.name,))

    return write


def _memory_bomb(folder: Path) -> Hostile:
    """A legal header (60 MB, under the 100 MB bound) whose ignored field parses into ~20
    million Python lists: gigabytes for a loader that parses before it counts."""
    path = _shard(folder)
    header, data = split(path)
    raw = json.dumps(header).encode()
    bomb = b'"__bomb__":[' + b"[]," * 20_000_000 + b"[]],"
    path.write_bytes(join(raw[:1] + bomb + raw[1:], data))
    return Hostile("header-explodes-when-parsed", path, (path.name,))


def _names(names: list[str], case: str) -> Callable[[Path], Hostile]:
    def write(folder: Path) -> Hostile:
        import torch

        state = small_state() | {name: torch.zeros(1) for name in names}
        path = write_checkpoint(state, folder)
        return Hostile(case, path, ("gone",), may_load=True)

    return write


WEIGHT_CASES: dict[str, Callable[[Path], Hostile]] = {
    "file-name-not-utf8": _non_utf8_name,
    "shard-is-a-named-pipe": _special("named-pipe"),
    "shard-is-a-device-file": _special("device-file"),
    "shard-link-loops": _link("model.safetensors", "shard-link-loops"),
    "shard-link-dangles": _link("gone.safetensors", "shard-link-dangles"),
    "index-is-a-named-pipe": _index("named-pipe"),
    "index-is-a-device-file": _index("device-file"),
    "index-is-a-sparse-4-gib": _index("sparse-4-gib"),
    "header-explodes-when-parsed": _memory_bomb,
    "name-with-control-characters": _names([UNKNOWN_NAME], "name-with-control-characters"),
    "a-thousand-unknown-names": _names(
        [f"{UNKNOWN_NAME}.{i}" for i in range(1000)], "a-thousand-unknown-names"
    ),
}
"""Entries written into a checkpoint folder."""


def write_hostile_json(kind: str, path: Path) -> None:
    """Replace the JSON file at `path` with a hostile one: `nested` 100,000 deep, a
    `long-number` of 5000 digits, a `folder`, or a blocking file (`make_blocking_file`)."""
    path.unlink()
    if kind == "nested":
        path.write_bytes(b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    elif kind == "long-number":
        path.write_bytes(b'{"a": ' + b"9" * 5000 + b"}")
    elif kind == "folder":
        path.mkdir()
    else:
        make_blocking_file(kind, path)


def _pipeline_json(case: str, file: str, kind: str) -> Callable[[Path, str], Hostile]:
    def write(root: Path, component: str) -> Hostile:
        path = root / file.format(component=component)
        write_hostile_json(kind, path)
        return Hostile(case, root, (path.name,))

    return write


def _huge_construction(root: Path, component: str) -> Hostile:
    """A config.json asking the class for terabytes: a 4 TiB weight (the VAE) or a 1 TiB
    table computed in `__init__` (the DiT)."""
    config_path = root / component / "config.json"
    config = json.loads(config_path.read_text())
    if config["_class_name"] == "CorpusVAE":
        config["extra_width"] = 1 << 20
    else:
        config["table_length"] = 1 << 38
    config_path.write_text(json.dumps(config))
    return Hostile("config-asks-for-terabytes", root, (component,), memory=True)


def _sized_past_the_checkpoint(root: Path, component: str) -> Hostile:
    """A config.json sizing what no host runs out of at once, yet far past the checkpoint: a
    20000-wide weight (1.6 GB, the VAE; its checkpoint holds no such tensor) or a rotary table
    of 20 million positions derived with `torch.outer` and `.cos()` (2.6 GB, the DiT; no factory
    call asks for it)."""
    config_path = root / component / "config.json"
    config = json.loads(config_path.read_text())
    if config["_class_name"] == "CorpusVAE":
        config["extra_width"] = 20_000
    else:
        config["rope_max_seq_len"] = 20_000_000
    config_path.write_text(json.dumps(config))
    return Hostile("config-sizes-past-the-checkpoint", root, (component,), memory=True)


SIZING_CASES = frozenset({"config-asks-for-terabytes", "config-sizes-past-the-checkpoint"})
"""The `PIPELINE_CASES` whose config.json sizes the build past what its checkpoint explains:
CKPT-6's (a load bounded by its checkpoint), not CKPT-4's."""

PIPELINE_CASES: dict[str, Callable[[Path, str], Hostile]] = {
    **{
        f"{name}-{kind}": _pipeline_json(f"{name}-{kind}", file, kind)
        for name, file in (
            ("model-index", "model_index.json"),
            ("config", "{component}/config.json"),
        )
        for kind in ("nested", "long-number", "folder", "named-pipe", "device-file")
    },
    "config-asks-for-terabytes": _huge_construction,
    "config-sizes-past-the-checkpoint": _sized_past_the_checkpoint,
}
"""Entries written into a corpus pipeline's root, for one of its components."""


def write_weight_case(case: str, folder: Path) -> Hostile:
    """Write `WEIGHT_CASES[case]` into `folder` (skipped where the platform lacks what it
    needs: named pipes, /dev/zero, symbolic links)."""
    if not hasattr(os, "symlink"):
        pytest.skip("needs symbolic links")
    return WEIGHT_CASES[case](folder)


def write_pipeline_case(case: str, root: Path, component: str) -> Hostile:
    """Write `PIPELINE_CASES[case]` into the corpus pipeline at `root`, for `component`."""
    return PIPELINE_CASES[case](root, component)
