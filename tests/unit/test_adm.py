"""ADM-1..5 and DG-3/DG-6: three-layer admission, the no-fallback error, the memory preflight.

Refusals are judged by contract (`reference/kit/judging/judge.py`): the documented type (a
ValueError; the no-fallback `ComponentCheckpointUnsupportedError` where ADM-3/ADM-5/DG-3 name it;
the adapter's `DeviceMemoryError` for the preflight), raised before any weight is read
(`reference/kit/judging/evidence.py`), its message naming the flag and the component(s). Tests that
pin the reference's own loader classes, rule table or wording are marked `reference_only`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from pytest_mock import MockerFixture
from safetensors.torch import load_file

from fakes.checkpoints import write_checkpoint, write_sparse_checkpoint
from fakes.pipelines import (
    FULL_PIPELINE,
    SMALL_PIPELINE,
    FakeBlock,
    FakeComponent,
    FakeVocoder,
    PipelineDiT,
    write_pipeline,
)
from fakes.pipelines import MODEL_CLASSES as MODELS_BY_NAME
from fakes.platform import FakePlatform
from reference.errors import ComponentCheckpointUnsupportedError, DeviceMemoryError
from reference.kit.judging.evidence import DataReads, data_bytes, evidence_missing
from reference.kit.judging.judge import (
    assert_identifies,
    loaded_or_refused,
    refusal,
    skip_cpu_runtime_without_the_setting,
    tensor_named,
)
from reference.kit.seam import (
    ADMISSION,
    LOADER_SUPPORT,
    MEMORY_PREFLIGHT,
    PIPELINES,
    ComponentRequest,
    Precisions,
    SeamLoader,
    ServingOptions,
)
from reference.request.args import ServerArgsLike
from reference.request.model_index import ModelRegistry
from reference.request.quantization import QuantizationSpec

ACCEL = torch.device("cuda", 0)
CUDA = FakePlatform(cuda=True)
DIT = "--direct-gpu-weight-loading"
SEL = "--component-direct-gpu-weight-loading"
MIB = 1024**2
GIB = 1024**3


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu().reshape(-1).view(torch.uint8)


def assert_names_component(error: BaseException, name: str) -> None:
    """`name` appears as a whole component name, in either spelling (`transformer` is not
    `transformer_2`)."""
    spellings = {name, name.replace("_", "-")}
    found = any(re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", str(error)) for n in spellings)
    assert found, f"does not name component {name!r}: {error}"


def watch(call: Callable[[], object]) -> DataReads:
    """Run `call` under a DataReads watch; skip when this process cannot gather evidence."""
    reason = evidence_missing()
    if reason is not None:
        pytest.skip(reason)
    with DataReads() as reads:
        call()
    return reads


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pipeline declaring transformer, transformer_2, vae, video_vae, audio_vae and vocoder."""
    return write_pipeline(tmp_path_factory.mktemp("pipeline"))


def _select(
    loader: SeamLoader, *names: str, device: torch.device = ACCEL, **options: Any
) -> ServerArgsLike:
    return loader.make_server_args(
        ServingOptions(
            runtime_device=device,
            component_direct_gpu_weight_loading=dict.fromkeys(names, True),
            **options,
        )
    )


