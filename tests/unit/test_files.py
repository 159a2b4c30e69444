"""The reference's one way into a small file (reference/files.py): the refusals that no
checkpoint in the hostile corpus reaches, each naming the path and saying what was wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reference.errors import CheckpointError
from reference.files import MAX_JSON_DEPTH, check_json_budget, load_json, open_regular

pytestmark = [
    pytest.mark.internal,
    pytest.mark.reference_only("calls reference/files.py directly and pins its wording"),
]


def test_a_missing_file_is_not_found_by_name(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"model_index\.json not found") as caught:
        open_regular(tmp_path / "model_index.json", what="model_index.json")
    assert str(tmp_path) in str(caught.value)


def test_a_path_through_a_file_cannot_be_opened(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(CheckpointError, match=r"config\.json cannot be opened \(Not a directory"):
        open_regular(tmp_path / "a-file" / "config.json", what="config.json")


def test_a_folder_where_a_file_belongs_is_refused_without_reading(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"is not a regular file"):
        open_regular(tmp_path, what="config.json")
    assert os.listdir(tmp_path) == []


def test_nesting_too_deep_names_the_key_even_past_an_escaped_quote(tmp_path: Path) -> None:
    depth = MAX_JSON_DEPTH + 8
    raw = b'{"ok": "a \\" b", "deep\\"er": ' + b"[" * depth + b"]" * depth + b"}"
    with pytest.raises(CheckpointError, match=r"deep") as caught:
        check_json_budget(tmp_path / "config.json", raw, what="config")
    assert caught.value.entry is not None
    assert caught.value.entry.startswith("deep"), caught.value.entry


def test_a_name_twice_in_one_object_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"names 'dup' twice") as caught:
        load_json(tmp_path / "x.json", b'{"dup": 1, "other": 2, "dup": 3}', "index")
    assert caught.value.entry == "dup"
