"""CKPT: checkpoints and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fakes.checkpoints import write_checkpoint
from fakes.corrupt import CASES, write_bad_checkpoint
from fakes.vae import RecordingBuild, StandardVAE, VAEConfig, randomized_state
from fakes.vae_checkpoints import write_defective_vae_checkpoint, write_vae_checkpoint
from reference.errors import CheckpointError
from reference.kit.judging.evidence import (
    DataReads,
    data_bytes,
    evidence_missing,
    safetensors_files,
)
from reference.kit.judging.judge import refusal
from reference.kit.seam import CHECKPOINT_SAFETY, VAE_STREAM, SeamLoader, VaeRequest
from reference.read.checkpoint import TensorReader, open_checkpoint


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
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, shards: int
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
@pytest.mark.reference_only("the reference's own Checkpoint")
def test_checkpoint_sums_its_tensors_bytes(tmp_path: Path) -> None:
    state = _state()
    checkpoint = open_checkpoint(write_checkpoint(state, tmp_path, shards=2))
    assert len(checkpoint.files) == 2
    assert checkpoint.total_bytes == sum(t.numel() * t.element_size() for t in state.values())
    assert checkpoint.largest_tensor_bytes == 48


def _refusal(loader: SeamLoader, where: Path, file: Path, entry: str | None) -> None:
    """inspect_checkpoint refuses with the Protocol's CheckpointError, `file` and `entry` set
    and named in the message."""
    names = (file.name,) if entry is None else (file.name, entry)
    error = refusal(lambda: loader.inspect_checkpoint(where), *names, error=CheckpointError)
    assert isinstance(error, CheckpointError)
    assert (Path(error.file), error.entry) == (file, entry)


@pytest.mark.rule("CKPT-2")
@pytest.mark.capability(CHECKPOINT_SAFETY)
def test_index_naming_a_tensor_its_shard_lacks_is_refused(
    loader: SeamLoader, tmp_path: Path
) -> None:
    index = write_checkpoint(_state(), tmp_path, shards=2)
    raw = json.loads(index.read_text())
    raw["weight_map"]["ghost.weight"] = raw["weight_map"]["a.weight"]
    index.write_text(json.dumps(raw))
    _refusal(loader, index, index, "ghost.weight")


@pytest.mark.rule("CKPT-2")
@pytest.mark.capability(CHECKPOINT_SAFETY)
def test_index_placing_a_tensor_in_the_wrong_shard_is_refused(
    loader: SeamLoader, tmp_path: Path
) -> None:
    index = write_checkpoint(_state(), tmp_path, shards=2)
    raw = json.loads(index.read_text())
    raw["weight_map"]["a.weight"], raw["weight_map"]["a.bias"] = (
        raw["weight_map"]["a.bias"],
        raw["weight_map"]["a.weight"],
    )
    index.write_text(json.dumps(raw))
    error = refusal(lambda: loader.inspect_checkpoint(index), index.name, error=CheckpointError)
    assert isinstance(error, CheckpointError)
    assert error.file == str(index)
    assert error.entry in ("a.weight", "a.bias")
    assert error.entry in str(error)


@pytest.mark.rule("CKPT-2")
@pytest.mark.capability(CHECKPOINT_SAFETY)
def test_shard_tensor_missing_from_index_is_refused(loader: SeamLoader, tmp_path: Path) -> None:
    index = write_checkpoint(_state(), tmp_path, shards=2)
    raw = json.loads(index.read_text())
    shard = raw["weight_map"].pop("b.index")
    index.write_text(json.dumps(raw))
    _refusal(loader, index, tmp_path / shard, "b.index")


@pytest.mark.rule("CKPT-1")
@pytest.mark.capability(CHECKPOINT_SAFETY)
@pytest.mark.parametrize("suffix", [".bin", ".pt", ".pth", ".ckpt"])
def test_pickle_files_are_refused_without_being_opened(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, suffix: str
) -> None:
    path = tmp_path / f"model{suffix}"
    path.write_bytes(b"not even read")
    _refusal(loader, path, path, None)
    # A folder that offers only a pickle: refused naming the pickle or the folder (CKPT-1).
    for call in (
        lambda: loader.inspect_checkpoint(tmp_path),
        lambda: loader.read_checkpoint_tensor(tmp_path, "a.weight", device=runtime_device),
    ):
        error = refusal(call, error=CheckpointError)
        assert isinstance(error, CheckpointError)
        assert Path(error.file) in (path, tmp_path), error
        assert Path(error.file).name in str(error), error
    error = refusal(
        lambda: loader.read_checkpoint_tensor(path, "a.weight", device=runtime_device),
        path.name,
        error=CheckpointError,
    )
    assert isinstance(error, CheckpointError)
    assert error.file == str(path)


@pytest.mark.capability(CHECKPOINT_SAFETY)
@pytest.mark.parametrize(
    "case",
    [
        # A pickle is not corrupt safetensors: refusing it is CKPT-1's.
        pytest.param(case, marks=pytest.mark.rule("CKPT-1" if case == "pickle-bin" else "CKPT-4"))
        for case in sorted(CASES)
    ],
)
def test_corrupt_checkpoint_is_one_clear_error(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, case: str
) -> None:
    bad = write_bad_checkpoint(case, tmp_path / "ckpt")
    errors = [
        refusal(lambda: loader.inspect_checkpoint(bad.path), error=CheckpointError),
        refusal(
            lambda: loader.read_checkpoint_tensor(bad.path, "proj.weight", device=runtime_device),
            error=CheckpointError,
        ),
    ]
    for error in errors:
        assert isinstance(error, CheckpointError)
        assert "\n" not in str(error)
        assert error.entry is None or error.entry in str(error)
        if bad.refused_the_other_way(error):
            # Under an either-or rule, the other branch: the folder refused naming its files.
            assert Path(error.file).name in bad.blamed_the_other_way, (
                f"blames {error.file!r}, not one of {bad.blamed_the_other_way}"
            )
            continue
        other = f" (or each of {bad.or_refused_naming})" if bad.or_refused_naming else ""
        assert bad.file in str(error), f"the refusal does not name {bad.file!r}{other}: {error}"
        assert Path(error.file).name == bad.file, f"blames {error.file!r}, not {bad.file!r}"
        # Where one fault can be told from either side (an overlap), either entry conforms.
        assert error.entry in bad.entries, f"names {error.entry!r}, not one of {bad.entries}"


@pytest.mark.rule("CKPT-4")
@pytest.mark.capability(CHECKPOINT_SAFETY)
def test_reading_a_name_the_checkpoint_lacks_names_it(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    path = write_checkpoint(_state(), tmp_path)
    error = refusal(
        lambda: loader.read_checkpoint_tensor(path, "ghost.weight", device=runtime_device),
        "ghost.weight",
        error=CheckpointError,
    )
    assert isinstance(error, CheckpointError)
    assert (Path(error.file), error.entry) == (path, "ghost.weight")


# --- CKPT-2, CKPT-3 through the VAE streaming loader -----------------------------------------


def _vae_state(config: VAEConfig | None = None) -> dict[str, torch.Tensor]:
    return dict(randomized_state(StandardVAE(config), 3))


@pytest.mark.rule("CKPT-2")
@pytest.mark.capability(VAE_STREAM)
@pytest.mark.parametrize("shards", [2, 3])
@pytest.mark.parametrize("given", ["index", "folder"])
def test_sharded_vae_checkpoint_streams_like_a_single_file(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    *,
    shards: int,
    given: str,
) -> None:
    state = _vae_state()
    index = write_vae_checkpoint(state, tmp_path / "sharded", shards=shards)
    assert index.name.endswith(".safetensors.index.json")
    single = write_vae_checkpoint(state, tmp_path / "single")
    sharded, report = loader.load_vae(
        VaeRequest(
            RecordingBuild(), index if given == "index" else index.parent, device=runtime_device
        )
    )
    reference, _ = loader.load_vae(VaeRequest(RecordingBuild(), single, device=runtime_device))
    expected = reference.state_dict()
    got = sharded.state_dict()
    assert set(got) == set(expected) == set(state)
    for name, tensor in got.items():
        assert tensor.dtype == expected[name].dtype, name
        assert torch.equal(
            tensor.cpu().reshape(-1).view(torch.uint8),
            expected[name].cpu().reshape(-1).view(torch.uint8),
        )
        assert torch.equal(tensor.cpu(), state[name]), name
    assert report.streamed.tensors == len(state)


@pytest.mark.rule("CKPT-2")
@pytest.mark.capability(VAE_STREAM)
def test_index_disagreeing_with_its_shards_fails_before_the_vae_is_built(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    index = write_vae_checkpoint(_vae_state(), tmp_path, shards=2)
    raw = json.loads(index.read_text())
    raw["weight_map"]["decoder.ghost.weight"] = raw["weight_map"]["latent_scale"]
    index.write_text(json.dumps(raw))
    build = RecordingBuild()
    refusal(
        lambda: loader.load_vae(VaeRequest(build, index, device=runtime_device)),
        "decoder.ghost.weight",
        index.name,
    )
    assert build.built == []


@pytest.mark.rule("CKPT-3")
@pytest.mark.capability(VAE_STREAM)
@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("defect", ["duplicate", "unknown", "missing", "wrong_shape"])
def test_header_mismatch_fails_before_any_tensor_data_is_read(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    shards: int,
    defect: str,
) -> None:
    reason = evidence_missing()
    if reason is not None:
        pytest.skip(reason)
    warm = write_vae_checkpoint(_vae_state(), tmp_path / "warm-up")
    loader.load_vae(
        VaeRequest(RecordingBuild(), warm, device=runtime_device)
    )  # lazy imports, not data
    big = VAEConfig(hidden=256)
    bad = write_defective_vae_checkpoint(defect, _vae_state(big), tmp_path / "bad", shards=shards)
    data = data_bytes(*safetensors_files(bad.path))
    assert data >= 16 * 1024**2
    build = RecordingBuild(config=big)
    with DataReads() as reads:
        refusal(
            lambda: loader.load_vae(VaeRequest(build, bad.path, device=runtime_device)), bad.name
        )
    reads.assert_no_data_read(data)
    # the module, where one was built, is untouched: every slot still on meta
    build.assert_untouched()


@pytest.mark.internal
@pytest.mark.reference_only("the reference's own reader")
def test_reading_progress_reports_each_tensor_once(tmp_path: Path) -> None:
    from reference.read.checkpoint import reading_progress

    state = _state()
    reader = TensorReader(open_checkpoint(write_checkpoint(state, tmp_path, shards=2)))
    seen: list[int] = []
    with reading_progress(seen.append):
        for name in reader:
            reader.read(name, device=torch.device("cpu"))
    reader.read("a.weight", device=torch.device("cpu"))  # outside the context: not reported
    assert sorted(seen) == sorted(t.numel() * t.element_size() for t in state.values())


@pytest.mark.internal
@pytest.mark.reference_only("the reference's own streaming reader")
def test_streaming_reader_keeps_no_map_between_reads(tmp_path: Path) -> None:
    from reference.read.checkpoint import StreamingReader

    state = _state()
    reader = StreamingReader(open_checkpoint(write_checkpoint(state, tmp_path, shards=2)))
    for name in reader:
        tensor = reader.read(name, device=torch.device("cpu"))
        assert torch.equal(tensor.view(torch.uint8), state[name].view(torch.uint8))
        assert reader._maps == {}
