"""ADM-1..5 and DG-6: three-layer admission, the no-fallback error, the device-memory preflight.

Tests marked with the `reference_only` fixture pin the reference's own loader classes and rule
table (spies on its hooks, its fallback path); they skip for another loader under test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pytest_mock import MockerFixture
from safetensors.torch import load_file

from fakes.checkpoints import write_checkpoint
from fakes.pipelines import FULL_PIPELINE, SMALL_PIPELINE, write_pipeline
from fakes.platform import FakePlatform
from reference.adapter import ADMISSION, CLI_ARGS, PIPELINES, LoaderAdapter
from reference.args import ServerArgsLike
from reference.errors import ComponentCheckpointUnsupportedError, DeviceMemoryError
from reference.reference_adapter import ReferenceAdapter

ACCEL = torch.device("cuda", 0)
CUDA = FakePlatform(cuda=True)


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu().reshape(-1).view(torch.uint8)


SEL = "--component-direct-gpu-weight-loading"
CCUE = ComponentCheckpointUnsupportedError

pytestmark = pytest.mark.capability(CLI_ARGS, ADMISSION, PIPELINES)


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pipeline declaring transformer, transformer_2, vae, video_vae, audio_vae and vocoder."""
    return write_pipeline(tmp_path_factory.mktemp("pipeline"))


@pytest.fixture
def reference_only(loader: LoaderAdapter) -> None:
    if not isinstance(loader, ReferenceAdapter):
        pytest.skip("pins the reference's own loader classes and rule table")


def _select(
    loader: LoaderAdapter, *names: str, device: torch.device = ACCEL, **options: Any
) -> ServerArgsLike:
    return loader.make_server_args(
        runtime_device=device,
        component_direct_gpu_weight_loading=dict.fromkeys(names, True),
        **options,
    )


# --- ADM-1: the pipeline gate ---------------------------------------------------------------------


@pytest.mark.rule("ADM-1")
def test_undeclared_selections_are_all_listed(loader: LoaderAdapter, pipeline_dir: Path) -> None:
    args = _select(loader, "vae", "text_encoder", "image-encoder")
    # No CUDA either: the pipeline gate answers first, naming every unknown component.
    with pytest.raises(ValueError, match=r"model_index\.json does not declare") as info:
        loader.admit(pipeline_dir, args, platform=FakePlatform(cuda=False))
    message = str(info.value)
    assert f"{SEL}.text_encoder" in message
    assert f"{SEL}.image_encoder" in message
    assert "model_index.json" in message
    assert f"{SEL}.vae " not in message


@pytest.mark.rule("ADM-1")
def test_declared_selections_and_unselected_unknowns_pass(
    loader: LoaderAdapter, pipeline_dir: Path
) -> None:
    args = loader.make_server_args(
        runtime_device=ACCEL,
        component_direct_gpu_weight_loading={"vae": True, "video-vae": True, "nope": False},
    )
    loader.admit(pipeline_dir, args, platform=CUDA)


@pytest.mark.rule("ADM-1", "DG-7")
def test_dit_flag_without_a_transformer_is_refused(loader: LoaderAdapter, tmp_path: Path) -> None:
    root = write_pipeline(tmp_path, {"vocoder": FULL_PIPELINE["vocoder"]})
    args = loader.make_server_args(runtime_device=ACCEL, direct_gpu_weight_loading=True)
    with pytest.raises(ValueError, match=r"--direct-gpu-weight-loading.*declares none"):
        loader.admit(root, args, platform=CUDA)


# --- ADM-2: the arguments gate --------------------------------------------------------------------


