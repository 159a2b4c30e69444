"""VAE: meta construction and per-tensor streaming, judged by what a loader does.

Refusals are judged by contract (`reference/kit/judging/judge.py: refusal`: a ValueError, or the
type a rule names, whose message names the offending entry), "nothing read before the refusal"
and "no full state dict" by what the process shows (`reference/kit/judging/evidence.py:
DataReads`) on checkpoints of many MiB. The reference's own wording, error classes and reasons
are pinned only in `reference_only` tests.
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar

import pytest
import torch
from torch import nn

from fakes.pipelines import FakeComponent, PipelineVAE, write_pipeline
from fakes.platform import FakePlatform
from fakes.vae import (
    ABI_FUNCTIONS,
    HOOK_KINDS,
    CustomLoadVAE,
    Encoder,
    ExplicitBufferVAE,
    ExtraEntryVAE,
    ExtraStateVAE,
    HalfDecoderVAE,
    HookedBufferVAE,
    IntegerParameterVAE,
    LateParamsVAE,
    LazyBufferVAE,
    LazyVAE,
    OverriddenBatchNormVAE,
    PatchedInstanceVAE,
    PlainBufferVAE,
    RebuiltBufferVAE,
    RecordingBuild,
    SharedModuleVAE,
    StandardVAE,
    StateDictOverrideVAE,
    TiedBeforeRegistrationVAE,
    TiedBufferVAE,
    TiedVAE,
    UnrebuiltBufferVAE,
    UserHookVAE,
    VAEConfig,
    randomized_state,
    split_state,
    with_inherited_override,
    with_user_hook,
)
from fakes.vae_checkpoints import (
    UNKNOWN_NAME,
    write_defective_vae_checkpoint,
    write_vae_checkpoint,
)
from reference.errors import (
    ArgumentError,
    ComponentCheckpointUnsupportedError,
    StateDictABIError,
    StateMismatchError,
)
from reference.kit.judging.evidence import (
    DataReads,
    data_bytes,
    evidence_missing,
    safetensors_files,
)
from reference.kit.judging.judge import (
    assert_computed_alike,
    assert_identifies,
    assert_names,
    identifies,
    loaded_or_refused,
    refusal,
    tensor_named,
)
from reference.kit.judging.load_paths import MODEL_CLASSES
from reference.kit.seam import (
    PIPELINES,
    VAE_STREAM,
    ComponentRequest,
    SeamLoader,
    ServingOptions,
    VaeRequest,
)
from reference.request.quantization import QuantizationSpec

from .written import copy_of_written

pytestmark = pytest.mark.capability(VAE_STREAM)

CONFIG = VAEConfig()
FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
# Conv3d weights of 6.75 MiB, 27.5 MiB in all: reading any sizeable part of it dwarfs the noise.
BIG = VAEConfig(hidden=256)
MiB = 1024**2
# Python, torch and allocator bookkeeping a stream may add beside its tensors.
SLACK = 8 * MiB
SUBMODULES = ("decoder.block.conv1", "encoder.norm")  # a plain layer; one behind torch's override
# User code, also named like torch.
TORCH_LIKE = ("fakes.vae", "torchx.layers", "torch_ext")


def _state(
    cls: type[nn.Module] = StandardVAE, seed: int = 0, config: VAEConfig = CONFIG
) -> dict[str, torch.Tensor]:
    """The deterministic state of `cls(config)` for `seed`: a copy of each tensor, so a test may
    change what it gets (built once per process: the selftest tier runs this file once per
    broken VAE loader, and the builds and draws took a second of each run)."""
    return {name: tensor.clone() for name, tensor in _drawn_state(cls, seed, config).items()}


@functools.cache
def _drawn_state(cls: type[nn.Module], seed: int, config: VAEConfig) -> Mapping[str, torch.Tensor]:
    return MappingProxyType(dict(randomized_state(cls(config), seed)))


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


@pytest.fixture
def evidence(loader: SeamLoader, runtime_device: torch.device, tmp_path: Path) -> None:
    """Tests judged by what the process read skip, uncredited, where it cannot be seen.

    A small load runs first, so that what a loader does once per process (lazy imports: a meta
    build imports sympy, megabytes of files) is not taken for tensor data.
    """
    reason = evidence_missing()
    if reason is not None:
        pytest.skip(reason)
    warm = copy_of_written("vae-warm-up", tmp_path / "warm-up", _write_warm_up)
    loader.load_vae(VaeRequest(RecordingBuild(), warm / "model.safetensors", device=runtime_device))


def _write_warm_up(folder: Path) -> None:
    write_vae_checkpoint(_state(), folder)


def release_free_memory() -> None:
    """Hand memory freed by earlier tests back to the system, so the peak is measured from the
    memory in use: allocations reusing freed, still resident memory would not show as growth."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        pytest.skip("peak memory growth cannot be measured: no glibc malloc_trim here")
    trim(0)


@pytest.fixture(scope="module")
def big_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`get(cls, shards=1, metadata=None)`: a checkpoint of `cls` built with BIG, written once
    per module (refusal tests never change it)."""
    written: dict[tuple[object, ...], Path] = {}
    values: dict[str, torch.Tensor] = {}

    def get(
        cls: type[nn.Module] = StandardVAE,
        shards: int = 1,
        metadata: dict[str, str] | None = None,
    ) -> Path:
        with torch.device("meta"):  # the shapes only: an ordinary build costs its init
            state, _ = split_state(cls(BIG))
        key = (tuple((n, t.shape, t.dtype) for n, t in state.items()), shards, str(metadata))
        if key not in written:
            folder = tmp_path_factory.mktemp("big")
            if not values:
                values.update(randomized_state(StandardVAE(BIG), 0))
            full = {n: values.get(n, torch.ones(t.shape, dtype=t.dtype)) for n, t in state.items()}
            written[key] = write_vae_checkpoint(full, folder, shards=shards, metadata=metadata)
        return written[key]

    return get


def refused_before_reading(
    call: Callable[[], object],
    checkpoint: Path,
    *names: str,
    error: type[BaseException] = ValueError,
) -> BaseException:
    """`call` refuses (by contract) and reads none of `checkpoint`'s tensor data meanwhile."""
    data = data_bytes(*safetensors_files(checkpoint))
    assert data >= 16 * MiB, "too little data to tell a read from noise"
    with DataReads() as reads:
        raised = refusal(call, *names, error=error)
    reads.assert_no_data_read(data)
    return raised


