"""CKPT: checkpoints and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pytest_mock import MockerFixture

from fakes.checkpoints import write_checkpoint
from fakes.corrupt import CASES, write_bad_checkpoint
from fakes.vae import RecordingBuild, StandardVAE, randomized_state
from fakes.vae_checkpoints import ReadLog, write_defective_vae_checkpoint, write_vae_checkpoint
from reference.adapter import VAE_STREAM, LoaderAdapter
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
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_sharded_and_single_checkpoints_read_back_exactly(tmp_path: Path, shards: int) -> None:
    state = _state()
    path = write_checkpoint(state, tmp_path, shards=shards)
    for where in (path, tmp_path):
        checkpoint = open_checkpoint(where)
        assert set(checkpoint.tensors) == set(state)
        assert len(checkpoint.files) == shards
        reader = TensorReader(checkpoint)
        for name in reader:
            tensor = reader.read(name, device=torch.device("cpu"))
            assert tensor.dtype == state[name].dtype
            assert tensor.shape == state[name].shape
            assert torch.equal(tensor.view(torch.uint8), state[name].view(torch.uint8))
    assert checkpoint.total_bytes == sum(t.numel() * t.element_size() for t in state.values())
    assert checkpoint.largest_tensor_bytes == 48


@pytest.mark.rule("CKPT-2")
def test_index_naming_a_tensor_its_shard_lacks_is_refused(tmp_path: Path) -> None:
    index = write_checkpoint(_state(), tmp_path, shards=2)
    raw = json.loads(index.read_text())
    raw["weight_map"]["ghost.weight"] = raw["weight_map"]["a.weight"]
    index.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"\[ghost.weight\].*header lacks it"):
        open_checkpoint(index)


@pytest.mark.rule("CKPT-2")
def test_index_placing_a_tensor_in_the_wrong_shard_is_refused(tmp_path: Path) -> None:
    index = write_checkpoint(_state(), tmp_path, shards=2)
    raw = json.loads(index.read_text())
    raw["weight_map"]["a.weight"], raw["weight_map"]["a.bias"] = (
        raw["weight_map"]["a.bias"],
        raw["weight_map"]["a.weight"],
    )
    index.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"\[a\.(weight|bias)\]: index places it in"):
        open_checkpoint(index)


@pytest.mark.rule("CKPT-2")
def test_shard_tensor_missing_from_index_is_refused(tmp_path: Path) -> None:
    index = write_checkpoint(_state(), tmp_path, shards=2)
    raw = json.loads(index.read_text())
    del raw["weight_map"]["b.index"]
    index.write_text(json.dumps(raw))
    with pytest.raises(
        CheckpointError, match=r"\[b.index\]: tensor is in a shard but not in the index"
    ):
        open_checkpoint(index)


@pytest.mark.rule("CKPT-1")
@pytest.mark.parametrize("suffix", [".bin", ".pt", ".pth", ".ckpt"])
def test_pickle_files_are_refused_without_being_opened(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"model{suffix}"
    path.write_bytes(b"not even read")
    with pytest.raises(CheckpointError, match="pickle checkpoint; only safetensors is read"):
        open_checkpoint(path)
    with pytest.raises(CheckpointError, match="pickle checkpoint"):
        open_checkpoint(tmp_path)


@pytest.mark.rule("CKPT-4")
@pytest.mark.parametrize("case", sorted(CASES))
def test_corrupt_checkpoint_is_one_clear_error(tmp_path: Path, case: str) -> None:
    bad = write_bad_checkpoint(case, tmp_path / "ckpt")
    with pytest.raises(CheckpointError) as caught:
        open_checkpoint(bad.path)
    error = caught.value
    assert Path(error.file).name == bad.file
    assert error.entry == bad.entry
    assert bad.words in str(error)
    assert bad.file in str(error)


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