@pytest.mark.rule("ADM-2")
@pytest.mark.parametrize(
    ("options", "platform", "words"),
    [
        ({}, FakePlatform(cuda=False), r"'video_vae' needs CUDA"),
        ({"device": torch.device("cpu")}, CUDA, r"'video_vae' needs a CUDA runtime device"),
        (
            {"component_cpu_offload": {"video-vae": True}},
            CUDA,
            r"'video_vae' is offloaded.*--component-cpu-offload\.video_vae",
        ),
    ],
    ids=["no-cuda", "cpu-runtime", "offloaded"],
)
def test_selected_component_needs_cuda_and_residency(
    loader: LoaderAdapter,
    pipeline_dir: Path,
    options: dict[str, object],
    platform: FakePlatform,
    words: str,
) -> None:
    args = _select(loader, "video_vae", **options)
    with pytest.raises(ValueError, match=words) as info:
        loader.admit(pipeline_dir, args, platform=platform)
    assert f"{SEL}.video_vae" in str(info.value)
    assert "drop" in str(info.value)


@pytest.mark.rule("ADM-2")
def test_component_selection_needs_only_cuda_and_residency(
    loader: LoaderAdapter, pipeline_dir: Path
) -> None:
    # FSDP, TP and DiT offload concern the DiT; a resident VAE on CUDA is admitted beside them.
    args = _select(loader, "vae", fsdp_inference=True, tp_size=2, dit_cpu_offload=True)
    loader.admit(pipeline_dir, args, platform=CUDA)


# --- ADM-3: the loader gate -----------------------------------------------------------------------


@pytest.mark.rule("ADM-3")
@pytest.mark.parametrize(
    ("kind", "component", "supported"),
    [
        ("vae", "vae", True),
        ("vae", "video_vae", True),
        ("vae", "audio_vae", False),
        ("vocoder", "vocoder", False),
        ("transformer", "transformer", True),
        ("transformer", "transformer_2", True),
        ("transformer", "vae", False),
    ],
)
def test_declared_direct_support(
    loader: LoaderAdapter, kind: str, component: str, supported: bool
) -> None:
    assert loader.loader_supports_direct(kind, component) is supported


def _break_weights(root: Path, component: str) -> None:
    for weights in (root / component).glob("*.safetensors"):
        weights.write_bytes(b"\x00not a checkpoint")


@pytest.mark.rule("ADM-3", "ADM-5")
@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_unsupported_request_is_refused_before_any_weight_is_touched(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path, damage: str
) -> None:
    root = write_pipeline(tmp_path, {"vocoder": FULL_PIPELINE["vocoder"]})
    if damage == "corrupt":
        _break_weights(root, "vocoder")
    else:
        for weights in (root / "vocoder").glob("*.safetensors"):
            weights.unlink()
    args = _select(loader, "vocoder", device=runtime_device)
    with pytest.raises(CCUE, match=rf"{SEL}\.vocoder.*'vocoder'.*drop") as info:
        loader.load_pipeline_component(root, "vocoder", args, platform=CUDA)
    assert type(info.value) is CCUE  # not a checkpoint error from reading first


@pytest.mark.rule("ADM-3")
def test_without_the_flag_the_same_loader_loads(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path
) -> None:
    root = write_pipeline(tmp_path, {"vocoder": FULL_PIPELINE["vocoder"]})
    for args in (
        loader.make_server_args(runtime_device=runtime_device),
        loader.make_server_args(runtime_device=runtime_device, direct_gpu_weight_loading=True),
    ):
        module = loader.load_pipeline_component(root, "vocoder", args, platform=CUDA)
        state = module.state_dict()
        assert set(state) == {"up.weight", "up.bias", "conv.weight", "conv.bias", "gain"}
        assert all(t.device.type == runtime_device.type for t in state.values())
        written = load_file(root / "vocoder" / "diffusion_pytorch_model.safetensors")
        assert all(torch.equal(state[k].cpu(), written[k]) for k in written)