# --- ADM-1: the pipeline gate ---------------------------------------------------------------------


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("ADM-1")
@pytest.mark.parametrize(
    "unknown",
    [("text_encoder",), ("text_encoder", "image-encoder"), ("image_encoder", "vae_2", "tokenizer")],
    ids=str,
)
def test_undeclared_selections_are_all_listed(
    loader: SeamLoader, pipeline_dir: Path, unknown: tuple[str, ...]
) -> None:
    # Everything else is admissible (CUDA, resident), so only the pipeline gate can refuse.
    args = _select(loader, "vae", *unknown)
    error = refusal(lambda: loader.admit(pipeline_dir, args, platform=CUDA))
    for name in unknown:
        assert_names_component(error, name.replace("-", "_"))


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("ADM-1")
@pytest.mark.reference_only("checks the reference's wording and the order of its gates")
def test_undeclared_selection_wording(pipeline_dir: Path) -> None:
    from reference.request.admission import admit
    from reference.request.args import ServerArgs
    from reference.request.model_index import read_pipeline

    args = ServerArgs(
        runtime_device=ACCEL,
        component_direct_gpu_weight_loading=dict.fromkeys(
            ("vae", "text_encoder", "image-encoder"), True
        ),
    )
    # No CUDA either: the pipeline gate answers first, naming every unknown component.
    with pytest.raises(
        ComponentCheckpointUnsupportedError, match=r"model_index\.json does not declare"
    ) as info:
        admit(read_pipeline(pipeline_dir), args, platform=FakePlatform(cuda=False))
    message = str(info.value)
    assert f"{SEL}.text_encoder" in message
    assert f"{SEL}.image_encoder" in message
    assert f"{SEL}.vae " not in message


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("ADM-1")
def test_declared_selections_and_unselected_unknowns_pass(
    loader: SeamLoader, pipeline_dir: Path
) -> None:
    args = loader.make_server_args(
        ServingOptions(
            runtime_device=ACCEL,
            component_direct_gpu_weight_loading={"vae": True, "video-vae": True},
        )
    )
    loader.admit(pipeline_dir, args, platform=CUDA)


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("ADM-1")
@pytest.mark.reference_only("an undeclared component set to false may be refused or ignored")
def test_reference_ignores_an_undeclared_component_set_to_false(
    loader: SeamLoader, pipeline_dir: Path
) -> None:
    args = loader.make_server_args(
        ServingOptions(
            runtime_device=ACCEL, component_direct_gpu_weight_loading={"vae": True, "nope": False}
        )
    )
    loader.admit(pipeline_dir, args, platform=CUDA)


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("DG-7")
def test_dit_flag_without_a_transformer_is_admitted_or_refused_naming_the_flag(
    loader: SeamLoader, tmp_path: Path
) -> None:
    """The DiT flag covers the transformer components the pipeline declares (DG-7); with none
    declared it covers nothing, and no rule says whether that is refused (upstream admits it,
    the reference refuses it). Either conforms: admitted, or refused with a ValueError that
    names the flag. A loader that assumes a `transformer` is there and fails otherwise does
    not."""
    root = write_pipeline(tmp_path, {"vocoder": FULL_PIPELINE["vocoder"]})
    args = loader.make_server_args(
        ServingOptions(runtime_device=ACCEL, direct_gpu_weight_loading=True)
    )
    _, error = loaded_or_refused(lambda: loader.admit(root, args, platform=CUDA))
    if error is not None:
        assert_identifies(error, DIT)
    loader.admit(root, loader.make_server_args(ServingOptions(runtime_device=ACCEL)), platform=CUDA)


# --- ADM-2: the arguments gate --------------------------------------------------------------------


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("ADM-2")
@pytest.mark.parametrize("selected", ["video_vae", "video-vae", "vae", "audio_vae"])
@pytest.mark.parametrize("problem", ["no-cuda", "cpu-runtime", "cpu-0-runtime", "offloaded"])
def test_selected_component_needs_cuda_and_residency(
    loader: SeamLoader, pipeline_dir: Path, problem: str, selected: str
) -> None:
    name = selected.replace("-", "_")
    platform = FakePlatform(cuda=False) if problem == "no-cuda" else CUDA
    options: dict[str, Any] = {"runtime_device": ACCEL}
    if problem == "cpu-runtime":
        options["runtime_device"] = torch.device("cpu")
    elif problem == "cpu-0-runtime":
        options["runtime_device"] = torch.device("cpu", 0)
    elif problem == "offloaded":  # under the other spelling of its name
        other = name.replace("_", "-") if selected == name else name
        options["component_cpu_offload"] = {other: True}
    skip_cpu_runtime_without_the_setting(loader, options["runtime_device"])
    # Construction may refuse already (ARGS-4: it validates too); else admission must.
    error = refusal(
        lambda: loader.admit(
            pipeline_dir,
            loader.make_server_args(
                ServingOptions(component_direct_gpu_weight_loading={selected: True}, **options)
            ),
            platform=platform,
        )
    )
    if problem == "offloaded":  # the cause is the component's own: the refusal names it
        assert_names_component(error, name)
    else:  # a global cause (DG-7): the selection's flag, or the component, identifies it
        assert_identifies(error, SEL, name)
    # Without the selection the same options are admitted: the refusal is about the request.
    loader.admit(
        pipeline_dir, loader.make_server_args(ServingOptions(**options)), platform=platform
    )


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("ADM-2")
@pytest.mark.reference_only("checks the reference's wording")
@pytest.mark.parametrize(
    ("options", "platform", "words"),
    [
        ({}, FakePlatform(cuda=False), r"'video_vae' needs CUDA"),
        ({"runtime_device": torch.device("cpu")}, CUDA, r"'video_vae' needs a CUDA runtime device"),
        (
            {"component_cpu_offload": {"video-vae": True}},
            CUDA,
            r"'video_vae' is offloaded.*--component-cpu-offload\.video_vae",
        ),
    ],
    ids=["no-cuda", "cpu-runtime", "offloaded"],
)
def test_selected_component_refusal_wording(
    pipeline_dir: Path, options: dict[str, Any], platform: FakePlatform, words: str
) -> None:
    from reference.errors import ArgumentError
    from reference.request.admission import admit
    from reference.request.args import ServerArgs
    from reference.request.model_index import read_pipeline

    args = ServerArgs(
        **{
            "runtime_device": ACCEL,
            "component_direct_gpu_weight_loading": {"video_vae": True},
            **options,
        }
    )
    with pytest.raises(ArgumentError, match=words) as info:
        admit(read_pipeline(pipeline_dir), args, platform=platform)
    assert f"drop {SEL}.video_vae" in str(info.value)


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("ADM-2")
def test_component_selection_needs_only_cuda_and_residency(
    loader: SeamLoader, pipeline_dir: Path
) -> None:
    # FSDP, TP and DiT offload concern the DiT; a resident VAE on CUDA is admitted beside them.
    args = _select(loader, "vae", fsdp_inference=True, tp_size=2, dit_cpu_offload=True)
    loader.admit(pipeline_dir, args, platform=CUDA)
    cuda = _select(loader, "video_vae", device=torch.device("cuda"))
    loader.admit(pipeline_dir, cuda, platform=CUDA)