# --- VAE-1, VAE-13: meta build, one tensor at a time -------------------------------------------


@pytest.mark.rule("VAE-1", "VAE-13")
@pytest.mark.parametrize("shards", [1, 2])
def test_streams_into_a_meta_built_module_each_slot_its_own_tensor(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, shards: int
) -> None:
    state = _state()
    path = write_vae_checkpoint(state, tmp_path, shards=shards)
    build = RecordingBuild()

    module, report = loader.load_vae(VaeRequest(build, path, device=runtime_device))

    assert build.built == [module]
    assert build.built_on == [{"meta"}]  # every parameter and persistent buffer
    loaded = module.state_dict()
    assert set(loaded) == set(state)
    for name, tensor in loaded.items():
        assert _on(runtime_device, tensor), name
        # its own storage, not a view into a file map or a shared buffer
        assert tensor.untyped_storage().nbytes() == tensor.nbytes, name
        assert torch.equal(_bits(tensor), _bits(state[name])), name
    assert report.component == "vae"
    assert {r.how for r in report.records} == {"streamed"}
    assert report.streamed == (len(state), sum(t.nbytes for t in state.values()))


@pytest.mark.rule("VAE-1")
@pytest.mark.parametrize("shards", [1, 3])
def test_stream_never_holds_a_full_state_dict(
    loader: SeamLoader,
    runtime_device: torch.device,
    big_checkpoints: Callable[..., Path],
    evidence: None,
    shards: int,
) -> None:
    """Peak memory over the load: the module's own tensors (when the target is the CPU) plus
    one tensor in flight, never a second copy of the checkpoint (a state dict, or a file map
    whose pages pile up); and each byte of the files is read at most once."""
    path = big_checkpoints(StandardVAE, shards)
    files = safetensors_files(path)
    data = data_bytes(*files)
    state, _ = split_state(StandardVAE(BIG))
    largest = max(t.nbytes for t in state.values())
    assert data >= 4 * largest  # a full state dict would stand out
    release_free_memory()
    with DataReads() as reads:
        module, _ = loader.load_vae(
            VaeRequest(RecordingBuild(config=BIG), path, device=runtime_device)
        )
    on_cpu = sum(t.nbytes for t in module.state_dict().values() if t.device.type == "cpu")
    bound = on_cpu + largest + SLACK
    assert reads.peak_growth < bound, (
        f"resident memory peaked {reads.peak_growth / MiB:.1f} MiB higher; the module holds"
        f" {on_cpu / MiB:.1f} MiB and one tensor is {largest / MiB:.1f} MiB: a full state dict"
        " (or every page of the files) was held at once"
    )
    assert reads.bytes_read < data + SLACK, "tensor data was read more than once"