@pytest.mark.rule("ADM-3")
def test_gate_runs_before_hooks_and_file_access(
    reference_only: None, pipeline_dir: Path, mocker: MockerFixture
) -> None:
    from reference import loaders
    from reference.args import ServerArgs
    from reference.pipeline import read_pipeline

    spec = read_pipeline(pipeline_dir).component("vocoder")
    loader = loaders.VocoderLoader(platform=CUDA)
    spies = [
        mocker.spy(loader, name)
        for name in ("fsdp_enabled", "quantization_for", "plan_for", "load_component")
    ]
    opened = mocker.spy(loaders, "open_checkpoint")
    io_open = mocker.spy(Path, "open")
    args = ServerArgs(runtime_device=ACCEL, component_direct_gpu_weight_loading={"vocoder": True})
    with pytest.raises(CCUE, match="the vocoder loader cannot load"):
        loader.load(spec, args)
    assert [s.call_count for s in spies] == [0, 0, 0, 0]
    assert (opened.call_count, io_open.call_count) == (0, 0)


@pytest.mark.rule("ADM-3")
@pytest.mark.parametrize(
    ("support", "component", "flag_options", "answer"),
    [
        ("vae", "audio_vae", {"component_direct_gpu_weight_loading": {"audio_vae": True}}, None),
        ("vae", "video_vae", {"component_direct_gpu_weight_loading": {"video-vae": True}}, True),
        ("vae", "vae", {"direct_gpu_weight_loading": True}, False),
        ("transformer", "transformer_2", {"direct_gpu_weight_loading": True}, True),
        (
            "transformer",
            "transformer",
            {"component_direct_gpu_weight_loading": {"transformer": True}},
            None,
        ),
        ("vocoder", "vocoder", {"direct_gpu_weight_loading": True}, False),
    ],
)
def test_loader_gate_answers_per_component(
    reference_only: None,
    support: str,
    component: str,
    flag_options: dict[str, Any],
    answer: bool | None,
) -> None:
    """None: refused; otherwise whether a direct load was asked for (and admitted)."""
    from reference.admission import check_loader
    from reference.args import ServerArgs
    from reference.loaders import DIRECT_SUPPORT

    args = ServerArgs(runtime_device=ACCEL, **flag_options)
    if answer is None:
        with pytest.raises(CCUE, match=f"the {support} loader cannot load component '{component}'"):
            check_loader(DIRECT_SUPPORT[support], component, args, loader=support)
    else:
        assert check_loader(DIRECT_SUPPORT[support], component, args, loader=support) is answer


# --- ADM-4: one table serves all three gates ------------------------------------------------------


@pytest.mark.rule("ADM-4")
def test_every_gate_reads_the_one_table(reference_only: None, mocker: MockerFixture) -> None:
    from reference import admission
    from reference.args import ServerArgs
    from reference.errors import LoadError

    def refuse(request: admission.DirectRequest, facts: admission.Facts) -> str:
        return f"refused {request.component} by the one table"

    veto = admission.AdmissionRule(
        "veto", ("ADM-4",), frozenset({"pipeline", "arguments", "loader"}), LoadError, refuse
    )
    mocker.patch.object(admission, "ADMISSION_RULES", (veto,))
    args = ServerArgs(runtime_device=ACCEL, component_direct_gpu_weight_loading={"vae": True})
    gates = [
        lambda: admission.check_pipeline(args, declared=("vae",)),
        lambda: admission.check_arguments(args, platform=CUDA, declared=("vae",)),
        lambda: admission.check_loader(admission.NO_DIRECT_SUPPORT, "vae", args, loader="x"),
    ]
    for gate in gates:
        with pytest.raises(LoadError, match=r"^refused vae by the one table$"):
            gate()


