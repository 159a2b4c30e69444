"""The reference's checkpoint validation beside safetensors' own `safe_open`, case by case.

The reference keeps its own header parsing only where `safe_open` checks less; this pins where
that is. Every corpus case `safe_open` refuses, the reference refuses too (a `CheckpointError`
naming the file); the cases `safe_open` accepts are exactly `BEYOND_SAFE_OPEN`, each with the
reason the reference refuses it. A safetensors release that starts refusing one of them, or
stops refusing another, fails here, and the project's own checks can shrink or must grow.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors import safe_open

from fakes.corrupt import CASES, write_bad_checkpoint
from reference.errors import CheckpointError
from reference.read.checkpoint import open_checkpoint

pytestmark = pytest.mark.internal

BEYOND_SAFE_OPEN = {
    "name-in-two-shards": "safe_open reads one file; a name in two shards is a checkpoint fault",
    "index-names-missing-shard": "safe_open never reads the shard index",
    "index-disagrees-with-shards": "safe_open never reads the shard index",
    "index-not-json": "safe_open never reads the shard index",
    "index-names-a-folder": "safe_open never reads the shard index",
    "index-duplicate-name": "safe_open never reads the shard index",
    "header-duplicate-name": "safe_open's JSON parser keeps the last of two equal keys",
}


def safetensors_files(path: Path) -> list[Path]:
    """The files `safe_open` would be handed for what a loader is given (file, index, folder)."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin"))
    if path.name.endswith(".index.json"):
        return sorted(p for p in path.parent.iterdir() if p.suffix == ".safetensors")
    return [path]


def safe_open_refuses(path: Path) -> bool:
    for file in safetensors_files(path):
        try:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118  (a handle, not a dict)
                    handle.get_tensor(name)
        except Exception:  # any refusal of safetensors' counts
            return True
    return False


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_reference_refuses_what_safe_open_refuses_and_says_why_beyond_it(
    tmp_path: Path, case: str
) -> None:
    bad = write_bad_checkpoint(case, tmp_path / "case")
    refused_by_safe_open = safe_open_refuses(bad.path)
    assert refused_by_safe_open is (case not in BEYOND_SAFE_OPEN), BEYOND_SAFE_OPEN.get(case)
    with pytest.raises(CheckpointError) as caught:
        open_checkpoint(bad.path)
    assert bad.file in str(caught.value)
