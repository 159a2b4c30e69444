"""CKPT: checkpoints and bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from pytest_mock import MockerFixture

from fakes.checkpoints import write_checkpoint
from fakes.corrupt import CASES, write_bad_checkpoint
from fakes.vae import RecordingBuild, StandardVAE, randomized_state
from fakes.vae_checkpoints import ReadLog, write_defective_vae_checkpoint, write_vae_checkpoint
from reference.adapter import CHECKPOINT_SAFETY, VAE_STREAM, LoaderAdapter
from reference.checkpoint import TensorReader, open_checkpoint
from reference.errors import CheckpointError


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(4, 3, generator=g),
        "a.bias": torch.randn(4, generator=g).to(torch.bfloat16),
        "b.index": torch.arange(5, dtype=torch.int64),
        "c.flag": torch.tensor([True, False, True]),
        "d.scale": torch.randn(2, 2, generator=g).to(torch.float8_e4m3fn),
    }


@pytest.mark.rule("CKPT-2")
@pytest.mark.capability(CHECKPOINT_SAFETY)
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_sharded_and_single_checkpoints_read_back_exactly(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path, shards: int
) -> None:
    state = _state()
    path = write_checkpoint(state, tmp_path, shards=shards)
    assert len(list(tmp_path.glob("*.safetensors"))) == shards
    for where in (path, tmp_path):
        listed = loader.inspect_checkpoint(where)
        assert dict(listed) == {n: (t.dtype, tuple(t.shape)) for n, t in state.items()}
        for name in listed:
            tensor = loader.read_checkpoint_tensor(where, name, device=runtime_device)
            assert tensor.device.type == runtime_device.type
            assert tensor.dtype == state[name].dtype
            assert tensor.shape == state[name].shape
            assert torch.equal(tensor.cpu().view(torch.uint8), state[name].view(torch.uint8))


@pytest.mark.internal
def test_checkpoint_sums_its_tensors_bytes(tmp_path: Path) -> None:
    state = _state()
    checkpoint = open_checkpoint(write_checkpoint(state, tmp_path, shards=2))
    assert len(checkpoint.files) == 2
    assert checkpoint.total_bytes == sum(t.numel() * t.element_size() for t in state.values())
    assert checkpoint.largest_tensor_bytes == 48


def _refusal(loader: LoaderAdapter, where: Path) -> CheckpointError:
    with pytest.raises(CheckpointError) as caught:
        loader.inspect_checkpoint(where)
    return caught.value


@pytest.mark.rule("CKPT-2")
@pytest.mark.capability(CHECKPOINT_SAFETY)
def test_index_naming_a_tensor_its_shard_lacks_is_refused(
    loader: LoaderAdapter, tmp_path: Path
) -> None:
    index = write_checkpoint(_state(), tmp_path, shards=2)
    raw = json.loads(index.read_text())
    raw["weight_map"]["ghost.weight"] = raw["weight_map"]["a.weight"]
    index.write_text(json.dumps(raw))
    error = _refusal(loader, index)
    assert (error.file, error.entry) == (str(index), "ghost.weight")


@pytest.mark.rule("CKPT-2")
@pytest.mark.capability(CHECKPOINT_SAFETY)
def test_index_placing_a_tensor_in_the_wrong_shard_is_refused(
    loader: LoaderAdapter, tmp_path: Path
) -> None:
    index = write_checkpoint(_state(), tmp_path, shards=2)
    raw = json.loads(index.read_text())
    raw["weight_map"]["a.weight"], raw["weight_map"]["a.bias"] = (
        raw["weight_map"]["a.bias"],
        raw["weight_map"]["a.weight"],
    )
    index.write_text(json.dumps(raw))
    error = _refusal(loader, index)
    assert error.file == str(index)
    assert error.entry in ("a.weight", "a.bias")


@pytest.mark.rule("CKPT-2")
@pytest.mark.capability(CHECKPOINT_SAFETY)
def test_shard_tensor_missing_from_index_is_refused(loader: LoaderAdapter, tmp_path: Path) -> None:
    index = write_checkpoint(_state(), tmp_path, shards=2)
    raw = json.loads(index.read_text())
    shard = raw["weight_map"].pop("b.index")
    index.write_text(json.dumps(raw))
    error = _refusal(loader, index)
    assert (error.file, error.entry) == (str(tmp_path / shard), "b.index")


@pytest.mark.rule("CKPT-1")
@pytest.mark.capability(CHECKPOINT_SAFETY)
@pytest.mark.parametrize("suffix", [".bin", ".pt", ".pth", ".ckpt"])
def test_pickle_files_are_refused_without_being_opened(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path, suffix: str
) -> None:
    path = tmp_path / f"model{suffix}"
    path.write_bytes(b"not even read")
    for where in (path, tmp_path):
        assert _refusal(loader, where).file == str(path)
        with pytest.raises(CheckpointError, match=re.escape(str(path))):
            loader.read_checkpoint_tensor(where, "a.weight", device=runtime_device)


@pytest.mark.rule("CKPT-4")
@pytest.mark.capability(CHECKPOINT_SAFETY)
@pytest.mark.parametrize("case", sorted(CASES))
def test_corrupt_checkpoint_is_one_clear_error(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path, case: str
) -> None:
    bad = write_bad_checkpoint(case, tmp_path / "ckpt")
    errors = [_refusal(loader, bad.path)]
    with pytest.raises(CheckpointError) as caught:
        loader.read_checkpoint_tensor(bad.path, "proj.weight", device=runtime_device)
    errors.append(caught.value)
    for error in errors:
        assert Path(error.file).name == bad.file
        assert error.entry == bad.entry
        assert bad.file in str(error)
        assert "\n" not in str(error)


@pytest.mark.rule("CKPT-4")
@pytest.mark.capability(CHECKPOINT_SAFETY)
def test_reading_a_name_the_checkpoint_lacks_names_it(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path
) -> None:
    path = write_checkpoint(_state(), tmp_path)
    with pytest.raises(CheckpointError) as caught:
        loader.read_checkpoint_tensor(path, "ghost.weight", device=runtime_device)
    assert (Path(caught.value.file), caught.value.entry) == (path, "ghost.weight")


# --- CKPT-2, CKPT-3 through the VAE streaming loader -----------------------------------------


def _vae_state() -> dict[str, torch.Tensor]:
    return dict(randomized_state(StandardVAE(), 3))


@pytest.mark.rule("CKPT-2")
@pytest.mark.capability(VAE_STREAM)
@pytest.mark.parametrize("shards", [2, 3])
@pytest.mark.parametrize("given", ["index", "folder"])
def test_sharded_vae_checkpoint_streams_like_a_single_file(
    loader: LoaderAdapter,
    runtime_device: torch.device,
    tmp_path: Path,
    *,
    mocker: MockerFixture,
    shards: int,
    given: str,
) -> None:
    state = _vae_state()
    index = write_vae_checkpoint(state, tmp_path / "sharded", shards=shards)
    assert index.name.endswith(".safetensors.index.json")
    single = write_vae_checkpoint(state, tmp_path / "single")
    log = ReadLog()
    mocker.patch.object(TensorReader, "read", log.wrap(TensorReader.read))
    sharded, report = loader.load_vae(
        RecordingBuild(), index if given == "index" else index.parent, device=runtime_device
    )
    assert sorted(log.names) == sorted(state)
    reference, _ = loader.load_vae(RecordingBuild(), single, device=runtime_device)
    expected = reference.state_dict()
    for name, tensor in sharded.state_dict().items():
        assert tensor.dtype == expected[name].dtype, name
        assert torch.equal(
            tensor.cpu().reshape(-1).view(torch.uint8),
            expected[name].cpu().reshape(-1).view(torch.uint8),
        )
    assert report.streamed[0] == len(state)


@pytest.mark.rule("CKPT-2")
@pytest.mark.capability(VAE_STREAM)
def test_index_disagreeing_with_its_shards_fails_before_the_vae_is_built(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path
) -> None:
    index = write_vae_checkpoint(_vae_state(), tmp_path, shards=2)
    raw = json.loads(index.read_text())
    raw["weight_map"]["decoder.ghost.weight"] = raw["weight_map"]["latent_scale"]
    index.write_text(json.dumps(raw))
    build = RecordingBuild()
    with pytest.raises(CheckpointError, match=r"\[decoder\.ghost\.weight\].*header lacks it"):
        loader.load_vae(build, index, device=runtime_device)
    assert build.built == []


@pytest.mark.rule("CKPT-3")
@pytest.mark.capability(VAE_STREAM)
@pytest.mark.parametrize("defect", ["duplicate", "unknown", "missing", "wrong_shape"])
def test_header_mismatch_fails_before_any_tensor_data_is_read(
    loader: LoaderAdapter,
    runtime_device: torch.device,
    tmp_path: Path,
    mocker: MockerFixture,
    defect: str,
) -> None:
    bad = write_defective_vae_checkpoint(defect, _vae_state(), tmp_path)
    log = ReadLog()
    mocker.patch.object(TensorReader, "read", log.wrap(TensorReader.read))
    from_file = mocker.spy(torch.UntypedStorage, "from_file")
    build = RecordingBuild()
    with pytest.raises(ValueError, match=bad.name.replace(".", r"\.")):
        loader.load_vae(build, bad.path, device=runtime_device)
    assert log.names == []
    assert from_file.call_count == 0  # no file was even mapped
    # the module, where one was built, is untouched: every slot still on meta
    assert all(t.is_meta for m in build.built for t in m.state_dict().values())


@pytest.mark.internal
def test_reading_progress_reports_each_tensor_once(tmp_path: Path) -> None:
    from reference.checkpoint import reading_progress

    state = _state()
    reader = TensorReader(open_checkpoint(write_checkpoint(state, tmp_path, shards=2)))
    seen: list[int] = []
    with reading_progress(seen.append):
        for name in reader:
            reader.read(name, device=torch.device("cpu"))
    reader.read("a.weight", device=torch.device("cpu"))  # outside the context: not reported
    assert sorted(seen) == sorted(t.numel() * t.element_size() for t in state.values())
