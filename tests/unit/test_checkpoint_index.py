"""CKPT-2/4, ZC-13 at the checkpoint level: shard indexes, folders, metadata, and the reader.

Loader-neutral tests judge what any loader must do with these files (list or refuse them, naming
the file; never write the file through a tensor it handed out). The reference_only tests pin
the reference's own `open_checkpoint` / `TensorReader`: which shard's metadata a checkpoint
keeps, its exact messages, and that it maps each file once and re-checks it at every read.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from fakes.checkpoints import write_misaligned_checkpoint
from reference.errors import CheckpointError
from reference.kit.judging.judge import assert_names, loaded_or_refused, refusal
from reference.kit.seam import CHECKPOINT_SAFETY, SeamLoader
from reference.read.checkpoint import INDEX_SUFFIX, TensorReader, open_checkpoint

pytestmark = pytest.mark.capability(CHECKPOINT_SAFETY)

ONLY = pytest.mark.reference_only("opens checkpoints with the reference's own reader")


def two_shards(folder: Path, *, index: object | None = None) -> Path:
    """a.safetensors holds `x` (metadata a), b.safetensors holds `y` (metadata b); the index
    maps them (or holds `index` verbatim)."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"x": torch.arange(4.0)}, str(folder / "a.safetensors"), metadata={"from": "a"})
    save_file({"y": torch.ones(2)}, str(folder / "b.safetensors"), metadata={"from": "b"})
    # the layout save_pretrained writes: metadata beside the weight map
    weight_map = {"x": "a.safetensors", "y": "b.safetensors"}
    body = {"metadata": {}, "weight_map": weight_map} if index is None else index
    path = folder / f"model{INDEX_SUFFIX}"
    path.write_text(json.dumps(body))
    return path


def refused(loader: SeamLoader, path: Path, *names: str) -> CheckpointError:
    err = refusal(lambda: loader.inspect_checkpoint(path), *names, error=CheckpointError)
    assert isinstance(err, CheckpointError)
    return err


# --- any loader ----------------------------------------------------------------------------


@pytest.mark.rule("CKPT-2")
def test_an_empty_index_lists_nothing_or_is_refused(loader: SeamLoader, tmp_path: Path) -> None:
    """An index that names no tensor (its folder's shards unlisted) is a checkpoint of nothing,
    or a disagreement refused naming the index: SPEC leaves which; listing the shards' tensors
    anyway is neither."""
    path = two_shards(tmp_path / "ckpt", index={"weight_map": {}})
    listed, refused = loaded_or_refused(lambda: loader.inspect_checkpoint(path), CheckpointError)
    if refused is not None:
        assert_names(refused, path.name)
        return
    assert dict(listed or {}) == {}


@pytest.mark.rule("CKPT-2", "CKPT-4")
@pytest.mark.parametrize(
    ("index", "names"),
    [
        ([1, 2], ["weight_map"]),
        ({"weight_map": ["x", "a.safetensors"]}, ["weight_map"]),
        ({"weight_map": {"x": 1}}, ["weight_map"]),
        ({"weight_map": {"x": ""}}, ["x"]),
        ({"weight_map": {"x": ".."}}, ["x"]),
        ({"weight_map": {"x": "sub/a.safetensors"}}, ["x"]),
    ],
    ids=["list", "map-is-list", "file-not-string", "empty-file", "parent", "subfolder"],
)
def test_malformed_indexes_are_refused(
    loader: SeamLoader, tmp_path: Path, index: object, names: list[str]
) -> None:
    path = two_shards(tmp_path / "ckpt", index=index)
    refused(loader, path, path.name, *names)