@pytest.mark.rule("ADM-4", "DG-3")
def test_quantized_direct_dit_is_one_rule_at_every_gate(reference_only: None) -> None:
    from reference import admission
    from reference.args import ServerArgs
    from reference.loaders import TRANSFORMER_DIRECT_SUPPORT
    from reference.quantization import QuantizationSpec

    fp8 = QuantizationSpec("fp8")
    by_flag = ServerArgs(runtime_device=ACCEL, direct_gpu_weight_loading=True, quantization=fp8)
    plain = ServerArgs(runtime_device=ACCEL, direct_gpu_weight_loading=True)
    in_config = {"transformer": QuantizationSpec("fp8", serialized=True)}
    refusals = []
    for gate in (
        lambda: admission.check_pipeline(by_flag, declared=("transformer",)),
        lambda: admission.check_arguments(by_flag, platform=CUDA),
        lambda: admission.check_loader(
            TRANSFORMER_DIRECT_SUPPORT, "transformer", by_flag, loader="transformer"
        ),
    ):
        with pytest.raises(CCUE) as info:
            gate()
        refusals.append(str(info.value))
    assert len(set(refusals)) == 1
    assert "--quantization fp8" in refusals[0]
    for gate in (
        lambda: admission.check_pipeline(
            plain, declared=("transformer",), checkpoint_quantization=in_config
        ),
        lambda: admission.check_loader(
            TRANSFORMER_DIRECT_SUPPORT,
            "transformer",
            plain,
            loader="transformer",
            checkpoint_quantization=in_config["transformer"],
        ),
    ):
        with pytest.raises(CCUE, match=r"its config\.json declares quantization 'fp8'"):
            gate()
    rule = next(r for r in admission.ADMISSION_RULES if "DG-3" in r.contract)
    assert all(rule in admission.rules_for(gate) for gate in ("pipeline", "arguments", "loader"))


@pytest.mark.rule("DG-3")
def test_quantized_dit_in_its_own_config_is_refused_at_admission(
    loader: LoaderAdapter, tmp_path: Path
) -> None:
    from dataclasses import replace

    quantized = replace(FULL_PIPELINE["transformer"], quantization_config={"quant_method": "fp8"})
    root = write_pipeline(tmp_path, {"transformer": quantized})
    args = loader.make_server_args(runtime_device=ACCEL, direct_gpu_weight_loading=True)
    with pytest.raises(CCUE, match="'transformer' is quantized"):
        loader.admit(root, args, platform=CUDA)
    loader.admit(root, loader.make_server_args(runtime_device=ACCEL), platform=CUDA)


# --- ADM-5: the no-fallback error is never swallowed ----------------------------------------------


@pytest.mark.rule("ADM-5")
def test_no_fallback_error_is_a_value_error() -> None:
    assert issubclass(CCUE, ValueError)


@pytest.mark.rule("ADM-5")
@pytest.mark.parametrize("direct", [False, True])
def test_fallback_path_never_catches_the_no_fallback_error(
    reference_only: None, pipeline_dir: Path, mocker: MockerFixture, direct: bool
) -> None:
    from reference.args import ServerArgs
    from reference.loaders import VAE_DIRECT_SUPPORT, VocoderLoader
    from reference.pipeline import read_pipeline

    class WithFallback(VocoderLoader):
        direct_support = VAE_DIRECT_SUPPORT  # so a direct request for the VAE is admitted

    spec = read_pipeline(pipeline_dir).component("vae")
    loader = WithFallback(platform=CUDA)
    fallback = mocker.patch.object(
        loader, "load_fallback", return_value=(torch.nn.Linear(1, 1), [])
    )
    args = ServerArgs(runtime_device=ACCEL, component_direct_gpu_weight_loading={"vae": direct})
    refusal = CCUE("component 'vae': the checkpoint cannot be loaded as asked")
    mocker.patch.object(loader, "load_component", side_effect=refusal)
    with pytest.raises(CCUE) as info:
        loader.load(spec, args)
    assert info.value is refusal
    assert fallback.call_count == 0
    # A plain ValueError does reach the fallback, but only when nothing explicit was asked.
    mocker.patch.object(loader, "load_component", side_effect=ValueError("not native"))
    if direct:
        with pytest.raises(ValueError, match="not native"):
            loader.load(spec, args)
        assert fallback.call_count == 0
    else:
        assert isinstance(loader.load(spec, args).module, torch.nn.Linear)
        assert fallback.call_count == 1


# --- DG-6: device-memory preflight ----------------------------------------------------------------