@pytest.mark.rule("VAE-1", "VAE-13")
def test_streamed_vae_decodes_bit_identically_to_an_ordinary_load(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    state = _state(seed=1)
    path = write_vae_checkpoint(state, tmp_path)
    module, _ = loader.load_vae(VaeRequest(RecordingBuild(), path, device=runtime_device))
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
    assert_computed_alike(actual, expected, what="the decoded video")
    assert expected.abs().sum() > 0


# --- VAE-2, VAE-3: the standard state-dict ABI, on every submodule ----------------------------


# The root's own class overriding `state_dict` is VAE-2's; the other three functions, an override
# patched onto the instance and one inherited from a user base class are VAE-3's.
ROOT_VIOLATIONS = [
    pytest.param(
        StateDictOverrideVAE,
        "state_dict",
        marks=pytest.mark.rule("VAE-2"),
        id="own-class-state_dict",
    ),
    pytest.param(
        PatchedInstanceVAE,
        "load_state_dict",
        marks=pytest.mark.rule("VAE-3"),
        id="instance-load_state_dict",
    ),
    *(
        pytest.param(
            with_inherited_override(f, ""), f, marks=pytest.mark.rule("VAE-3"), id=f"user-base-{f}"
        )
        for f in ABI_FUNCTIONS
    ),
]


@pytest.mark.parametrize(("cls", "function"), ROOT_VIOLATIONS)
def test_root_with_nonstandard_state_dict_functions_is_refused_before_reading(
    loader: SeamLoader,
    runtime_device: torch.device,
    big_checkpoints: Callable[..., Path],
    evidence: None,
    *,
    cls: type[StandardVAE],
    function: str,
) -> None:
    """Refused before a byte is read, naming the overridden function (in any spelling)."""
    path = big_checkpoints(StandardVAE)
    build = RecordingBuild(cls, BIG)
    raised = refused_before_reading(
        lambda: loader.load_vae(VaeRequest(build, path, device=runtime_device)), path
    )
    assert_identifies(raised, function)
    build.assert_untouched()


SUBMODULE_VIOLATIONS = [
    pytest.param(CustomLoadVAE, "decoder.conv_in", "_load_from_state_dict", id="load-override"),
    pytest.param(ExtraEntryVAE, "decoder.block.norm2", "_save_to_state_dict", id="save-override"),
    pytest.param(
        OverriddenBatchNormVAE, "encoder.norm", "_load_from_state_dict", id="override-of-torch's"
    ),
    pytest.param(UserHookVAE, "decoder.conv_out", "rename_keys_hook", id="user-hook"),
    *(
        pytest.param(with_inherited_override(f, path, where), path, f, id=f"{where}-{f}-{path}")
        for f in ABI_FUNCTIONS
        for path in SUBMODULES
        for where in TORCH_LIKE
    ),
    *(
        pytest.param(with_user_hook(kind, path), path or "", kind, id=f"{kind}-{path or 'root'}")
        for kind in HOOK_KINDS
        for path in ("", "decoder.block.conv1")
    ),
]


@pytest.mark.rule("VAE-3")
@pytest.mark.parametrize(("cls", "where", "what"), SUBMODULE_VIOLATIONS)
def test_user_overrides_and_hooks_anywhere_are_refused_before_reading(
    loader: SeamLoader,
    runtime_device: torch.device,
    big_checkpoints: Callable[..., Path],
    evidence: None,
    *,
    cls: type[StandardVAE],
    where: str,
    what: str,
) -> None:
    """An override inherited from a user base class (also one named like torch's packages, also
    behind batch norm's own override) and every kind of state-dict and load-state-dict hook,
    on the root and on a submodule. A hook is named by the kind of hook or by its function."""
    path = big_checkpoints(StandardVAE)
    build = RecordingBuild(cls, BIG)
    names = (where,) if where else ()
    raised = refused_before_reading(
        lambda: loader.load_vae(VaeRequest(build, path, device=runtime_device)), path, *names
    )
    message = str(raised)
    if what in HOOK_KINDS or what.endswith("_hook"):  # by its kind or by its function
        assert "hook" in message.lower() or identifies(message, what), message
    else:
        assert_identifies(raised, what)
    build.assert_untouched()


@pytest.mark.rule("VAE-2", "VAE-3")
@pytest.mark.reference_only("the reference's wording of ABI refusals")
@pytest.mark.parametrize(
    ("cls", "words"),
    [
        (StateDictOverrideVAE, ["the root module", "StateDictOverrideVAE", "overrides state_dict"]),
        (PatchedInstanceVAE, ["the root module", "replaces load_state_dict on the instance"]),
        (CustomLoadVAE, ["'decoder.conv_in'", "LegacyKeysConv3d", "_load_from_state_dict"]),
        (ExtraEntryVAE, ["'decoder.block.norm2'", "ScaledGroupNorm", "_save_to_state_dict"]),
        (OverriddenBatchNormVAE, ["'encoder.norm'", "LegacyBatchNorm3d", "_load_from_state_dict"]),
        (UserHookVAE, ["'decoder.conv_out'", "user state_dict hook", "rename_keys_hook"]),
        (
            with_inherited_override("_load_from_state_dict", "encoder.norm", "torchx.layers"),
            ["'encoder.norm'", "in torchx.layers.UserBase__load_from_state_dict"],
        ),
    ],
)
def test_reference_words_abi_refusals(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    cls: type[StandardVAE],
    words: list[str],
) -> None:
    path = write_vae_checkpoint(_state(), tmp_path)
    error = refusal(
        lambda: loader.load_vae(VaeRequest(RecordingBuild(cls), path, device=runtime_device))
    )
    assert isinstance(error, StateDictABIError)
    for word in words:
        assert word in str(error)


@pytest.mark.rule("VAE-3", "VAE-4")
def test_torch_shipped_overrides_and_hooks_count_as_standard(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    with torch.device("meta"):
        model = StandardVAE(CONFIG)
    # The fake really carries torch's own override and hook, so this test can fail.
    bn_load = type(model.encoder.norm)._load_from_state_dict
    assert bn_load is not nn.Module._load_from_state_dict
    assert len(model.decoder.channel_mix._load_state_dict_pre_hooks) == 1
    slots = loader.vae_state_slots(model)
    assert "encoder.norm.num_batches_tracked" in slots
    assert "decoder.channel_mix.parametrizations.weight.original1" in slots
    state = _state(seed=4)
    module, _ = loader.load_vae(
        VaeRequest(RecordingBuild(), write_vae_checkpoint(state, tmp_path), device=runtime_device)
    )
    original1 = "decoder.channel_mix.parametrizations.weight.original1"
    assert torch.equal(module.state_dict()[original1].cpu(), state[original1])


# --- VAE-4, VAE-5: slots are parameters and persistent buffers --------------------------------


@pytest.mark.rule("VAE-4")
def test_slots_are_parameters_and_persistent_buffers_only(loader: SeamLoader) -> None:
    with torch.device("meta"):
        model = ExplicitBufferVAE(CONFIG)  # its non-persistent table stays real on a meta build
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
def test_checkpoint_holding_a_non_persistent_buffer_is_refused_before_reading(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    evidence: None,
) -> None:
    state = _state(config=BIG) | {"decoder.temporal.freqs": torch.ones(BIG.frames, BIG.hidden)}
    path = write_vae_checkpoint(state, tmp_path)
    build = RecordingBuild(ExplicitBufferVAE, BIG)
    refused_before_reading(
        lambda: loader.load_vae(VaeRequest(build, path, device=runtime_device)),
        path,
        "decoder.temporal.freqs",
    )


# (the module, the lazy slot); the checkpoint holds a tensor of the right size for that slot,
# so only its being lazy is wrong.
LAZY = [
    pytest.param(LazyVAE, "decoder.conv_in.weight", id="lazy-parameter"),
    pytest.param(LazyBufferVAE, "decoder.scale", id="lazy-buffer"),
]


@pytest.mark.rule("VAE-4b")
@pytest.mark.parametrize(("cls", "lazy"), LAZY)
def test_lazy_state_is_refused_by_name_before_reading(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    evidence: None,
    *,
    cls: type[nn.Module],
    lazy: str,
) -> None:
    """A lazy parameter or buffer is settled by its layer's first forward: refused by name
    before any tensor data is read."""
    state = _state(config=BIG)
    state.setdefault(lazy, torch.ones(BIG.hidden))
    path = write_vae_checkpoint(state, tmp_path)
    refused_before_reading(
        lambda: loader.load_vae(VaeRequest(RecordingBuild(cls, BIG), path, device=runtime_device)),
        path,
        lazy,
    )


@pytest.mark.rule("VAE-4b")
@pytest.mark.parametrize(("cls", "lazy"), LAZY)
def test_lazy_state_is_refused_by_the_slot_check_too(
    loader: SeamLoader, cls: type[nn.Module], lazy: str
) -> None:
    with torch.device("meta"):
        model = cls(CONFIG)
    refusal(lambda: loader.vae_state_slots(model), lazy)


@pytest.mark.rule("VAE-5")
def test_state_dict_keys_that_are_not_slots_are_refused_before_reading(
    loader: SeamLoader,
    runtime_device: torch.device,
    big_checkpoints: Callable[..., Path],
    evidence: None,
) -> None:
    path = big_checkpoints(StandardVAE)
    refused_before_reading(
        lambda: loader.load_vae(
            VaeRequest(RecordingBuild(ExtraStateVAE, BIG), path, device=runtime_device)
        ),
        path,
        "decoder.codebook._extra_state",
    )


@pytest.mark.rule("VAE-5")
@pytest.mark.reference_only("the state a reference hook (rebuild_buffers) adds after the stream")
def test_parameters_registered_after_construction_by_a_hook_are_refused(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    path = write_vae_checkpoint(_state(), tmp_path)
    refusal(
        lambda: loader.load_vae(
            VaeRequest(RecordingBuild(LateParamsVAE), path, device=runtime_device)
        ),
        "decoder.temporal.gain",
    )


@pytest.mark.rule("VAE-5")
@pytest.mark.reference_only("the reference's wording of key differences")
def test_reference_lists_key_differences(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    path = write_vae_checkpoint(_state(), tmp_path)
    with pytest.raises(StateDictABIError) as caught:
        loader.load_vae(VaeRequest(RecordingBuild(ExtraStateVAE), path, device=runtime_device))
    assert "keys that are not slots: ['decoder.codebook._extra_state']" in str(caught.value)
    assert "slots missing from the state dict: none" in str(caught.value)
    with pytest.raises(StateDictABIError) as caught:
        loader.load_vae(VaeRequest(RecordingBuild(LateParamsVAE), path, device=runtime_device))
    assert "registered after construction: ['decoder.temporal.gain']" in str(caught.value)


# --- VAE-6: tied state ----------------------------------------------------------------------------


@pytest.mark.rule("VAE-6")
@pytest.mark.parametrize(
    ("cls", "names"),
    [
        (TiedVAE, ["encoder.block.conv1.weight", "decoder.block.conv1.weight"]),
        (
            SharedModuleVAE,
            [
                "encoder.block.norm1.weight",
                "decoder.block.norm1.weight",
                "encoder.block.norm1.bias",
                "decoder.block.norm1.bias",
            ],
        ),
        (TiedBufferVAE, ["latent_scale", "decoder.latent_scale"]),
        (
            TiedBeforeRegistrationVAE,
            ["encoder.block.norm2.weight", "decoder.block.norm2.weight"],
        ),
    ],
    ids=["tied-parameters", "shared-submodule", "tied-buffers", "tied-before-registration"],
)
def test_tied_state_is_refused_naming_the_entries_before_reading(
    loader: SeamLoader,
    runtime_device: torch.device,
    big_checkpoints: Callable[..., Path],
    evidence: None,
    *,
    cls: type[StandardVAE],
    names: list[str],
) -> None:
    path = big_checkpoints(cls)
    refused_before_reading(
        lambda: loader.load_vae(VaeRequest(RecordingBuild(cls, BIG), path, device=runtime_device)),
        path,
        *names,
    )


@pytest.mark.rule("VAE-6")
@pytest.mark.reference_only("the reference's wording of tied entries")
def test_reference_words_tied_groups(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    path = write_vae_checkpoint(_state(SharedModuleVAE), tmp_path)
    with pytest.raises(StateDictABIError) as caught:
        loader.load_vae(VaeRequest(RecordingBuild(SharedModuleVAE), path, device=runtime_device))
    assert "encoder.block.norm1.weight = decoder.block.norm1.weight" in str(caught.value)
    assert "encoder.block.norm1 and decoder.block.norm1" in str(caught.value)


# --- VAE-7, VAE-8, CKPT-3: tensors against slots --------------------------------------------------

TARGETS = {
    "parameter": "decoder.block.conv2.weight",
    "persistent-buffer": "encoder.norm.running_var",
}


@pytest.fixture(scope="module")
def big_state() -> dict[str, torch.Tensor]:
    return _state(config=BIG)


def over_defective_tensors(test: Callable[..., None]) -> Callable[..., None]:
    """`test` for each defect on each target tensor, in one file and across two shards."""
    for mark in (
        pytest.mark.parametrize("defect", ["unknown", "wrong_shape", "duplicate"]),
        pytest.mark.parametrize("target", sorted(TARGETS)),
        pytest.mark.parametrize("shards", [1, 2]),
    ):
        test = mark(test)
    return test


def defective_name(target: str, defect: str) -> str:
    """The tensor the defect is on: the target itself, or a name beside it no slot takes."""
    return f"{TARGETS[target]}_extra" if defect == "unknown" else TARGETS[target]


@pytest.mark.rule("VAE-7")
@over_defective_tensors
def test_unknown_wrong_shape_and_duplicate_tensors_are_refused_by_name(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    *,
    shards: int,
    target: str,
    defect: str,
) -> None:
    """A name seen twice (across shards), a tensor no slot takes, a wrong shape: refused naming
    the tensor (when is CKPT-3's, judged below)."""
    name = defective_name(target, defect)
    bad = write_defective_vae_checkpoint(defect, _state(), tmp_path, shards=shards, name=name)
    refusal(
        lambda: loader.load_vae(VaeRequest(RecordingBuild(), bad.path, device=runtime_device)),
        bad.name,
    )


@pytest.mark.rule("CKPT-3")
@over_defective_tensors
def test_unknown_wrong_shape_and_duplicate_tensors_are_refused_before_reading(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    big_state: dict[str, torch.Tensor],
    evidence: None,
    *,
    shards: int,
    target: str,
    defect: str,
) -> None:
    """The same refusals come before any tensor data is read, the module untouched (what the
    message names is VAE-7's)."""
    name = defective_name(target, defect)
    bad = write_defective_vae_checkpoint(defect, big_state, tmp_path, shards=shards, name=name)
    build = RecordingBuild(config=BIG)
    refused_before_reading(
        lambda: loader.load_vae(VaeRequest(build, bad.path, device=runtime_device)), bad.path
    )
    build.assert_untouched()


@pytest.mark.rule("VAE-7", "CKPT-3")
@pytest.mark.reference_only("the reference's wording and error classes of tensor refusals")
@pytest.mark.parametrize(
    ("defect", "words"),
    [
        ("unknown", [f"no slot for: '{UNKNOWN_NAME}' (in '"]),
        ("wrong_shape", ["wrong shapes: encoder.conv_in.weight is [8, 81]"]),
        ("duplicate", ["tensor also present in"]),
    ],
)
def test_reference_words_tensor_refusals(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    defect: str,
    words: list[str],
) -> None:
    bad = write_defective_vae_checkpoint(defect, _state(), tmp_path)
    error = refusal(
        lambda: loader.load_vae(VaeRequest(RecordingBuild(), bad.path, device=runtime_device))
    )
    for word in words:
        assert word in str(error)
    if defect != "duplicate":
        assert isinstance(error, StateMismatchError)


CONVERSIONS = [
    # (build, tensor, dtype in the file): each converted to the slot's dtype, never reinterpreted
    pytest.param(StandardVAE, "encoder.conv_in.weight", torch.bfloat16, id="f32-slot-bf16-file"),
    pytest.param(HalfDecoderVAE, "decoder.conv_in.weight", torch.bfloat16, id="f16-slot-bf16"),
    pytest.param(StandardVAE, "latent_scale", torch.float16, id="f32-buffer-f16-file"),
    pytest.param(StandardVAE, "encoder.norm.running_mean", torch.int32, id="f32-buffer-i32-file"),
    pytest.param(
        StandardVAE, "encoder.norm.num_batches_tracked", torch.float64, id="i64-buffer-f64-file"
    ),
]


@pytest.mark.rule("VAE-7")
@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize(("cls", "name", "file_dtype"), CONVERSIONS)
def test_dtype_difference_is_converted_to_the_slot_dtype(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    *,
    shards: int,
    cls: type[StandardVAE],
    name: str,
    file_dtype: torch.dtype,
) -> None:
    """Equal element sizes included (f16/bf16, f32/i32, i64/f64): a loader that reinterprets
    the bytes instead of converting the values gets other numbers."""
    state = _state(cls, seed=5)
    if name == "encoder.norm.num_batches_tracked":
        state[name] = torch.tensor(123456, dtype=torch.int64)
    elif file_dtype == torch.int32:
        state[name] = state[name] * 40  # values that survive as distinct integers
    slot_dtype = state[name].dtype
    bad = write_defective_vae_checkpoint(
        "dtype", state, tmp_path, shards=shards, name=name, dtype=file_dtype
    )
    in_file = state[name].to(file_dtype)
    expected = in_file.to(slot_dtype)
    if file_dtype.itemsize == slot_dtype.itemsize:
        assert not torch.equal(_bits(in_file), _bits(expected)), "the case would not tell"
    assert not torch.equal(_bits(state[name]), _bits(torch.zeros_like(state[name])))
    module, _ = loader.load_vae(VaeRequest(RecordingBuild(cls), bad.path, device=runtime_device))
    loaded = module.state_dict()[name]
    assert loaded.dtype == slot_dtype
    assert torch.equal(loaded.cpu(), expected)
    others = {n: t for n, t in module.state_dict().items() if n != name}
    for other, tensor in others.items():
        assert torch.equal(_bits(tensor), _bits(state[other])), other


@pytest.mark.rule("VAE-7")
@pytest.mark.reference_only("the reference's reason strings (ZC-14 style records)")
def test_reference_records_each_conversion(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    bad = write_defective_vae_checkpoint("dtype", _state(), tmp_path, shards=1)
    _, report = loader.load_vae(VaeRequest(RecordingBuild(), bad.path, device=runtime_device))
    record = next(r for r in report.records if r.name == bad.name)
    assert record.reason == "dtype torch.bfloat16 converted to torch.float32"


MISSING = pytest.mark.parametrize(
    "name",
    ["decoder.conv_out.bias", "latent_scale", "encoder.norm.num_batches_tracked"],
    ids=["parameter", "buffer", "integer-buffer"],
)


@pytest.mark.rule("VAE-8")
@pytest.mark.parametrize("shards", [1, 2])
@MISSING
def test_missing_slots_are_refused_by_name(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, *, shards: int, name: str
) -> None:
    """A slot the checkpoint lacks is refused, listing it (when is CKPT-3's, judged below)."""
    bad = write_defective_vae_checkpoint("missing", _state(), tmp_path, shards=shards, name=name)
    refusal(
        lambda: loader.load_vae(VaeRequest(RecordingBuild(), bad.path, device=runtime_device)), name
    )


@pytest.mark.rule("CKPT-3")
@pytest.mark.parametrize("shards", [1, 2])
@MISSING
def test_missing_slots_are_refused_before_reading(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    big_state: dict[str, torch.Tensor],
    evidence: None,
    *,
    shards: int,
    name: str,
) -> None:
    bad = write_defective_vae_checkpoint("missing", big_state, tmp_path, shards=shards, name=name)
    build = RecordingBuild(config=BIG)
    refused_before_reading(
        lambda: loader.load_vae(VaeRequest(build, bad.path, device=runtime_device)), bad.path
    )
    build.assert_untouched()


@pytest.mark.rule("VAE-8")
@pytest.mark.reference_only("the reference's wording and error class of missing slots")
def test_reference_words_missing_slots(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    bad = write_defective_vae_checkpoint("missing", _state(), tmp_path)
    with pytest.raises(StateMismatchError, match=rf"lacks tensors for these slots: '{bad.name}'\."):
        loader.load_vae(VaeRequest(RecordingBuild(), bad.path, device=runtime_device))


@pytest.mark.rule("VAE-8")
def test_nothing_is_left_on_meta(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    path = write_vae_checkpoint(_state(), tmp_path)
    module, _ = loader.load_vae(VaeRequest(RecordingBuild(), path, device=runtime_device))
    tensors = [*module.named_parameters(), *module.named_buffers()]
    assert len(tensors) == len(_state())  # every slot (the standard VAE has no other buffer)
    assert [name for name, t in tensors if t.is_meta or not _on(runtime_device, t)] == []


# --- VAE-9: non-persistent buffers ----------------------------------------------------------------


@pytest.mark.rule("VAE-9")
@pytest.mark.parametrize(
    "cls",
    [HookedBufferVAE, ExplicitBufferVAE, PlainBufferVAE, RebuiltBufferVAE],
    ids=["hook-on-a-real-buffer", "explicit-device", "computed-in-init", "meta-then-hook"],
)
def test_non_persistent_buffers_hold_their_constructed_values(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, cls: type[StandardVAE]
) -> None:
    """After a direct load each buffer equals an ordinary construction's: the table computed in
    `__init__` (a plain meta build leaves it on meta, and nothing rebuilds it) must be built
    real. The one that follows a parameter onto meta comes back real only through a module
    hook (the reference's `rebuild_buffers`): a loader that has no such hook conforms by
    refusing it, naming the buffer (VAE-9: "where neither applies, the load fails")."""
    if cls in (PlainBufferVAE, RebuiltBufferVAE):
        with torch.device("meta"):
            assert cls(CONFIG).get_buffer("decoder.temporal.freqs").is_meta
    path = write_vae_checkpoint(_state(), tmp_path)
    if cls is RebuiltBufferVAE:
        loaded, refused = loaded_or_refused(
            lambda: loader.load_vae(VaeRequest(RecordingBuild(cls), path, device=runtime_device))
        )
        if refused is not None:
            assert_names(refused, "decoder.temporal.freqs")
            return
        assert loaded is not None
        module = loaded[0]
    else:
        module, _ = loader.load_vae(VaeRequest(RecordingBuild(cls), path, device=runtime_device))
    ordinary = cls(CONFIG)
    freqs = module.get_buffer("decoder.temporal.freqs")
    assert not freqs.is_meta, "decoder.temporal.freqs is still on meta after the load"
    assert _on(runtime_device, freqs), f"decoder.temporal.freqs is on {freqs.device}"
    expected = ordinary.get_buffer("decoder.temporal.freqs")
    assert expected.abs().sum() > 0
    assert_computed_alike(freqs, expected, what="buffer decoder.temporal.freqs")
    state = _state(seed=6)
    module, _ = loader.load_vae(
        VaeRequest(
            RecordingBuild(cls),
            write_vae_checkpoint(state, tmp_path / "decode"),
            device=runtime_device,
        )
    )
    ordinary.load_state_dict(state)
    ordinary.to(runtime_device)  # the forward runs on the runtime device on both sides
    with torch.no_grad():
        video = _video(runtime_device)
        assert_computed_alike(
            module.eval()(video), ordinary.eval()(video), what="the decoded video"
        )


@pytest.mark.rule("VAE-9")
def test_buffer_nothing_can_rebuild_is_refused_after_the_build_before_reading(
    loader: SeamLoader,
    runtime_device: torch.device,
    big_checkpoints: Callable[..., Path],
    evidence: None,
) -> None:
    """A buffer that construction itself puts on meta (it follows a parameter's device) and no
    hook rebuilds: refused naming it, right after the meta build, before any tensor data."""
    with torch.device("meta"):
        assert UnrebuiltBufferVAE(CONFIG).get_buffer("decoder.temporal.freqs").is_meta
    path = big_checkpoints(UnrebuiltBufferVAE)
    build = RecordingBuild(UnrebuiltBufferVAE, BIG)
    refused_before_reading(
        lambda: loader.load_vae(VaeRequest(build, path, device=runtime_device)),
        path,
        "decoder.temporal.freqs",
    )
    build.assert_untouched()


@pytest.mark.rule("VAE-9")
def test_a_buffer_its_hook_rebuilds_loads_or_is_refused_before_reading(
    loader: SeamLoader,
    runtime_device: torch.device,
    big_checkpoints: Callable[..., Path],
    evidence: None,
) -> None:
    """Construction leaves `decoder.temporal.freqs` on meta (it follows a parameter's device)
    and the module's own `rebuild_buffers(device)`, two levels below the root, restores it. A
    loader that runs such hooks loads the constructed values; one that does not must refuse
    naming the buffer right after the meta build, before any tensor data is read (VAE-9).
    Catches a loader that runs no hook, or only the root's or its children's, and finds the
    buffer on meta only once every tensor was streamed."""
    path = big_checkpoints(RebuiltBufferVAE)
    data = data_bytes(*safetensors_files(path))
    with DataReads() as reads:
        loaded, refused = loaded_or_refused(
            lambda: loader.load_vae(
                VaeRequest(RecordingBuild(RebuiltBufferVAE, BIG), path, device=runtime_device)
            )
        )
    if refused is not None:
        assert_names(refused, "decoder.temporal.freqs")
        reads.assert_no_data_read(data)
        return
    assert loaded is not None
    freqs = loaded[0].get_buffer("decoder.temporal.freqs")
    assert not freqs.is_meta, "decoder.temporal.freqs is still on meta after the load"
    expected = RebuiltBufferVAE(BIG).get_buffer("decoder.temporal.freqs")
    assert_computed_alike(freqs, expected, what="buffer decoder.temporal.freqs")


@pytest.mark.rule("VAE-9")
@pytest.mark.reference_only("the reference's wording: it suggests dropping the direct flag")
def test_reference_refusal_of_unrebuildable_buffers_says_what_to_do(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    path = write_vae_checkpoint(_state(), tmp_path)
    with pytest.raises(StateDictABIError) as caught:
        loader.load_vae(VaeRequest(RecordingBuild(UnrebuiltBufferVAE), path, device=runtime_device))
    assert "non-persistent buffers decoder.temporal.freqs are on meta" in str(caught.value)
    assert "Drop the direct-loading flag for vae" in str(caught.value)


@pytest.mark.rule("VAE-1", "VAE-9")
@pytest.mark.reference_only("the reference's own meta build")
def test_reference_build_keeps_only_non_persistent_buffers_real() -> None:
    from reference.place.build import build_on_meta

    build = RecordingBuild(PlainBufferVAE)
    module = build_on_meta(build, component="vae")
    assert build.built_on == [{"meta"}]
    assert build.buffers_on == [{"decoder.temporal.freqs": "cpu"}]
    assert torch.equal(
        module.get_buffer("decoder.temporal.freqs"),
        PlainBufferVAE(CONFIG).get_buffer("decoder.temporal.freqs"),
    )
    tied = build_on_meta(TiedBeforeRegistrationVAE, component="vae")
    assert tied.encoder.block.norm2.weight is tied.decoder.block.norm2.weight
    assert tied.encoder.block.norm2.weight.is_meta


REGISTER_BUFFER = vars(nn.Module)["register_buffer"]
REGISTER_PARAMETER = vars(nn.Module)["register_parameter"]


@pytest.mark.rule("VAE-1", "VAE-9")
@pytest.mark.reference_only("the reference's own meta build")
def test_reference_builds_on_meta_in_two_threads_at_once_and_leaves_others_alone() -> None:
    """Two builds running at the same moment in two threads each come out as a meta build
    gives them; a module built meanwhile in a third thread, outside any build, is real; no
    function of torch is replaced while they run."""
    import threading

    from reference.place.build import build_on_meta

    inside, both_inside = threading.Barrier(3), threading.Event()
    results: dict[str, nn.Module] = {}

    def slow(cls: type[StandardVAE], key: str) -> Callable[[], nn.Module]:
        def build() -> nn.Module:
            inside.wait(timeout=30)  # both builds are running now
            both_inside.wait(timeout=30)
            return cls(CONFIG)

        return lambda: results.setdefault(key, build_on_meta(build, component=key))

    threads = [
        threading.Thread(target=slow(PlainBufferVAE, "a")),
        threading.Thread(target=slow(StandardVAE, "b")),
    ]
    for thread in threads:
        thread.start()
    inside.wait(timeout=30)
    outside = StandardVAE(CONFIG)  # built while both builds are active
    # torch itself is unchanged while they run: the build uses torch's registration hooks.
    assert vars(nn.Module)["register_buffer"] is REGISTER_BUFFER
    assert vars(nn.Module)["register_parameter"] is REGISTER_PARAMETER
    both_inside.set()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert not any(t.is_meta for t in outside.state_dict().values())
    for key, cls in (("a", PlainBufferVAE), ("b", StandardVAE)):
        module = results[key]
        assert type(module) is cls
        assert all(t.is_meta for t in split_state(module)[0].values()), key
    assert torch.equal(
        results["a"].get_buffer("decoder.temporal.freqs"),
        PlainBufferVAE(CONFIG).get_buffer("decoder.temporal.freqs"),
    )


class _RecordingLinear(nn.Linear):
    calls: ClassVar[list[str]] = []

    def reset_parameters(self) -> None:
        self.calls.append("reset")  # a subclass's own initialisation always runs


class _LayersAndLateAttributes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.plain = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.recording = _RecordingLinear(4, 4)
        late = nn.Parameter(torch.empty(2, 2))
        self.register_parameter("late", late)
        late.weight_loader = print  # set on the caller's object after registering it
        self.kept = late


@pytest.mark.rule("VAE-1")
@pytest.mark.reference_only("the reference's own meta build")
def test_reference_build_skips_standard_layers_initialisation_only_while_it_runs() -> None:
    """Standard torch layers skip initialising their meta parameters during the build and get
    their own `reset_parameters` back afterwards; a subclass's own initialisation runs; the
    object a constructor registered is the one on meta, with attributes set on it later."""
    from reference.place.build import build_on_meta

    _RecordingLinear.calls.clear()
    module = build_on_meta(_LayersAndLateAttributes, component="vae")
    assert _RecordingLinear.calls == ["reset"]
    for layer in (module.plain, module.norm, module.recording):
        assert "reset_parameters" not in vars(layer)
    assert module.plain.reset_parameters.__func__ is nn.Linear.reset_parameters
    assert module.late is module.kept
    assert module.late.is_meta
    assert module.late.weight_loader is print
    assert all(t.is_meta for t in module.state_dict().values())
    real = nn.Linear(4, 4)  # outside the build, layers initialise as usual
    assert "reset_parameters" not in vars(real)
    assert bool(real.weight.abs().sum() > 0)


class _TensorsHeldElsewhere(nn.Module):
    """Registered tensors that something besides their Python object holds: an autograd graph,
    inference mode, a weak reference."""

    def __init__(self) -> None:
        super().__init__()
        graphed = nn.Parameter(torch.ones(2, 2))
        self.graph = (graphed * graphed).sum()  # the graph keeps the parameter's data too
        self.graphed = graphed
        with torch.inference_mode():
            inferred = torch.zeros(3)
            referenced = torch.zeros(3)
        self.register_buffer("inferred", inferred)
        self.weak = weakref.ref(referenced)
        self.register_buffer("referenced", referenced)
        self.originals = (graphed, inferred, referenced)


@pytest.mark.rule("VAE-1")
@pytest.mark.reference_only("the reference's own meta build")
def test_reference_build_sends_tensors_held_elsewhere_to_meta_too() -> None:
    """A registered tensor some other holder references still ends on meta: in place where torch
    can swap it (the registering object is the module's), else as a meta copy of its class."""
    from reference.place.build import build_on_meta

    module = build_on_meta(_TensorsHeldElsewhere, component="vae")
    graphed, inferred, referenced = module.originals
    assert all(t.is_meta for t in module.state_dict().values())
    assert module.inferred is inferred  # swapped in place
    # Held by an autograd graph, or weakly referenced and inference-only: a meta copy.
    assert module.graphed is not graphed
    assert type(module.graphed) is nn.Parameter
    assert module.referenced is not referenced
    assert module.referenced.shape == referenced.shape


# --- VAE-10: requires_grad -----------------------------------------------------------------------


@pytest.mark.rule("VAE-10")
@pytest.mark.capability(PIPELINES)
def test_streamed_requires_grad_is_the_ordinary_paths_and_never_on_float8(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    """Floating parameters: the streamed path gives the `requires_grad` the same loader's
    ordinary load gives (which value that is, is the loader's choice); float8 and integer
    tensors never require grad, though the fake asks for it on its float8 parameter."""
    built = dict(StandardVAE(CONFIG).named_parameters())
    assert built["decoder.fp8_bias"].requires_grad
    assert not built["latent_shift"].requires_grad
    root = write_pipeline(tmp_path / "pipeline", {"vae": FakeComponent(PipelineVAE, seed=3)})
    args = loader.make_server_args(ServingOptions(runtime_device=runtime_device))
    ordinary = loader.load_pipeline_component(
        ComponentRequest(root, "vae", args, platform=FakePlatform(cuda=False), models=MODEL_CLASSES)
    )
    streamed, _ = loader.load_vae(VaeRequest(PipelineVAE, root / "vae", device=runtime_device))
    wanted = {n: p.requires_grad for n, p in ordinary.named_parameters()}
    for name, param in streamed.named_parameters():
        if param.dtype.is_floating_point and param.dtype not in FLOAT8:
            assert param.requires_grad == wanted[name], (
                f"{name}: streamed requires_grad={param.requires_grad}, the ordinary path gives"
                f" {wanted[name]}"
            )
        else:
            assert not param.requires_grad, f"{name} ({param.dtype}) requires grad"
    # By name: whether it is still a buffer is ZC-15's to judge.
    assert not tensor_named(streamed, "encoder.norm.num_batches_tracked").requires_grad


@pytest.mark.rule("VAE-10")
def test_integer_parameters_never_require_grad(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    state = _state(IntegerParameterVAE)
    state["decoder.codes"] = (torch.arange(CONFIG.hidden) * 3 + 1).to(torch.int32)
    path = write_vae_checkpoint(state, tmp_path)
    module, _ = loader.load_vae(
        VaeRequest(RecordingBuild(IntegerParameterVAE), path, device=runtime_device)
    )
    codes = module.get_parameter("decoder.codes")
    assert codes.dtype == torch.int32
    assert not codes.requires_grad
    assert torch.equal(codes.cpu(), state["decoder.codes"].to(torch.int32))


# --- VAE-11: layout and decode dtype --------------------------------------------------------------


@pytest.mark.rule("VAE-11")
@pytest.mark.parametrize("decode_dtype", [None, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("channels_last_3d", [False, True])
def test_layout_and_decode_dtype_policy_match_the_ordinary_path(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    decode_dtype: torch.dtype | None,
    channels_last_3d: bool,
) -> None:
    state = _state(seed=2)
    path = write_vae_checkpoint(state, tmp_path)
    module, _ = loader.load_vae(
        VaeRequest(
            RecordingBuild(),
            path,
            device=runtime_device,
            decode_dtype=decode_dtype,
            channels_last_3d=channels_last_3d,
        )
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
        assert_computed_alike(module.eval()(video), ordinary(video), what="the decoded video")


@pytest.mark.rule("VAE-11")
@pytest.mark.reference_only("the reference's report events")
def test_reference_reports_the_policy_steps(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    path = write_vae_checkpoint(_state(), tmp_path)
    _, report = loader.load_vae(
        VaeRequest(RecordingBuild(), path, device=runtime_device, channels_last_3d=True)
    )
    assert "channels_last_3d" in report.events


@pytest.mark.rule("VAE-11")
def test_decode_dtype_on_a_vae_without_support_is_skipped_or_refused(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    """A VAE that cannot hold a decode dtype: skipping the step (every weight keeps its dtype)
    and refusing the request (naming it) both conform; converting some weights does not."""
    path = write_vae_checkpoint(randomized_state(Encoder(CONFIG), 0), tmp_path)
    loaded, refused = loaded_or_refused(
        lambda: loader.load_vae(
            VaeRequest(
                lambda: Encoder(CONFIG), path, device=runtime_device, decode_dtype=torch.bfloat16
            )
        )
    )
    if refused is not None:
        assert_names(refused, "decode_dtype")
        return
    assert loaded is not None
    built = {n: p.dtype for n, p in Encoder(CONFIG).named_parameters()}
    changed = {n: p.dtype for n, p in loaded[0].named_parameters() if p.dtype != built[n]}
    assert not changed, f"the decode dtype was half applied: {changed}"


@pytest.mark.rule("VAE-11")
@pytest.mark.reference_only("the reference's wording and error class")
def test_reference_words_the_decode_dtype_refusal(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    path = write_vae_checkpoint(randomized_state(Encoder(CONFIG), 0), tmp_path)
    with pytest.raises(ArgumentError, match=r"decode_dtype=torch\.bfloat16.*prepare_decode_dtype"):
        loader.load_vae(
            VaeRequest(
                lambda: Encoder(CONFIG), path, device=runtime_device, decode_dtype=torch.bfloat16
            )
        )


# --- VAE-12: quantized or custom code -------------------------------------------------------------


QUANTIZED = {"quant_method": "fp8"}
VAE_12 = pytest.mark.rule("VAE-12")
VAE_12B = pytest.mark.rule("VAE-12b")
# What a refusal may call the cause, any one in any spelling: the wording is the loader's.
QUANTIZATION = ("quantization", "quantized", "quantization_config", "quant_method", "fp8")
CUSTOM_CODE = ("auto_map", "custom code", "remote code", "trust_remote_code")


@pytest.mark.parametrize(
    ("config", "metadata", "quantization", "causes", "shards"),
    [
        pytest.param({"quantization_config": QUANTIZED}, None, None, QUANTIZATION, 1, marks=VAE_12),
        pytest.param(None, None, QuantizationSpec("fp8"), QUANTIZATION, 1, marks=VAE_12),
        pytest.param(
            {"auto_map": {"AutoModel": "my_vae.MyVAE"}}, None, None, CUSTOM_CODE, 1, marks=VAE_12
        ),
        # Declared only in the safetensors files' own __metadata__ (config.json says nothing).
        pytest.param(
            {"_class_name": "AutoencoderKLWan"}, QUANTIZED, None, QUANTIZATION, 1, marks=VAE_12B
        ),
        pytest.param(
            {"_class_name": "AutoencoderKLWan"}, QUANTIZED, None, QUANTIZATION, 3, marks=VAE_12B
        ),
    ],
    ids=[
        "config-quantized",
        "quantization-request",
        "auto-map",
        "checkpoint-metadata-quantized",
        "every-shard-metadata-quantized",
    ],
)
def test_quantized_or_custom_code_vae_is_refused_without_fallback(
    loader: SeamLoader,
    runtime_device: torch.device,
    big_checkpoints: Callable[..., Path],
    evidence: None,
    *,
    config: dict[str, object] | None,
    metadata: dict[str, str] | None,
    quantization: QuantizationSpec | None,
    causes: tuple[str, ...],
    shards: int,
) -> None:
    """Refused with the no-fallback error before a byte is read, naming the component and the
    cause (quantization, or custom code) in the loader's own words."""
    path = big_checkpoints(StandardVAE, shards, metadata)
    build = RecordingBuild(config=BIG)
    raised = refused_before_reading(
        lambda: loader.load_vae(
            VaeRequest(
                build,
                path,
                device=runtime_device,
                component="video_vae",
                config=config,
                quantization=quantization,
            )
        ),
        path,
        error=ComponentCheckpointUnsupportedError,
    )
    assert_identifies(raised, "video_vae")
    assert_identifies(raised, *causes)
    assert build.built == []


@pytest.mark.rule("VAE-12b")
def test_quantization_declared_by_a_later_shard_alone_is_refused(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, evidence: None
) -> None:
    """Only the last of three shards declares the quantization in its metadata: a loader that
    reads the first file's metadata alone misses it."""
    state = dict(randomized_state(StandardVAE(BIG), 0))
    path = write_vae_checkpoint(state, tmp_path, shards=3, metadata=QUANTIZED, metadata_in=[2])
    refused_before_reading(
        lambda: loader.load_vae(
            VaeRequest(RecordingBuild(config=BIG), path, device=runtime_device)
        ),
        path,
        "quant_method",
        error=ComponentCheckpointUnsupportedError,
    )