@pytest.mark.rule("CKPT-2")
def test_two_indexes_in_one_folder_are_refused(loader: SeamLoader, tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    index = two_shards(folder)
    (folder / f"other{INDEX_SUFFIX}").write_text(index.read_text())
    refused(loader, folder, folder.name)


def unindexed(folder: Path) -> Path:
    """`two_shards` without its index: a folder of two `.safetensors` files."""
    two_shards(folder)
    (folder / f"model{INDEX_SUFFIX}").unlink()
    return folder


@pytest.mark.rule("CKPT-2")
def test_a_folder_of_unindexed_files_is_one_checkpoint_or_refused(
    loader: SeamLoader, tmp_path: Path
) -> None:
    """Read as one checkpoint made of both files, or refused naming them; never read as one of
    them silently (CKPT-2)."""
    folder = unindexed(tmp_path / "ckpt")
    listed, refused_with = loaded_or_refused(
        lambda: loader.inspect_checkpoint(folder), error=CheckpointError
    )
    if refused_with is not None:
        assert_names(refused_with, "a.safetensors", "b.safetensors")
        return
    assert listed is not None
    assert set(listed) == {"x", "y"}, f"read as one of its files: {sorted(listed)}"


@pytest.mark.rule("CKPT-2", "CKPT-4")
def test_a_tensor_in_two_unindexed_files_is_refused(loader: SeamLoader, tmp_path: Path) -> None:
    """Read as one checkpoint, a name in two of its files is a duplicate (CKPT-4), refused
    naming it; refused as unindexed, the refusal names the files."""
    folder = unindexed(tmp_path / "ckpt")
    save_file({"x": torch.zeros(4)}, str(folder / "c.safetensors"))
    error = refused(loader, folder)
    message = str(error)
    if all(f in message for f in ("a.safetensors", "c.safetensors")):
        return  # refused naming the files (as unindexed, or as a duplicate across them)
    # Read as one: the Protocol's error names the duplicate ("x" alone is in many a message).
    assert error.entry == "x", f"names neither the duplicate tensor nor the files: {message}"
    assert Path(error.file).name in ("a.safetensors", "c.safetensors"), message
    assert Path(error.file).name in message, message


@pytest.mark.rule("CKPT-2")
def test_a_missing_index_is_refused(loader: SeamLoader, tmp_path: Path) -> None:
    refused(loader, tmp_path / f"gone{INDEX_SUFFIX}", f"gone{INDEX_SUFFIX}")


@pytest.mark.rule("ZC-13")
def test_writing_to_a_read_tensor_leaves_the_file_unchanged(
    loader: SeamLoader, tmp_path: Path
) -> None:
    path = two_shards(tmp_path / "ckpt")
    shard = path.parent / "a.safetensors"
    before = hashlib.sha256(shard.read_bytes()).hexdigest()
    tensor = loader.read_checkpoint_tensor(path, "x", device=torch.device("cpu"))
    tensor.add_(100.0)
    del tensor
    assert hashlib.sha256(shard.read_bytes()).hexdigest() == before


# --- the reference's own reader --------------------------------------------------------------


@pytest.mark.rule("CKPT-2")
@ONLY
def test_metadata_comes_from_the_first_file(tmp_path: Path) -> None:
    index = two_shards(tmp_path / "ckpt")
    assert dict(open_checkpoint(index).metadata) == {"from": "a"}
    (index.parent / "a.safetensors").rename(index.parent / "0.safetensors")
    index.unlink()
    assert dict(open_checkpoint(index.parent).metadata) == {"from": "a"}
    assert dict(open_checkpoint(index.parent / "b.safetensors").metadata) == {"from": "b"}
    empty = two_shards(tmp_path / "empty", index={"weight_map": {}})
    assert open_checkpoint(empty).metadata == {}


def _errors(tmp_path: Path) -> list[tuple[Path, Path, str | None, str]]:
    """(path opened, file named, entry named, problem) for each index or folder error."""
    shape = "must be an object mapping tensor names to shard files"
    placed = "must be a file name next to the index"
    cases: list[tuple[Path, Path, str | None, str]] = []
    for name, index, entry, problem in [
        ("list", [1], "weight_map", shape),
        ("values", {"weight_map": {"x": 1}}, "weight_map", shape),
        ("empty", {"weight_map": {"x": ""}}, "x", f"shard '' {placed}"),
        ("dot", {"weight_map": {"x": "."}}, "x", f"shard '.' {placed}"),
        (
            "lacks",
            {"weight_map": {"x": "b.safetensors", "y": "b.safetensors"}},
            "x",
            "index places it in b.safetensors, whose header lacks it",
        ),
        (
            "swapped",
            {"weight_map": {"x": "b.safetensors", "y": "a.safetensors"}},
            "x",
            "index places it in b.safetensors, but it is in a.safetensors",
        ),
        (
            "ghost",
            {"weight_map": {"x": "a.safetensors", "y": "c.safetensors"}},
            "y",
            "names shard c.safetensors, which does not exist",
        ),
    ]:
        path = two_shards(tmp_path / name, index=index)
        cases.append((path, path, entry, problem))
    unlisted = two_shards(tmp_path / "unlisted", index={"weight_map": {"x": "a.safetensors"}})
    save_file({"x": torch.arange(4.0), "z": torch.ones(1)}, str(unlisted.parent / "a.safetensors"))
    cases.append(
        (
            unlisted,
            unlisted.parent / "a.safetensors",
            "z",
            "tensor is in a shard but not in the index",
        )
    )
    gone = tmp_path / f"gone{INDEX_SUFFIX}"
    cases.append((gone, gone, None, "index file not found"))
    under = tmp_path / "list" / "a.safetensors" / f"m{INDEX_SUFFIX}"
    cases.append((under, under, None, "index file cannot be read (Not a directory)"))
    twice = tmp_path / "twice"
    twice.mkdir()
    (twice / f"a{INDEX_SUFFIX}").write_text("{}")
    (twice / f"b{INDEX_SUFFIX}").write_text("{}")
    cases.append((twice, twice, None, "holds 2 shard indexes; keep exactly one"))
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "notes.txt").write_text("no weights here")
    cases.append((bare, bare, None, "holds no *.safetensors file"))
    dup = tmp_path / "dup"
    two_shards(dup).unlink()
    save_file({"x": torch.zeros(4)}, str(dup / "c.safetensors"))
    cases.append(
        (
            dup,
            dup / "c.safetensors",
            "x",
            "tensor also present in a.safetensors; each name must live in exactly one shard",
        )
    )
    return cases


