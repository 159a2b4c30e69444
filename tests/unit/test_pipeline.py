"""The reference's pipeline folders, model registry, loader lookup and option parsing details."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fakes.pipelines import (
    FULL_PIPELINE,
    MODEL_CLASSES,
    FakeBlock,
    FakeComponent,
    FakeVocoder,
    write_pipeline,
)
from fakes.platform import FakePlatform
from reference.errors import ArgumentError, CheckpointError, LoadError, StateMismatchError
from reference.load.loaders import VocoderLoader, loader_kind
from reference.load.pipeline import loader_for
from reference.request.admission import DirectSupport, check_arguments
from reference.request.args import ServerArgs, parse_args
from reference.request.model_index import ModelRegistry, is_transformer_component, read_pipeline
from reference.request.quantization import QuantizationSpec

pytestmark = pytest.mark.internal

CPU = torch.device("cpu")
NO_CUDA = FakePlatform(cuda=False)


def test_read_pipeline_parses_components_in_order(tmp_path: Path) -> None:
    quantized = FakeComponent(FakeBlock, {"width": 2}, quantization_config={"quant_method": "fp8"})
    root = write_pipeline(
        tmp_path,
        {"transformer": quantized, "vocoder": FULL_PIPELINE["vocoder"]},
        extra_index={"scheduler": ["diffusers", "FlowMatch"], "text_encoder": [None, None]},
    )
    pipeline = read_pipeline(root)
    assert pipeline.class_name == "FakePipeline"
    assert pipeline.names == ("transformer", "vocoder", "scheduler")
    assert pipeline.transformer_components == ("transformer",)
    dit = pipeline.component("transformer")
    assert (dit.library, dit.class_name, dit.folder) == ("fakes", "FakeBlock", root / "transformer")
    assert dit.quantization == QuantizationSpec("fp8", serialized=True)
    assert dit.init_kwargs == {"width": 2}
    scheduler = pipeline.component("scheduler")
    assert (dict(scheduler.config), scheduler.quantization) == ({}, None)
    with pytest.raises(TypeError):
        dit.config["width"] = 3  # type: ignore[index]
    with pytest.raises(CheckpointError, match=r"model_index\.json \[vae\]: no such component"):
        pipeline.component("vae")


@pytest.mark.parametrize(
    ("index", "config", "words"),
    [
        (None, None, r": holds no model_index\.json, so it is not a pipeline folder"),
        ("{not json", None, "not valid JSON"),
        ("[1, 2]", None, "must be a JSON object, got list"),
        ('{"vae": ["diffusers", 3]}', None, r"\[vae\]: must be \[\"<library>\""),
        ('{"vae": ["diffusers", null]}', None, r"\[vae\]: must be \[\"<library>\""),
        ('{"vae": ["", "AutoencoderKL"]}', None, r"\[vae\]: must be \[\"<library>\""),
        ('{"vae": ["fakes", "FakeBlock"]}', '{"quantization_config": {}}', "quant_method"),
    ],
    ids=[
        "missing",
        "bad-json",
        "not-object",
        "bad-entry",
        "half-entry",
        "empty-library",
        "bad-quantization",
    ],
)
def test_read_pipeline_errors_name_file_and_entry(
    tmp_path: Path, index: str | None, config: str | None, words: str
) -> None:
    if index is not None:
        (tmp_path / "model_index.json").write_text(index)
    if config is not None:
        (tmp_path / "vae").mkdir()
        (tmp_path / "vae" / "config.json").write_text(config)
    with pytest.raises(CheckpointError, match=words):
        read_pipeline(tmp_path)


def test_a_path_that_is_no_pipeline_folder_says_what_it_is(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(CheckpointError, match=r"nowhere: does not exist"):
        read_pipeline(missing)
    (tmp_path / "file").write_text("{}")
    with pytest.raises(CheckpointError, match=r"file: is not a folder"):
        read_pipeline(tmp_path / "file")


def test_pipeline_settings_are_kept_and_never_read_as_components(tmp_path: Path) -> None:
    """diffusers writes a pipeline's own settings beside its components: any JSON value that is
    not a two-element list holding a string (or two nulls) is a setting, kept in order."""
    settings = {
        "boundary_ratio": None,
        "expand_timesteps": False,
        "requires_safety_checker": True,
        "sample_sigmas": [1.0, 0.5],
        "text_encoder_select_layers": [-1, -2],
        "mean": [0.48, 0.46, 0.41],
        "resolution": 1024,
        "prompt_template": {"template": "{}", "crop_start": 2},
    }
    root = write_pipeline(
        tmp_path,
        {"vocoder": FULL_PIPELINE["vocoder"]},
        extra_index={**settings, "transformer_2": [None, None]},
    )
    pipeline = read_pipeline(root)
    assert pipeline.names == ("vocoder",)
    assert dict(pipeline.settings) == settings
    assert list(pipeline.settings) == list(settings)
    with pytest.raises(TypeError):
        pipeline.settings["resolution"] = 512  # type: ignore[index]


def test_transformer_component_names() -> None:
    assert [is_transformer_component(n) for n in ("transformer", "transformer_2", "transformer_10")]
    assert not any(
        is_transformer_component(n)
        for n in ("transformer_", "transformers", "vae", "my_transformer")
    )


def test_registry_registers_and_refuses_unknown_and_conflicting_names(tmp_path: Path) -> None:
    registry = ModelRegistry()
    assert registry.register(FakeBlock) is FakeBlock
    registry.register(FakeBlock)  # idempotent
    with pytest.raises(ValueError, match="'FakeBlock' is already registered"):
        registry.register(FakeVocoder, name="FakeBlock")
    assert registry.resolve("FakeBlock") is FakeBlock
    with pytest.raises(CheckpointError, match=r"model registry: model class 'Nope'.*FakeBlock"):
        registry.resolve("Nope")
    spec = read_pipeline(write_pipeline(tmp_path, {"vocoder": FULL_PIPELINE["vocoder"]}))
    with pytest.raises(CheckpointError, match=r"model_index\.json \[vocoder\]: .*'FakeVocoder'"):
        VocoderLoader(registry=registry).load(
            spec.component("vocoder"), ServerArgs(runtime_device=CPU)
        )


def test_a_registry_is_a_value_built_from_a_mapping() -> None:
    classes = {"FakeBlock": FakeBlock, "Vocoder": FakeVocoder}
    registry = ModelRegistry.of(classes)
    assert registry.names() == ("FakeBlock", "Vocoder")
    assert registry.resolve("Vocoder") is FakeVocoder
    classes["Other"] = FakeBlock  # built once: editing the mapping registers nothing
    assert registry.names() == ("FakeBlock", "Vocoder")
    assert ModelRegistry().names() == ()  # no registry is shared


def test_vocoder_loader_honours_offload_and_refuses_mismatched_weights(tmp_path: Path) -> None:
    root = write_pipeline(tmp_path, {"vocoder": FULL_PIPELINE["vocoder"]})
    spec = read_pipeline(root).component("vocoder")
    args = ServerArgs(runtime_device=CPU, component_cpu_offload={"vocoder": True})
    loaded = VocoderLoader(registry=ModelRegistry.of(MODEL_CLASSES)).load(spec, args)
    assert loaded.report.plan.checkpoint_load_device == CPU
    assert loaded.report.copied == (5, sum(t.nbytes for t in loaded.module.state_dict().values()))
    # As diffusers' from_pretrained gives it: eval mode, requires_grad as constructed.
    assert not loaded.module.training
    assert all(p.requires_grad for p in loaded.module.parameters())
    # Same class, other shapes: refused naming the component (no fallback in the base class).
    wrong = FakeComponent(FakeVocoder, {"channels": 2, "upsample": 2})
    root2 = write_pipeline(tmp_path / "wrong", {"vocoder": wrong})
    (root2 / "vocoder" / "config.json").write_text(json.dumps({"channels": 4, "upsample": 2}))
    with pytest.raises(StateMismatchError, match=r"vocoder.*wrong shapes: 'conv\.weight' is"):
        VocoderLoader(registry=ModelRegistry.of(MODEL_CLASSES)).load(
            read_pipeline(root2).component("vocoder"), args
        )
    odd = FakeComponent(FakeBlock, {"width": 4})
    root3 = write_pipeline(tmp_path / "odd", {"vocoder": odd})
    (root3 / "model_index.json").write_text(json.dumps({"vocoder": ["fakes", "FakeVocoder"]}))
    with pytest.raises(CheckpointError, match=r"config\.json: does not fit FakeVocoder.*'width'"):
        VocoderLoader(registry=ModelRegistry.of(MODEL_CLASSES)).load(
            read_pipeline(root3).component("vocoder"), args
        )
    (root3 / "vocoder" / "config.json").write_text(json.dumps({"channels": 4, "upsample": 2}))
    missing = r"vocoder.*missing from the checkpoint: 'conv\.bias'"
    with pytest.raises(StateMismatchError, match=missing):
        VocoderLoader(registry=ModelRegistry.of(MODEL_CLASSES)).load(
            read_pipeline(root3).component("vocoder"), args
        )


def test_loader_lookup() -> None:
    assert [loader_kind(n) for n in ("transformer_2", "audio_vae", "vocoder")] == [
        "transformer",
        "vae",
        "vocoder",
    ]
    assert [loader_kind(n) for n in ("text_encoder", "text_encoder_2", "image_encoder")] == [
        "encoder"
    ] * 3
    with pytest.raises(LoadError, match="'safety_checker': no loader covers it"):
        loader_kind("safety_checker")
    platform = FakePlatform()
    loader = loader_for("vocoder", registry=ModelRegistry.of(MODEL_CLASSES), platform=platform)
    assert isinstance(loader, VocoderLoader)
    assert loader.platform is platform
    assert loader.supports_direct("vocoder") is False
    assert [type(loader_for(n)).__name__ for n in ("transformer_2", "video_vae")] == [
        "TransformerLoader",
        "VAELoader",
    ]


def test_direct_support_describes_itself() -> None:
    both = DirectSupport(dit_flag=True, components=frozenset({"vae"}))
    assert both.describe() == (
        "transformer components via --direct-gpu-weight-loading and"
        " --component-direct-gpu-weight-loading.<vae>"
    )
    assert DirectSupport().describe() == "no direct-GPU loading"


def test_parse_args_fills_every_option() -> None:
    args, rest = parse_args(
        [
            "--device=cuda:1",
            "--dit-cpu-offload",
            "--dit_layerwise_offload=false",
            "--component-cpu-offload.video-vae",
            "--fsdp-inference",
            "FALSE",
            "--tp-size",
            "2",
            "--quantization",
            "fp8",
            "--quantization-serialized",
        ]
    )
    assert rest == []
    assert args.runtime_device == torch.device("cuda", 1)
    assert (args.dit_cpu_offload, args.dit_layerwise_offload, args.fsdp_inference) == (
        True,
        False,
        False,
    )
    assert dict(args.component_cpu_offload) == {"video_vae": True}
    assert (args.tp_size, args.quantization) == (2, QuantizationSpec("fp8", serialized=True))
    assert args.is_cpu_offloaded("video-vae")
    assert args.is_cpu_offloaded("transformer")
    assert args.cpu_offload_flag("video_vae") == "--component-cpu-offload.video_vae=True"
    assert args.cpu_offload_flag("transformer") == "--dit-cpu-offload"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--device", "nowhere"], "--device: 'nowhere' is not a device"),
        (["--tp-size", "0"], "--tp-size: expected an integer >= 1"),
        (["--tp-size"], "--tp-size.*expected one argument"),
        (["--quantization="], "--quantization: empty method"),
        (["--quantization-serialized"], "needs --quantization METHOD"),
    ],
)
def test_parse_args_errors(argv: list[str], words: str) -> None:
    with pytest.raises(ArgumentError, match=words):
        parse_args(argv)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"runtime_device": "cuda"}, "runtime_device must be a torch.device"),
        ({"tp_size": 0}, "tp_size must be an integer >= 1"),
        ({"tp_size": True}, "tp_size must be an integer >= 1"),
        ({"fsdp_inference": 1}, "fsdp_inference must be True or False"),
        ({"quantization": "fp8"}, "quantization must be a QuantizationSpec"),
        ({"component_cpu_offload": [("vae", True)]}, "component_cpu_offload must map"),
    ],
)
def test_server_args_validate_every_field(options: dict[str, object], words: str) -> None:
    with pytest.raises(ArgumentError, match=words):
        ServerArgs(**options)  # type: ignore[arg-type]


def test_the_runtime_device_defaults_to_what_the_platform_reports() -> None:
    """Without a runtime device, loads settle it on their platform: cuda:0 with CUDA, else cpu;
    a device given explicitly is kept."""
    assert ServerArgs().runtime_device is None
    assert ServerArgs().on_platform(FakePlatform(cuda=False)).device == CPU
    assert ServerArgs().on_platform(FakePlatform()).device == torch.device("cuda", 0)
    explicit = ServerArgs(runtime_device=CPU)
    assert explicit.on_platform(FakePlatform()) is explicit
    with pytest.raises(ArgumentError, match="runtime_device is not settled"):
        _ = ServerArgs().device


def test_arguments_gate_defaults_to_the_main_transformer() -> None:
    args = ServerArgs(direct_gpu_weight_loading=True, dit_cpu_offload=True)
    with pytest.raises(ArgumentError, match="'transformer' is offloaded"):
        check_arguments(args, platform=FakePlatform())
    assert check_arguments(ServerArgs(), platform=FakePlatform(cuda=False)) == ()


def test_every_model_is_admitted_before_the_first_component_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unresolvable class in a later component fails the pipeline before any component loads
    (nothing half-loaded); weightless components are listed, with why, not refused."""
    from reference.load import pipeline as load_mod
    from reference.load.loaders import ComponentLoader

    root = write_pipeline(
        tmp_path,
        {"vocoder": FULL_PIPELINE["vocoder"], "vae": FakeComponent(FakeBlock, {"width": 4})},
        extra_index={
            "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
            "tokenizer": ["transformers", "AutoTokenizer"],
            "text_encoder": ["transformers", "T5EncoderModel"],
        },
    )
    index = json.loads((root / "model_index.json").read_text())
    index["vae"] = ["mylib", "NotRegistered"]
    (root / "model_index.json").write_text(json.dumps(index))
    loads: list[str] = []
    real_load = ComponentLoader.load

    def spy(self: ComponentLoader, component: object, args: ServerArgs) -> object:
        loads.append(getattr(component, "name", "?"))
        return real_load(self, component, args)  # type: ignore[arg-type]

    monkeypatch.setattr(ComponentLoader, "load", spy)
    with pytest.raises(CheckpointError, match=r"\[vae\]: model class 'NotRegistered'.*--models"):
        load_mod.load_pipeline(
            root, ServerArgs(runtime_device=CPU), registry=ModelRegistry.of(MODEL_CLASSES)
        )
    assert loads == []
    skipped = dict(load_mod.not_loaded(read_pipeline(root)))
    assert set(skipped) == {"scheduler", "tokenizer"}  # the text encoder has a loader (TE-1)
    assert skipped["scheduler"].startswith("diffusers.FlowMatchEulerDiscreteScheduler: ")
    assert "no weights" in skipped["tokenizer"]


