"""CKPT-2: an index never reaches outside its folder.

A shard index is a list of file names beside it. One whose shard names leave the index's folder
(`../elsewhere/a.safetensors`, an absolute path) must be refused, also when those names point at
files that exist: a loader that follows them reads whatever another folder holds (a shared
cache, another user's upload) as this checkpoint's weights. The refusal names the index or the
shard; nothing of the outside file is listed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from reference.errors import CheckpointError
from reference.kit.judging.judge import loaded_or_refused
from reference.kit.seam import CHECKPOINT_SAFETY, SeamLoader
from reference.read.checkpoint import INDEX_SUFFIX

pytestmark = [pytest.mark.rule("CKPT-2"), pytest.mark.capability(CHECKPOINT_SAFETY)]


def escaping_index(root: Path, escape: str) -> tuple[Path, Path]:
    """A checkpoint folder whose index places `x` in a shard outside it that exists (reached
    by `..`, or by an absolute path) and `y` in a shard beside it; (the index, the outside
    shard)."""
    outside = root / "elsewhere" / "a.safetensors"
    outside.parent.mkdir(parents=True)
    save_file({"x": torch.full((4,), 7.0)}, str(outside))
    folder = root / "ckpt"
    folder.mkdir()
    save_file({"y": torch.ones(2)}, str(folder / "b.safetensors"))
    shard = "../elsewhere/a.safetensors" if escape == "parent" else str(outside)
    index = folder / f"model{INDEX_SUFFIX}"
    index.write_text(json.dumps({"weight_map": {"x": shard, "y": "b.safetensors"}}))
    return index, outside


@pytest.mark.parametrize("escape", ["parent", "absolute"])
@pytest.mark.parametrize("handed", ["index", "folder"])
def test_an_index_that_names_an_existing_file_outside_its_folder_is_refused(
    loader: SeamLoader, tmp_path: Path, escape: str, handed: str
) -> None:
    index, outside = escaping_index(tmp_path, escape)
    path = index if handed == "index" else index.parent
    listed, refused = loaded_or_refused(lambda: loader.inspect_checkpoint(path), CheckpointError)
    assert refused is not None, (
        f"the index's {escape} shard name was followed out of its folder: listed {listed}"
    )
    message = str(refused)
    assert index.name in message or outside.name in message, (
        f"the refusal names neither the index nor the shard: {message}"
    )