@pytest.mark.rule("CKPT-2", "CKPT-4")
@ONLY
def test_checkpoint_errors_name_file_entry_and_problem(tmp_path: Path) -> None:
    for path, file, entry, problem in _errors(tmp_path):
        with pytest.raises(CheckpointError) as caught:
            open_checkpoint(path)
        got = (caught.value.file, caught.value.entry, caught.value.problem)
        assert got == (str(file), entry, problem), path


def _reader(path: Path) -> TensorReader:
    return TensorReader(open_checkpoint(path))


@pytest.mark.rule("CKPT-4")
@ONLY
def test_a_file_truncated_after_its_header_is_refused_at_read(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    save_file({"a": torch.arange(4.0), "b": torch.arange(4.0)}, str(path))
    size = path.stat().st_size
    reader = _reader(path)
    with path.open("r+b") as f:
        f.truncate(size - 1)
    with pytest.raises(CheckpointError) as caught:
        reader.read("b", device=torch.device("cpu"))
    assert (caught.value.file, caught.value.entry, caught.value.problem) == (
        str(path),
        "b",
        f"file is {size - 1} bytes but the tensor ends at byte {size}; it was truncated since"
        " its header was read. Re-open the checkpoint",
    )


@pytest.mark.rule("CKPT-4")
@ONLY
def test_a_file_removed_after_its_header_is_refused_at_read(tmp_path: Path) -> None:
    path = tmp_path / "r.safetensors"
    save_file({"a": torch.arange(4.0)}, str(path))
    reader = _reader(path)
    path.unlink()
    with pytest.raises(CheckpointError) as caught:
        reader.read("a", device=torch.device("cpu"))
    assert (caught.value.file, caught.value.entry, caught.value.problem) == (
        str(path),
        "a",
        "file can no longer be read (No such file or directory); it changed since its header"
        " was read. Re-open the checkpoint",
    )


@pytest.mark.rule("CKPT-4")
@ONLY
def test_each_file_is_mapped_once_and_only_as_the_file_validated(tmp_path: Path) -> None:
    """A file that changed between its header and its map is refused even where its bytes are
    intact (it is not the file validated); once mapped, the map serves later reads."""
    path = tmp_path / "g.safetensors"
    save_file({"a": torch.arange(4.0), "b": torch.arange(4.0)}, str(path))
    whole = path.read_bytes()
    reader = _reader(path)
    b_end = reader.checkpoint.tensors["b"].end
    with path.open("r+b") as f:
        f.truncate(b_end - 1)
    with pytest.raises(CheckpointError) as caught:
        reader.read("a", device=torch.device("cpu"))
    assert (caught.value.file, caught.value.entry) == (str(path), "a")
    assert caught.value.problem.startswith("file changed since its header was read")
    path.write_bytes(whole)  # the same bytes again, written anew
    fresh = _reader(path)
    first = fresh.read("a", device=torch.device("cpu"))
    assert fresh.read("b", device=torch.device("cpu")).data_ptr() == first.data_ptr() + 16
    assert torch.equal(first, torch.arange(4.0))


@pytest.mark.rule("CKPT-4", "ZC-13")
@ONLY
def test_aligned_tensors_are_views_of_the_map_and_misaligned_ones_are_copied(
    tmp_path: Path,
) -> None:
    reader = _reader(write_misaligned_checkpoint(tmp_path / "m.safetensors"))
    cpu = torch.device("cpu")
    for name in ("u8", "f32"):
        assert reader.read(name, device=cpu).data_ptr() == reader.read(name, device=cpu).data_ptr()
    f16 = reader.read("f16", device=cpu)
    assert torch.equal(f16, torch.tensor([1.5, -2.0], dtype=torch.float16))
    assert f16.data_ptr() != reader.read("f16", device=cpu).data_ptr()


@pytest.mark.rule("CKPT-4")
@ONLY
def test_reads_for_another_device_land_there(tmp_path: Path) -> None:
    """`meta` stands for any device but CPU in the CPU tier."""
    reader = _reader(write_misaligned_checkpoint(tmp_path / "d.safetensors"))
    tensor = reader.read("f32", device=torch.device("meta"))
    assert tensor.is_meta
    assert (tensor.dtype, tuple(tensor.shape)) == (torch.float32, (1,))


@pytest.mark.rule("CKPT-4")
@ONLY
def test_a_file_replaced_by_a_folder_cannot_be_mapped(tmp_path: Path) -> None:
    path = tmp_path / "f.safetensors"
    save_file({"a": torch.ones(1)}, str(path))
    reader = _reader(path)
    path.unlink()
    path.mkdir()
    with pytest.raises(CheckpointError) as caught:
        reader.read("a", device=torch.device("cpu"))
    assert (caught.value.file, caught.value.entry) == (str(path), "a")
    # Refused at the open, before any identity is compared: the file is no regular file now.
    assert caught.value.problem.startswith("file was replaced by something that is not a regular")
    assert str(caught.value).startswith(f"{path} [a]: file was replaced")