@pytest.mark.parametrize("offload", [False, True], ids=["resident", "dit-cpu-offload"])
def test_library_load_without_a_device_runs_where_the_platform_says(
    tmp_path: Path, offload: bool
) -> None:
    """`load_pipeline(folder, ServerArgs())` on a machine without CUDA loads on the CPU, as the
    command line does; nothing asks torch for a CUDA device."""
    from fakes.pipelines import SMALL_PIPELINE
    from reference.load.pipeline import load_pipeline

    root = write_pipeline(tmp_path, SMALL_PIPELINE)
    loaded = load_pipeline(
        root,
        ServerArgs(dit_cpu_offload=offload),
        registry=ModelRegistry.of(MODEL_CLASSES),
        platform=NO_CUDA,
    )
    assert [c.name for c in loaded] == ["transformer", "vae", "vocoder"]
    for component in loaded:
        assert component.report.plan.checkpoint_load_device == CPU
        assert all(t.device == CPU for t in component.module.state_dict().values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where CUDA cannot be used")
@pytest.mark.parametrize("offload", [False, True], ids=["resident", "dit-cpu-offload"])
def test_a_torch_failure_inside_a_load_is_named_as_such(tmp_path: Path, offload: bool) -> None:
    """A platform that claims CUDA where torch has none: torch's own error, wrapped naming the
    component and the cause, never reported as a state mismatch."""
    from fakes.pipelines import SMALL_PIPELINE
    from reference.errors import ComponentLoadError
    from reference.load.pipeline import load_pipeline

    root = write_pipeline(tmp_path, SMALL_PIPELINE)
    with pytest.raises(ComponentLoadError, match=r"component '\w+': \w+Error while loading") as e:
        load_pipeline(
            root,
            ServerArgs(dit_cpu_offload=offload),
            registry=ModelRegistry.of(MODEL_CLASSES),
            platform=FakePlatform(),
        )
    assert not isinstance(e.value, StateMismatchError)
    # Components load at once (PIPE-4): whichever of those bound for CUDA fails first is named.
    on_cuda = {"vae", "vocoder"} if offload else {"transformer", "vae", "vocoder"}
    assert e.value.component in on_cuda
    assert e.value.__cause__ is e.value.cause
    assert str(root / e.value.component) in str(e.value)  # names the component's folder
