"""VAE: meta construction and per-tensor streaming."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import safetensors.torch
import torch
from pytest_mock import MockerFixture
from torch import nn

from fakes.vae import (
    CustomLoadVAE,
    Encoder,
    ExplicitBufferVAE,
    ExtraEntryVAE,
    ExtraStateVAE,
    LateParamsVAE,
    LazyVAE,
    OverriddenBatchNormVAE,
    PatchedInstanceVAE,
    RecordingBuild,
    SharedModuleVAE,
    StandardVAE,
    StateDictOverrideVAE,
    TiedVAE,
    UnrebuiltBufferVAE,
    UserHookVAE,
    VAEConfig,
    randomized_state,
)
from fakes.vae_checkpoints import (
    UNKNOWN_NAME,
    ReadLog,
    write_defective_vae_checkpoint,
    write_vae_checkpoint,
)
from reference.adapter import VAE_STREAM, LoaderAdapter
from reference.checkpoint import TensorReader
from reference.errors import (
    ArgumentError,
    CheckpointError,
    ComponentCheckpointUnsupportedError,
    StateDictABIError,
    StateMismatchError,
)
from reference.quantization import QuantizationSpec

pytestmark = pytest.mark.capability(VAE_STREAM)

CONFIG = VAEConfig()


def _state(cls: type[nn.Module] = StandardVAE, seed: int = 0) -> dict[str, torch.Tensor]:
    return dict(randomized_state(cls(CONFIG), seed))


def _log_reads(mocker: MockerFixture) -> ReadLog:
    log = ReadLog()
    mocker.patch.object(TensorReader, "read", log.wrap(TensorReader.read))
    return log


def _on(device: torch.device, tensor: torch.Tensor) -> bool:
    return tensor.device.type == device.type and device.index in (None, tensor.device.index)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def _ordinary(
    state: Mapping[str, torch.Tensor],
    device: torch.device,
    *,
    channels_last_3d: bool = False,
    decode_dtype: torch.dtype | None = None,
) -> StandardVAE:
    """The ordinary path, written with plain torch: construct, load_state_dict, move, policy."""
    model = StandardVAE(CONFIG)
    model.load_state_dict(state)
    model.to(device)
    if channels_last_3d:
        for sub in model.modules():
            if isinstance(sub, nn.Conv3d):
                sub.weight.data = sub.weight.data.contiguous(memory_format=torch.channels_last_3d)
    if decode_dtype is not None:
        model.prepare_decode_dtype(decode_dtype)
    return model.eval()


def _video(device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return torch.randn(1, CONFIG.in_channels, CONFIG.frames, 8, 8, generator=g).to(device)


@pytest.mark.rule("VAE-1", "VAE-13")
def test_streams_one_tensor_at_a_time_into_a_meta_built_module(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path, mocker: MockerFixture
) -> None:
    state = _state()
    path = write_vae_checkpoint(state, tmp_path, shards=2)
    log = _log_reads(mocker)
    whole_file_reads = [
        mocker.spy(safetensors.torch, "load_file"),
        mocker.spy(safetensors.torch, "load"),
        mocker.spy(torch, "load"),
    ]
    build = RecordingBuild()

    module, report = loader.load_vae(build, path, device=runtime_device)

    assert build.built == [module]
    assert build.built_on == [{"meta"}]
    assert sorted(log.names) == sorted(state)
    assert log.alive_at_read == [0] * len(state)  # each tensor dropped before the next read
    assert log.alive == 0
    assert [spy.call_count for spy in whole_file_reads] == [0, 0, 0]
    for name, tensor in module.state_dict().items():
        assert _on(runtime_device, tensor), name
        # its own storage, not a view into a file map or a shared buffer
        assert tensor.untyped_storage().nbytes() == tensor.nbytes, name
    assert report.component == "vae"
    assert {r.how for r in report.records} == {"streamed"}
    assert report.streamed == (len(state), sum(t.nbytes for t in state.values()))


@pytest.mark.rule("VAE-1", "VAE-13")
def test_streamed_vae_decodes_bit_identically_to_an_ordinary_load(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path
) -> None:
    state = _state(seed=1)
    path = write_vae_checkpoint(state, tmp_path)
    module, _ = loader.load_vae(RecordingBuild(), path, device=runtime_device)
    ordinary = _ordinary(state, runtime_device)
    loaded = module.state_dict()
    assert set(loaded) == set(ordinary.state_dict())
    for name, tensor in ordinary.state_dict().items():
        assert loaded[name].dtype == tensor.dtype, name
        assert torch.equal(_bits(loaded[name]), _bits(tensor)), name
    video = _video(runtime_device)
    with torch.no_grad():
        expected = ordinary(video)
        actual = module.eval()(video)
    assert torch.equal(actual, expected)
    assert expected.abs().sum() > 0


@pytest.mark.rule("VAE-2")
@pytest.mark.parametrize(
    ("cls", "words"),
    [
        (StateDictOverrideVAE, ["the root module", "StateDictOverrideVAE", "overrides state_dict"]),
        (PatchedInstanceVAE, ["the root module", "replaces load_state_dict on the instance"]),
    ],
    ids=["class-override", "instance-attribute"],
)
def test_root_with_nonstandard_state_dict_functions_is_refused(
    loader: LoaderAdapter,
    runtime_device: torch.device,
    tmp_path: Path,
    *,
    mocker: MockerFixture,
    cls: type[StandardVAE],
    words: list[str],
) -> None:
    path = write_vae_checkpoint(_state(), tmp_path)
    log = _log_reads(mocker)
    with pytest.raises(StateDictABIError) as caught:
        loader.load_vae(RecordingBuild(cls), path, device=runtime_device)
    for word in words:
        assert word in str(caught.value)
    assert log.names == []


@pytest.mark.rule("VAE-3")
@pytest.mark.parametrize(
    ("cls", "words"),
    [
        (CustomLoadVAE, ["'decoder.conv_in'", "LegacyKeysConv3d", "_load_from_state_dict"]),
        (ExtraEntryVAE, ["'decoder.block.norm2'", "ScaledGroupNorm", "_save_to_state_dict"]),
        (OverriddenBatchNormVAE, ["'encoder.norm'", "LegacyBatchNorm3d", "_load_from_state_dict"]),
        (UserHookVAE, ["'decoder.conv_out'", "user state_dict hook", "rename_keys_hook"]),
    ],
    ids=["load-override", "save-adds-entry", "override-of-torch-override", "user-hook"],
)
def test_submodule_overrides_and_user_hooks_are_refused(
    loader: LoaderAdapter,
    runtime_device: torch.device,
    tmp_path: Path,
    *,
    mocker: MockerFixture,
    cls: type[StandardVAE],
    words: list[str],
) -> None:
    path = write_vae_checkpoint(_state(), tmp_path)
    log = _log_reads(mocker)
    build = RecordingBuild(cls)
    with pytest.raises(StateDictABIError) as caught:
        loader.load_vae(build, path, device=runtime_device)
    for word in words:
        assert word in str(caught.value)
    assert log.names == []
    assert all(p.is_meta for p in build.built[0].parameters())


@pytest.mark.rule("VAE-3", "VAE-4")
def test_torch_shipped_overrides_and_hooks_count_as_standard(loader: LoaderAdapter) -> None:
    with torch.device("meta"):
        model = StandardVAE(CONFIG)
    # The fake really carries torch's own override and hook, so this test can fail.
    bn_load = type(model.encoder.norm)._load_from_state_dict
    assert bn_load is not nn.Module._load_from_state_dict
    assert len(model.decoder.channel_mix._load_state_dict_pre_hooks) == 1
    slots = loader.vae_state_slots(model)
    assert "encoder.norm.num_batches_tracked" in slots
    assert "decoder.channel_mix.parametrizations.weight.original1" in slots


@pytest.mark.rule("VAE-4")
def test_slots_are_parameters_and_persistent_buffers_only(loader: LoaderAdapter) -> None:
    with torch.device("meta"):
        model = StandardVAE(CONFIG)
    expected = {name for name, _ in model.named_parameters()} | {
        "latent_scale",
        "encoder.norm.running_mean",
        "encoder.norm.running_var",
        "encoder.norm.num_batches_tracked",
    }
    slots = loader.vae_state_slots(model)
    assert slots == expected
    assert "decoder.temporal.freqs" not in slots
    assert "decoder.temporal.freqs" in dict(model.named_buffers())


@pytest.mark.rule("VAE-4")
def test_checkpoint_holding_a_non_persistent_buffer_is_refused(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path, mocker: MockerFixture
) -> None:
    state = _state() | {"decoder.temporal.freqs": torch.zeros(CONFIG.frames, CONFIG.hidden)}
    path = write_vae_checkpoint(state, tmp_path)
    log = _log_reads(mocker)
    with pytest.raises(StateMismatchError, match=r"no slot for: decoder\.temporal\.freqs"):
        loader.load_vae(RecordingBuild(), path, device=runtime_device)
    assert log.names == []


@pytest.mark.rule("VAE-4")
def test_lazy_parameters_are_refused_by_name(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path
) -> None:
    path = write_vae_checkpoint(_state(), tmp_path)
    with pytest.raises(StateDictABIError, match=r"decoder\.conv_in\.weight is a Uninitialized"):
        loader.load_vae(RecordingBuild(LazyVAE), path, device=runtime_device)


@pytest.mark.rule("VAE-5")
def test_state_dict_keys_that_are_not_slots_are_listed(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path, mocker: MockerFixture
) -> None:
    path = write_vae_checkpoint(_state(), tmp_path)
    log = _log_reads(mocker)
    with pytest.raises(StateDictABIError) as caught:
        loader.load_vae(RecordingBuild(ExtraStateVAE), path, device=runtime_device)
    assert "keys that are not slots: ['decoder.codebook._extra_state']" in str(caught.value)
    assert "slots missing from the state dict: none" in str(caught.value)
    assert log.names == []


@pytest.mark.rule("VAE-5")
def test_parameters_registered_after_construction_by_a_hook_are_refused(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path
) -> None:
    path = write_vae_checkpoint(_state(), tmp_path)
    with pytest.raises(StateDictABIError) as caught:
        loader.load_vae(RecordingBuild(LateParamsVAE), path, device=runtime_device)
    assert "registered after construction: ['decoder.temporal.gain']" in str(caught.value)


@pytest.mark.rule("VAE-6")
@pytest.mark.parametrize(
    ("cls", "words"),
    [
        (TiedVAE, ["encoder.block.conv1.weight = decoder.block.conv1.weight"]),
        (
            SharedModuleVAE,
            [
                "encoder.block.norm1.weight = decoder.block.norm1.weight",
                "encoder.block.norm1.bias = decoder.block.norm1.bias",
                "encoder.block.norm1 and decoder.block.norm1",
            ],
        ),
    ],
    ids=["tied-parameters", "shared-submodule"],
)
def test_tied_state_is_refused_naming_the_entries(
    loader: LoaderAdapter,
    runtime_device: torch.device,
    tmp_path: Path,
    *,
    mocker: MockerFixture,
    cls: type[StandardVAE],
    words: list[str],
) -> None:
    path = write_vae_checkpoint(_state(cls), tmp_path)
    log = _log_reads(mocker)
    with pytest.raises(StateDictABIError) as caught:
        loader.load_vae(RecordingBuild(cls), path, device=runtime_device)
    for word in words:
        assert word in str(caught.value)
    assert log.names == []


@pytest.mark.rule("VAE-7", "CKPT-3")
@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize(
    ("defect", "error", "words"),
    [
        ("unknown", StateMismatchError, [f"no slot for: {UNKNOWN_NAME}"]),
        ("wrong_shape", StateMismatchError, ["wrong shapes: encoder.conv_in.weight is [8, 81]"]),
        ("duplicate", CheckpointError, ["tensor also present in"]),
    ],
)
def test_unknown_wrong_shape_and_duplicate_tensors_are_refused_by_name(
    loader: LoaderAdapter,
    runtime_device: torch.device,
    tmp_path: Path,
    *,
    mocker: MockerFixture,
    shards: int,
    defect: str,
    error: type[Exception],
    words: list[str],
) -> None:
    bad = write_defective_vae_checkpoint(defect, _state(), tmp_path, shards=shards)
    log = _log_reads(mocker)
    with pytest.raises(error) as caught:
        loader.load_vae(RecordingBuild(), bad.path, device=runtime_device)
    assert bad.name in str(caught.value)
    for word in words:
        assert word in str(caught.value)
    assert log.names == []


@pytest.mark.rule("VAE-7")
def test_dtype_difference_is_converted_to_the_slot_dtype(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path
) -> None:
    state = _state()
    bad = write_defective_vae_checkpoint("dtype", state, tmp_path, shards=1)
    module, report = loader.load_vae(RecordingBuild(), bad.path, device=runtime_device)
    loaded = module.state_dict()[bad.name]
    assert loaded.dtype == torch.float32
    expected = state[bad.name].to(torch.bfloat16).to(torch.float32)
    assert torch.equal(loaded.cpu(), expected)
    assert not torch.equal(loaded.cpu(), state[bad.name])  # the file really held bf16 values
    record = next(r for r in report.records if r.name == bad.name)
    assert record.reason == "dtype torch.bfloat16 converted to torch.float32"


@pytest.mark.rule("VAE-8")
def test_missing_slots_are_listed(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path, mocker: MockerFixture
) -> None:
    bad = write_defective_vae_checkpoint("missing", _state(), tmp_path)
    log = _log_reads(mocker)
    with pytest.raises(StateMismatchError, match=rf"lacks tensors for these slots: {bad.name}\."):
        loader.load_vae(RecordingBuild(), bad.path, device=runtime_device)
    assert log.names == []


@pytest.mark.rule("VAE-8")
def test_nothing_is_left_on_meta(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path
) -> None:
    path = write_vae_checkpoint(_state(), tmp_path)
    module, _ = loader.load_vae(RecordingBuild(), path, device=runtime_device)
    tensors = [*module.named_parameters(), *module.named_buffers()]
    assert len(tensors) == len(_state()) + 1  # every slot, plus the non-persistent buffer
    assert [name for name, t in tensors if t.is_meta or not _on(runtime_device, t)] == []


@pytest.mark.rule("VAE-9")
@pytest.mark.parametrize("cls", [StandardVAE, ExplicitBufferVAE], ids=["hook", "explicit-device"])
def test_non_persistent_buffers_hold_their_constructed_values(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path, cls: type[StandardVAE]
) -> None:
    path = write_vae_checkpoint(_state(), tmp_path)
    build = RecordingBuild(cls)
    module, _ = loader.load_vae(build, path, device=runtime_device)
    assert build.built_on[0] == ({"meta"} if cls is StandardVAE else {"meta", "cpu"})
    ordinary = cls(CONFIG)
    freqs = module.get_buffer("decoder.temporal.freqs")
    assert _on(runtime_device, freqs)
    assert torch.equal(freqs.cpu(), ordinary.get_buffer("decoder.temporal.freqs"))
    assert freqs.abs().sum() > 0


@pytest.mark.rule("VAE-9")
def test_non_persistent_buffer_nothing_rebuilds_fails_the_load_by_name(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path
) -> None:
    path = write_vae_checkpoint(_state(), tmp_path)
    with pytest.raises(StateDictABIError, match=r"buffers decoder\.temporal\.freqs are still on"):
        loader.load_vae(RecordingBuild(UnrebuiltBufferVAE), path, device=runtime_device)


@pytest.mark.rule("VAE-10")
def test_requires_grad_is_kept_and_never_set_on_float8_or_integer(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path
) -> None:
    path = write_vae_checkpoint(_state(), tmp_path)
    module, _ = loader.load_vae(RecordingBuild(), path, device=runtime_device)
    built = dict(StandardVAE(CONFIG).named_parameters())
    assert built["decoder.fp8_bias"].requires_grad  # construction asks for it on float8
    assert not built["latent_shift"].requires_grad
    for name, param in module.named_parameters():
        if param.dtype.is_floating_point and param.dtype != torch.float8_e4m3fn:
            assert param.requires_grad == built[name].requires_grad, name
        else:
            assert not param.requires_grad, name
    assert module.get_parameter("encoder.conv_in.weight").requires_grad
    assert not module.get_parameter("decoder.fp8_bias").requires_grad
    assert not module.get_buffer("encoder.norm.num_batches_tracked").requires_grad


@pytest.mark.rule("VAE-11")
@pytest.mark.parametrize("decode_dtype", [None, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("channels_last_3d", [False, True])
def test_layout_and_decode_dtype_policy_match_the_ordinary_path(
    loader: LoaderAdapter,
    runtime_device: torch.device,
    tmp_path: Path,
    decode_dtype: torch.dtype | None,
    channels_last_3d: bool,
) -> None:
    state = _state(seed=2)
    path = write_vae_checkpoint(state, tmp_path)
    module, report = loader.load_vae(
        RecordingBuild(),
        path,
        device=runtime_device,
        decode_dtype=decode_dtype,
        channels_last_3d=channels_last_3d,
    )
    assert isinstance(module, StandardVAE)
    ordinary = _ordinary(
        state, runtime_device, channels_last_3d=channels_last_3d, decode_dtype=decode_dtype
    )
    for name in ("encoder.block.conv1.weight", "decoder.conv_out.weight"):
        weight = module.get_parameter(name)
        assert weight.is_contiguous(memory_format=torch.channels_last_3d) is channels_last_3d
        assert weight.stride() == ordinary.get_parameter(name).stride()
    held = decode_dtype or torch.float32
    assert module.get_parameter("decoder.conv_in.weight").dtype == held
    assert module.get_parameter("decoder.fp8_bias").dtype == torch.float8_e4m3fn
    assert module.get_parameter("encoder.conv_in.weight").dtype == torch.float32
    video = _video(runtime_device)
    with torch.no_grad():
        assert torch.equal(module.eval()(video), ordinary(video))
    assert ("channels_last_3d" in report.events) is channels_last_3d


@pytest.mark.rule("VAE-11")
def test_decode_dtype_on_a_vae_without_the_hook_is_refused_before_reading(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path, mocker: MockerFixture
) -> None:
    path = write_vae_checkpoint(randomized_state(Encoder(CONFIG), 0), tmp_path)
    log = _log_reads(mocker)
    with pytest.raises(ArgumentError, match=r"decode_dtype=torch\.bfloat16.*prepare_decode_dtype"):
        loader.load_vae(
            lambda: Encoder(CONFIG), path, device=runtime_device, decode_dtype=torch.bfloat16
        )
    assert log.names == []


@pytest.mark.rule("VAE-12")
@pytest.mark.parametrize(
    ("config", "metadata", "quantization", "words"),
    [
        ({"quantization_config": {"quant_method": "fp8"}}, None, None, "quantization_config"),
        ({"_class_name": "AutoencoderKLWan"}, {"quant_method": "fp8"}, None, "quant_method"),
        (None, None, QuantizationSpec("fp8"), "quantization 'fp8'"),
        ({"auto_map": {"AutoModel": "my_vae.MyVAE"}}, None, None, "auto_map"),
    ],
    ids=["config-quantized", "checkpoint-metadata-quantized", "quantization-request", "auto-map"],
)
def test_quantized_or_custom_code_vae_is_refused_without_fallback(
    loader: LoaderAdapter,
    runtime_device: torch.device,
    tmp_path: Path,
    *,
    mocker: MockerFixture,
    config: dict[str, object] | None,
    metadata: dict[str, str] | None,
    quantization: QuantizationSpec | None,
    words: str,
) -> None:
    path = write_vae_checkpoint(_state(), tmp_path, metadata=metadata)
    log = _log_reads(mocker)
    build = RecordingBuild()
    with pytest.raises(ComponentCheckpointUnsupportedError) as caught:
        loader.load_vae(
            build,
            path,
            device=runtime_device,
            component="video_vae",
            config=config,
            quantization=quantization,
        )
    assert isinstance(caught.value, ValueError)
    assert "video_vae" in str(caught.value)
    assert words in str(caught.value)
    assert build.built == []
    assert log.names == []