@pytest.fixture
def checkpoint(tmp_path: Path) -> tuple[Path, int, int]:
    """(path, bytes the headers declare, largest tensor's bytes)."""
    state = {"a": torch.zeros(64, 32), "b": torch.zeros(16, dtype=torch.float16)}
    path = write_checkpoint(state, tmp_path / "dit")
    return path, 64 * 32 * 4 + 16 * 2, 64 * 32 * 4


@pytest.mark.rule("DG-6")
def test_preflight_refuses_what_does_not_fit(
    loader: LoaderAdapter, checkpoint: tuple[Path, int, int]
) -> None:
    path, total, _ = checkpoint
    needed = loader.check_device_memory(
        path, component="transformer", device=ACCEL, platform=FakePlatform(free_bytes=2**40)
    )
    assert needed > total
    assert (
        loader.check_device_memory(
            path, component="transformer", device=ACCEL, platform=FakePlatform(free_bytes=needed)
        )
        == needed
    )
    with pytest.raises(DeviceMemoryError) as info:
        loader.check_device_memory(
            path,
            component="transformer",
            device=ACCEL,
            platform=FakePlatform(free_bytes=needed - 1),
        )
    message = str(info.value)
    assert "'transformer'" in message
    assert "cuda:0" in message
    assert f"{needed} bytes" in message
    assert f"{needed - 1} bytes" in message


@pytest.mark.rule("DG-6")
def test_preflight_states_its_margin_and_reads_no_data(
    reference_only: None, checkpoint: tuple[Path, int, int], mocker: MockerFixture
) -> None:
    from reference.checkpoint import TensorReader, open_checkpoint
    from reference.preflight import MIN_MARGIN_BYTES, check_device_memory

    path, total, largest = checkpoint
    mapped = mocker.spy(torch.UntypedStorage, "from_file")
    read = mocker.spy(TensorReader, "read")
    ckpt = open_checkpoint(path)
    platform = FakePlatform(free_bytes=2**40)
    needed = check_device_memory(ckpt, component="transformer", device=ACCEL, platform=platform)
    assert needed == total + largest + MIN_MARGIN_BYTES
    assert (mapped.call_count, read.call_count) == (0, 0)
    cpu = torch.device("cpu")
    assert (
        check_device_memory(ckpt, component="vae", device=cpu, platform=FakePlatform(cuda=False))
        == 0
    )


@pytest.mark.rule("ADM-6")
@pytest.mark.capability(PIPELINES)
@pytest.mark.parametrize(
    "options",
    [{}, {"component_direct_gpu_weight_loading": {"vae": False}}],
    ids=["no-flag", "explicit-false"],
)
def test_without_a_flag_every_component_loads_as_an_ordinary_load_would(
    loader: LoaderAdapter, runtime_device: torch.device, tmp_path: Path, options: dict[str, Any]
) -> None:
    root = write_pipeline(tmp_path, SMALL_PIPELINE)
    args = loader.make_server_args(runtime_device=runtime_device, **options)
    for name, component in SMALL_PIPELINE.items():
        module = loader.load_pipeline_component(root, name, args, platform=CUDA)
        # The ordinary way, by hand: construct on CPU, load the whole file, load_state_dict.
        ordinary = component.cls(**component.config)
        files = sorted((root / name).glob("*.safetensors"))
        ordinary.load_state_dict({k: v for f in files for k, v in load_file(f).items()})
        ordinary = ordinary.to(runtime_device).eval()
        got, expected = module.state_dict(), ordinary.state_dict()
        assert list(got) == list(expected), name
        for key, value in expected.items():
            assert got[key].device.type == runtime_device.type, (name, key)
            assert got[key].dtype == value.dtype, (name, key)
            assert torch.equal(_bytes(got[key]), _bytes(value)), (name, key)
        buffers = zip(module.named_buffers(), ordinary.named_buffers(), strict=True)
        for (key, buffer), (_, fresh) in buffers:
            assert torch.equal(buffer, fresh), (name, key)