# --- ADM-3: the loader gate -----------------------------------------------------------------------


@pytest.mark.capability(LOADER_SUPPORT)
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
    loader: SeamLoader, kind: str, component: str, supported: bool
) -> None:
    assert loader.loader_supports_direct(kind, component) is supported


# Weights of 16 MiB and more per component, so that reading any sizeable part shows.
BIG_DIT = FakeComponent(
    FakeBlock, {"width": 2048}, quantization_config={"quant_method": "fp8"}, seed=5
)
BIG_PIPELINE = {
    "transformer": BIG_DIT,
    "transformer_2": replace(BIG_DIT, seed=6),
    "transformer_3": FakeComponent(FakeBlock, {"width": 2048}, seed=7),
    "audio_vae": FakeComponent(FakeBlock, {"width": 2048}, seed=8),
    "vocoder": FakeComponent(FakeVocoder, {"channels": 1024, "upsample": 4}, seed=9),
}
FP8 = QuantizationSpec("fp8")


@pytest.fixture(scope="module")
def big_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every loader kind with a request it cannot honour: quantized DiTs (transformer and
    transformer_2 by their config.json, transformer_3 by --quantization), audio_vae, vocoder."""
    return write_pipeline(tmp_path_factory.mktemp("big"), BIG_PIPELINE)


# (id, component, the request as server-argument options, the flag that asks for it). A loader
# that cannot load a vocoder or audio_vae directly refuses at its own start (ADM-3); a quantized
# DiT is refused before any read (DG-3), at admission with the no-fallback error (DG-3b).
LOADER_CANNOT = [
    ("vocoder", "vocoder", {"component_direct_gpu_weight_loading": {"vocoder": True}}, SEL),
    ("audio_vae", "audio_vae", {"component_direct_gpu_weight_loading": {"audio_vae": True}}, SEL),
    ("audio-vae", "audio_vae", {"component_direct_gpu_weight_loading": {"audio-vae": True}}, SEL),
]
QUANTIZED_DIT = [
    ("transformer-quantized-config", "transformer", {"direct_gpu_weight_loading": True}, DIT),
    ("transformer_2-quantized-config", "transformer_2", {"direct_gpu_weight_loading": True}, DIT),
    (
        "transformer_3-quantization-flag",
        "transformer_3",
        {"direct_gpu_weight_loading": True, "quantization": FP8},
        DIT,
    ),
]


def unhonourable(loader_rules: tuple[str, ...], dit_rules: tuple[str, ...]) -> list[Any]:
    """The requests, each marked with the rules a test of it judges."""
    return [
        pytest.param(*case, marks=pytest.mark.rule(*rules), id=name)
        for cases, rules in ((LOADER_CANNOT, loader_rules), (QUANTIZED_DIT, dit_rules))
        for name, *case in cases
    ]


@pytest.mark.capability(PIPELINES)
@pytest.mark.parametrize(
    ("component", "options", "flag"), unhonourable(("ADM-3", "ADM-5"), ("DG-3b", "ADM-5"))
)
def test_unhonourable_request_raises_the_no_fallback_error(
    loader: SeamLoader,
    big_pipeline: Path,
    component: str,
    options: dict[str, Any],
    flag: str,
) -> None:
    """The no-fallback error, naming the component (the offending thing; the flag's spelling
    and the rest of the wording are the loader's). When it is raised is judged apart, by read
    evidence. The classes the pipeline names reach the loader through the seam."""
    args = loader.make_server_args(ServingOptions(runtime_device=ACCEL, **options))
    error = refusal(
        lambda: loader.load_pipeline_component(
            ComponentRequest(big_pipeline, component, args, platform=CUDA, models=MODELS_BY_NAME)
        ),
        error=ComponentCheckpointUnsupportedError,
    )
    assert_names_component(error, component)


@pytest.mark.capability(PIPELINES)
@pytest.mark.parametrize(("component", "options", "flag"), unhonourable(("ADM-3",), ("DG-3",)))
def test_unhonourable_request_is_refused_before_any_file_access(
    loader: SeamLoader,
    big_pipeline: Path,
    component: str,
    options: dict[str, Any],
    flag: str,
) -> None:
    """Refused at the start of load(): no weight file opened or read (what it raises is judged
    apart: here any ValueError will do)."""
    files = sorted((big_pipeline / component).glob("*.safetensors"))
    assert data_bytes(*files) >= 16 * MIB
    args = loader.make_server_args(ServingOptions(runtime_device=ACCEL, **options))
    errors: list[BaseException] = []

    def load() -> None:
        errors.append(
            refusal(
                lambda: loader.load_pipeline_component(
                    ComponentRequest(
                        big_pipeline, component, args, platform=CUDA, models=MODELS_BY_NAME
                    )
                ),
                error=ValueError,
            )
        )

    reads = watch(load)
    assert errors, "the request was not refused"
    assert reads.opened_any(files) == []
    reads.assert_no_data_read(data_bytes(*files))


def _break_weights(root: Path, component: str) -> None:
    for weights in (root / component).glob("*.safetensors"):
        weights.write_bytes(b"\x00not a checkpoint")


@pytest.mark.capability(PIPELINES)
@pytest.mark.rule("ADM-3", "ADM-5")
@pytest.mark.parametrize("damage", ["corrupt", "missing"])
@pytest.mark.parametrize("component", ["vocoder", "audio_vae"])
def test_unsupported_request_is_refused_whatever_the_weights(
    loader: SeamLoader, tmp_path: Path, damage: str, component: str
) -> None:
    """Damaged weights cannot be what refuses: the request is refused before they are looked at
    (a checkpoint error would be a ValueError, but not the no-fallback error)."""
    root = write_pipeline(tmp_path, {component: FULL_PIPELINE[component]})
    if damage == "corrupt":
        _break_weights(root, component)
    else:
        for weights in (root / component).glob("*.safetensors"):
            weights.unlink()
    args = _select(loader, component)
    error = refusal(
        lambda: loader.load_pipeline_component(
            ComponentRequest(root, component, args, platform=CUDA, models=MODELS_BY_NAME)
        ),
        error=ComponentCheckpointUnsupportedError,
    )
    assert_names_component(error, component)


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("ADM-3")
@pytest.mark.reference_only("checks the reference's wording")
def test_unsupported_request_wording(tmp_path: Path) -> None:
    from reference.load.loaders import VocoderLoader
    from reference.request.args import ServerArgs
    from reference.request.model_index import read_pipeline

    root = write_pipeline(tmp_path, {"vocoder": FULL_PIPELINE["vocoder"]})
    args = ServerArgs(runtime_device=ACCEL, component_direct_gpu_weight_loading={"vocoder": True})
    spec = read_pipeline(root).component("vocoder")
    with pytest.raises(
        ComponentCheckpointUnsupportedError, match=rf"{SEL}\.vocoder.*'vocoder'.*drop"
    ) as info:
        VocoderLoader(registry=ModelRegistry.of(MODELS_BY_NAME), platform=CUDA).load(spec, args)
    assert type(info.value) is ComponentCheckpointUnsupportedError


@pytest.mark.capability(PIPELINES)
@pytest.mark.rule("ADM-3")
def test_without_the_flag_the_same_loader_loads(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path
) -> None:
    root = write_pipeline(tmp_path, {"vocoder": FULL_PIPELINE["vocoder"]})
    for args in (
        loader.make_server_args(ServingOptions(runtime_device=runtime_device)),
        loader.make_server_args(
            ServingOptions(runtime_device=runtime_device, direct_gpu_weight_loading=True)
        ),
        loader.make_server_args(
            ServingOptions(
                runtime_device=runtime_device,
                component_direct_gpu_weight_loading={"vocoder": False},
            )
        ),
    ):
        module = loader.load_pipeline_component(
            ComponentRequest(root, "vocoder", args, platform=CUDA, models=MODELS_BY_NAME)
        )
        state = module.state_dict()
        assert set(state) == {"up.weight", "up.bias", "conv.weight", "conv.bias", "gain"}
        assert all(t.device.type == runtime_device.type for t in state.values())
        written = load_file(root / "vocoder" / "diffusion_pytorch_model.safetensors")
        assert all(torch.equal(state[k].cpu(), written[k]) for k in written)


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("ADM-3")
@pytest.mark.reference_only("spies on the reference's own loader hooks")
def test_gate_runs_before_hooks_and_file_access(pipeline_dir: Path, mocker: MockerFixture) -> None:
    from reference.load import loaders
    from reference.request.args import ServerArgs
    from reference.request.model_index import read_pipeline

    spec = read_pipeline(pipeline_dir).component("vocoder")
    loader = loaders.VocoderLoader(registry=ModelRegistry.of(MODELS_BY_NAME), platform=CUDA)
    spies = [
        mocker.spy(loader, name)
        for name in ("fsdp_enabled", "quantization_for", "plan_for", "load_component")
    ]
    opened = mocker.spy(loaders, "open_checkpoint")
    io_open = mocker.spy(Path, "open")
    args = ServerArgs(runtime_device=ACCEL, component_direct_gpu_weight_loading={"vocoder": True})
    with pytest.raises(ComponentCheckpointUnsupportedError, match="the vocoder loader cannot load"):
        loader.load(spec, args)
    assert [s.call_count for s in spies] == [0, 0, 0, 0]
    assert (opened.call_count, io_open.call_count) == (0, 0)


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("ADM-3")
@pytest.mark.reference_only("calls the reference's loader gate directly")
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
    support: str, component: str, flag_options: dict[str, Any], answer: bool | None
) -> None:
    """None: refused; otherwise whether a direct load was asked for (and admitted)."""
    from reference.load.loaders import DIRECT_SUPPORT
    from reference.request.admission import check_loader
    from reference.request.args import ServerArgs

    args = ServerArgs(runtime_device=ACCEL, **flag_options)
    if answer is None:
        with pytest.raises(
            ComponentCheckpointUnsupportedError,
            match=f"the {support} loader cannot load component '{component}'",
        ):
            check_loader(DIRECT_SUPPORT[support], component, args, loader=support)
    else:
        assert check_loader(DIRECT_SUPPORT[support], component, args, loader=support) is answer


# --- ADM-4: one table serves all three gates ------------------------------------------------------


@pytest.mark.capability(ADMISSION, PIPELINES)
@pytest.mark.rule("ADM-4", "DG-3b")
@pytest.mark.parametrize(
    ("component", "options"),
    [
        ("transformer", {}),
        ("transformer_2", {}),
        ("transformer_3", {"quantization": FP8}),
    ],
    ids=["config", "config-second", "quantization-flag"],
)
def test_quantized_direct_dit_is_refused_at_admission_and_by_its_loader(
    loader: SeamLoader, big_pipeline: Path, component: str, options: dict[str, Any]
) -> None:
    """One rule answers at every layer: the arguments that admission refuses for a quantized
    DiT, its loader refuses too, with the same no-fallback error naming the same component."""
    args = loader.make_server_args(
        ServingOptions(runtime_device=ACCEL, direct_gpu_weight_loading=True, **options)
    )
    at_admission = refusal(
        lambda: loader.admit(big_pipeline, args, platform=CUDA),
        error=ComponentCheckpointUnsupportedError,
    )
    at_loader = refusal(
        lambda: loader.load_pipeline_component(
            ComponentRequest(big_pipeline, component, args, platform=CUDA, models=MODELS_BY_NAME)
        ),
        error=ComponentCheckpointUnsupportedError,
    )
    for error in (at_admission, at_loader):
        assert_names_component(error, component)


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("ADM-4")
@pytest.mark.reference_only("patches the reference's own rule table")
def test_every_gate_reads_the_one_table(mocker: MockerFixture) -> None:
    from reference.errors import LoadError
    from reference.request import admission
    from reference.request.args import ServerArgs

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


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("ADM-4", "DG-3b")
@pytest.mark.reference_only("calls the reference's three gates directly")
def test_quantized_direct_dit_is_one_rule_at_every_gate() -> None:
    from reference.load.loaders import TRANSFORMER_DIRECT_SUPPORT
    from reference.request import admission
    from reference.request.args import ServerArgs

    by_flag = ServerArgs(runtime_device=ACCEL, direct_gpu_weight_loading=True, quantization=FP8)
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
        with pytest.raises(ComponentCheckpointUnsupportedError) as info:
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
        with pytest.raises(
            ComponentCheckpointUnsupportedError,
            match=r"its config\.json declares quantization 'fp8'",
        ):
            gate()
    rule = next(r for r in admission.ADMISSION_RULES if "DG-3" in r.contract)
    assert all(rule in admission.rules_for(gate) for gate in ("pipeline", "arguments", "loader"))


# --- DG-3, DG-3b: a quantized DiT is refused for direct loading -----------------------------------


@pytest.mark.capability(PIPELINES)
@pytest.mark.rule("DG-3")
@pytest.mark.parametrize(
    ("component", "options"),
    [
        ("transformer", {}),
        ("transformer_2", {}),
        ("transformer_3", {"quantization": FP8}),
    ],
    ids=["config", "config-second", "quantization-flag"],
)
def test_quantized_direct_dit_is_refused_before_any_tensor_data_is_read(
    loader: SeamLoader, big_pipeline: Path, component: str, options: dict[str, Any]
) -> None:
    """DG-3 on the load path, whatever refuses it and with whatever ValueError: a quantized DiT
    (by its own config.json, or by a quantization request) asked for direct loading is refused
    before a byte of its tensor data is read."""
    files = sorted((big_pipeline / component).glob("*.safetensors"))
    args = loader.make_server_args(
        ServingOptions(runtime_device=ACCEL, direct_gpu_weight_loading=True, **options)
    )
    errors: list[BaseException] = []

    def load() -> None:
        errors.append(
            refusal(
                lambda: loader.load_pipeline_component(
                    ComponentRequest(
                        big_pipeline, component, args, platform=CUDA, models=MODELS_BY_NAME
                    )
                )
            )
        )

    reads = watch(load)
    assert errors, "the request was not refused"  # what it names is DG-3b's to judge
    reads.assert_no_data_read(data_bytes(*files))


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("DG-3b")
@pytest.mark.parametrize("component", ["transformer", "transformer_2"])
@pytest.mark.parametrize("method", ["fp8", "gguf", "modelopt_fp8"])
def test_quantized_dit_in_its_own_config_is_refused_at_admission(
    loader: SeamLoader, tmp_path: Path, component: str, method: str
) -> None:
    quantized = replace(FULL_PIPELINE[component], quantization_config={"quant_method": method})
    root = write_pipeline(tmp_path, {**FULL_PIPELINE, component: quantized})
    args = loader.make_server_args(
        ServingOptions(runtime_device=ACCEL, direct_gpu_weight_loading=True)
    )
    error = refusal(
        lambda: loader.admit(root, args, platform=CUDA), error=ComponentCheckpointUnsupportedError
    )
    assert_names_component(error, component)
    loader.admit(root, loader.make_server_args(ServingOptions(runtime_device=ACCEL)), platform=CUDA)


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("DG-3b")
@pytest.mark.parametrize(
    "quantization",
    [FP8, QuantizationSpec("fp8", serialized=True), QuantizationSpec("mxfp4")],
    ids=str,
)
def test_quantization_flag_with_direct_dit_is_refused_at_admission(
    loader: SeamLoader, pipeline_dir: Path, quantization: QuantizationSpec
) -> None:
    args = loader.make_server_args(
        ServingOptions(
            runtime_device=ACCEL, direct_gpu_weight_loading=True, quantization=quantization
        )
    )
    error = refusal(
        lambda: loader.admit(pipeline_dir, args, platform=CUDA),
        error=ComponentCheckpointUnsupportedError,
    )
    assert_names_component(error, "transformer")
    plain = loader.make_server_args(ServingOptions(runtime_device=ACCEL, quantization=quantization))
    loader.admit(pipeline_dir, plain, platform=CUDA)


# --- ADM-5: the no-fallback error is never swallowed ----------------------------------------------


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("ADM-5")
@pytest.mark.reference_only("checks the reference's error class")
def test_no_fallback_error_is_a_value_error() -> None:
    assert issubclass(ComponentCheckpointUnsupportedError, ValueError)


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("ADM-5")
@pytest.mark.reference_only("drives the reference's loader template")
@pytest.mark.parametrize("direct", [False, True])
def test_the_loader_template_never_swallows_a_refusal(
    pipeline_dir: Path, mocker: MockerFixture, direct: bool
) -> None:
    """The template has no fallback path: the no-fallback error comes out as raised, direct or
    not, and a failure that is not a refusal comes out wrapped naming the component, never
    traded for a module from somewhere else."""
    from reference.errors import ComponentLoadError
    from reference.load.loaders import VAE_DIRECT_SUPPORT, VocoderLoader
    from reference.request.args import ServerArgs
    from reference.request.model_index import read_pipeline

    class DirectVAE(VocoderLoader):
        direct_support = VAE_DIRECT_SUPPORT  # so a direct request for the VAE is admitted

    spec = read_pipeline(pipeline_dir).component("vae")
    loader = DirectVAE(registry=ModelRegistry.of(MODELS_BY_NAME), platform=CUDA)
    args = ServerArgs(runtime_device=ACCEL, component_direct_gpu_weight_loading={"vae": direct})
    refused = ComponentCheckpointUnsupportedError(
        "component 'vae': the checkpoint cannot be loaded as asked"
    )
    mocker.patch.object(loader, "load_component", side_effect=refused)
    with pytest.raises(ComponentCheckpointUnsupportedError) as info:
        loader.load(spec, args)
    assert info.value is refused
    broken = RuntimeError("Found no NVIDIA driver on your system")
    mocker.patch.object(loader, "load_component", side_effect=broken)
    with pytest.raises(ComponentLoadError, match=r"component 'vae': RuntimeError while loading"):
        loader.load(spec, args)


# --- DG-6: device-memory preflight ----------------------------------------------------------------


@pytest.fixture
def checkpoint(tmp_path: Path) -> tuple[Path, int]:
    """(path, bytes the headers declare): 16 MiB of tensor data, so a read of it shows."""
    state = {"a": torch.ones(1024, 4096), "b": torch.ones(16, dtype=torch.float16)}
    path = write_checkpoint(state, tmp_path / "dit")
    return path, 1024 * 4096 * 4 + 16 * 2


@pytest.mark.capability(MEMORY_PREFLIGHT)
@pytest.mark.rule("DG-6")
@pytest.mark.parametrize("device", [ACCEL, torch.device("cuda", 1)], ids=str)
def test_preflight_refuses_what_does_not_fit(
    loader: SeamLoader, checkpoint: tuple[Path, int], device: torch.device
) -> None:
    path, total = checkpoint

    def check(free: int) -> int:
        platform = FakePlatform(devices=2, free_bytes=free)
        return loader.check_device_memory(
            path, component="transformer", device=device, platform=platform
        )

    needed = check(2**40)
    assert needed > total, "the preflight states no margin beyond the headers' bytes"
    assert check(needed) == needed
    errors: list[BaseException] = []
    reads = watch(
        lambda: errors.append(refusal(lambda: check(needed - 1), error=DeviceMemoryError))
    )
    assert_names_component(errors[0], "transformer")
    assert str(device) in str(errors[0])
    reads.assert_no_data_read(data_bytes(path))


@pytest.mark.capability(MEMORY_PREFLIGHT)
@pytest.mark.rule("DG-6")
def test_preflight_counts_every_shard_and_a_margin(loader: SeamLoader, tmp_path: Path) -> None:
    """Three shards of 1 GiB each, declared by their headers over sparse files (the preflight
    reads headers only). Free memory of exactly the weights' bytes leaves no room for any
    margin: refused. Catches a preflight that counts the first shard only (2 GiB short of the
    weights), and one with no margin at all."""
    index = write_sparse_checkpoint(tmp_path / "dit", [GIB, GIB, GIB])
    weights = 3 * GIB

    def check(free: int) -> int:
        platform = FakePlatform(devices=1, free_bytes=free)
        return loader.check_device_memory(
            index, component="transformer", device=ACCEL, platform=platform
        )

    assert check(2**50) > weights, "the preflight states no margin beyond the headers' bytes"
    error = refusal(lambda: check(weights), error=DeviceMemoryError)
    assert_names_component(error, "transformer")


BIG_DIT = {"hidden": 512, "heads": 4, "depth": 2}
"""A DiT of 16+ MiB: a read of its tensor data stands out from headers and bookkeeping."""


def assert_direct_load_refused_before_reading(
    loader: SeamLoader, root: Path, *, free: Callable[[int], int]
) -> None:
    """A direct load of the pipeline's transformer onto a device with `free(weights' bytes)`
    bytes free (the arguments admitted: only the memory is short) is refused with the adapter's
    `DeviceMemoryError`, naming the component, before any tensor data is read."""
    files = sorted((root / "transformer").glob("*.safetensors"))
    data = data_bytes(*files)
    assert data >= 16 * MIB
    args = loader.make_server_args(
        ServingOptions(runtime_device=ACCEL, direct_gpu_weight_loading=True)
    )
    platform = FakePlatform(cuda=True, free_bytes=free(data))
    loader.admit(root, args, platform=platform)
    errors: list[BaseException] = []

    def load() -> None:
        request = ComponentRequest(
            root, "transformer", args, platform=platform, models=MODELS_BY_NAME
        )
        errors.append(
            refusal(lambda: loader.load_pipeline_component(request), error=DeviceMemoryError)
        )

    reads = watch(load)
    assert_names_component(errors[0], "transformer")
    reads.assert_no_data_read(data)


@pytest.mark.capability(ADMISSION, PIPELINES)
@pytest.mark.rule("DG-6")
def test_a_direct_load_into_exactly_its_weights_bytes_is_refused(
    loader: SeamLoader, tmp_path: Path
) -> None:
    """The load path's own preflight, over a DiT in three shards: free device memory equal to
    the bytes its headers declare, every shard summed, leaves no room for the stated margin.
    Catches a load path that preflights with no margin (or not at all) even where the seam's
    preflight method has one, and one that counts some of the shards."""
    dit = FakeComponent(PipelineDiT, BIG_DIT, seed=2, shards=3)
    root = write_pipeline(tmp_path, {"transformer": dit})
    assert len(list((root / "transformer").glob("*.safetensors"))) == 3
    assert_direct_load_refused_before_reading(loader, root, free=lambda weights: weights)


@pytest.mark.capability(ADMISSION, PIPELINES)
@pytest.mark.rule("DG-6")
def test_direct_load_beyond_free_memory_is_refused_before_any_byte_moves(
    loader: SeamLoader, tmp_path: Path
) -> None:
    root = write_pipeline(tmp_path, {"transformer": FakeComponent(PipelineDiT, BIG_DIT, seed=2)})
    assert_direct_load_refused_before_reading(loader, root, free=lambda weights: MIB)


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("DG-6")
@pytest.mark.reference_only("checks the reference's stated margin and wording")
def test_preflight_states_its_margin(checkpoint: tuple[Path, int]) -> None:
    from reference.read.checkpoint import open_checkpoint
    from reference.read.preflight import MIN_MARGIN_BYTES, check_device_memory

    path, total = checkpoint
    ckpt = open_checkpoint(path)
    platform = FakePlatform(free_bytes=2**40)
    needed = check_device_memory(ckpt, component="transformer", device=ACCEL, platform=platform)
    assert needed == total + 1024 * 4096 * 4 + MIN_MARGIN_BYTES
    with pytest.raises(
        DeviceMemoryError, match=rf"'transformer' needs .*\({needed} bytes\) on cuda:0"
    ):
        check_device_memory(
            ckpt,
            component="transformer",
            device=ACCEL,
            platform=FakePlatform(free_bytes=needed - 1),
        )
    cpu = torch.device("cpu")
    assert (
        check_device_memory(ckpt, component="vae", device=cpu, platform=FakePlatform(cuda=False))
        == 0
    )


# --- ADM-6: defaults untouched --------------------------------------------------------------------


@pytest.mark.capability(PIPELINES)
@pytest.mark.rule("ADM-6")
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"component_direct_gpu_weight_loading": {"vae": False}},
        {"direct_gpu_weight_loading": False, "component_direct_gpu_weight_loading": {}},
    ],
    ids=["no-flag", "explicit-false", "all-false"],
)
def test_without_a_flag_every_component_loads_as_an_ordinary_load_would(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, options: dict[str, Any]
) -> None:
    root = write_pipeline(tmp_path, SMALL_PIPELINE)
    # The precision the ordinary build below has (its classes build in fp32), handed over
    # explicitly: defaults of precision are PREC-1's to judge.
    as_built = Precisions(dit=torch.float32, vae=torch.float32)
    args = loader.make_server_args(
        ServingOptions(runtime_device=runtime_device, precisions=as_built, **options)
    )
    for name, component in SMALL_PIPELINE.items():
        module = loader.load_pipeline_component(
            ComponentRequest(root, name, args, platform=CUDA, models=MODELS_BY_NAME)
        )
        # The ordinary way, by hand: construct on CPU, load the whole file, load_state_dict.
        ordinary = component.cls(**component.config)
        files = sorted((root / name).glob("*.safetensors"))
        ordinary.load_state_dict({k: v for f in files for k, v in load_file(f).items()})
        ordinary = ordinary.to(runtime_device).eval()
        got, expected = module.state_dict(), ordinary.state_dict()
        assert set(got) == set(expected), name
        for key, value in expected.items():
            assert got[key].device.type == runtime_device.type, (name, key)
            assert got[key].dtype == value.dtype, (name, key)
            assert torch.equal(_bytes(got[key]), _bytes(value)), (name, key)
        # Every buffer's value, non-persistent ones too, by name: whether a buffer is still a
        # buffer (not re-registered as a parameter) is ZC-15's to judge.
        for key, fresh in ordinary.named_buffers():
            assert torch.equal(tensor_named(module, key).cpu(), fresh.cpu()), (name, key)
