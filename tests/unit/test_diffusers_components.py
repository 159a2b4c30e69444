"""Real diffusers components beside the DiTs, VAEs and encoders (`fakes.diffusers_components`),
saved by diffusers' own `save_pretrained` and named in model_index.json as real pipelines name
them: vocoders (`VOCODERS`, the vocoder loader) and components of no named kind (`MODULES`:
LTX-2's text connectors, a UNet; the module loader). Each loader builds diffusers' own class,
alone and in a whole pipeline, and the module holds what diffusers' `from_pretrained` gives in
the same dtype (every state entry bit for bit, the same output: a vocoder's bit for bit, a
module's within tolerance); a name that is not one of diffusers' model classes is refused before
anything is read. Which components the module loader covers is decided by what their folders
hold, not by their names; whole LTX-2, Qwen-Image and Stable Diffusion pipelines load.

Needs the diffusers extra; without it these tests skip.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # read once when huggingface_hub is imported

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from fakes.diffusers_components import LTX2_CONNECTORS, MODULES, VOCODERS, DiffusersModel
from reference.errors import CheckpointError, ComponentCheckpointUnsupportedError
from reference.load.loaders import (
    ComponentLoader,
    EncoderLoader,
    ModuleLoader,
    VocoderLoader,
    loader_kind,
)
from reference.load.pipeline import load_pipeline, not_loaded
from reference.request.args import ServerArgs
from reference.request.model_index import (
    diffusers_pipeline_package,
    names_diffusers_class,
    read_pipeline,
)

pytestmark = [
    pytest.mark.internal,
    # Two vocoder classes build with torch's older weight_norm, which warns that it is.
    pytest.mark.filterwarnings("ignore:.*torch.nn.utils.weight_norm:FutureWarning"),
]

CPU = torch.device("cpu")
ARGS = ServerArgs(runtime_device=CPU)


@pytest.fixture(autouse=True)
def diffusers_installed() -> None:
    pytest.importorskip("diffusers", reason="needs the [diffusers] extra")


def _model_class(model: DiffusersModel) -> type[nn.Module]:
    try:
        cls: type[nn.Module] = model.model_class()
    except (AttributeError, ImportError):
        pytest.skip(f"this diffusers has no {model.class_name}")
    return cls


def _written(model: DiffusersModel, root: Path, dtype: torch.dtype) -> Path:
    """`model` written at `root`, its floating tensors stored in `dtype`."""
    _model_class(model)
    return model.write(root, dtype=dtype)


def _loaded(
    root: Path,
    name: str,
    way: str,
    args: ServerArgs = ARGS,
    loader: type[ComponentLoader] = ModuleLoader,
) -> nn.Module:
    if way == "alone":
        return loader().load(read_pipeline(root).component(name), args).module
    return {item.name: item.module for item in load_pipeline(root, args)}[name]


def _assert_same(module: nn.Module, expected: nn.Module) -> None:
    assert type(module) is type(expected)
    assert not module.training
    state, wanted = module.state_dict(), expected.state_dict()
    assert set(state) == set(wanted)
    for name, tensor in wanted.items():
        assert state[name].dtype == tensor.dtype, name
        assert torch.equal(state[name], tensor), name


@pytest.mark.parametrize("way", ["alone", "whole"])
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16], ids=lambda d: str(d).removeprefix("torch.")
)
@pytest.mark.parametrize("model", MODULES, ids=lambda m: f"{m.library}-{m.class_name}")
def test_a_diffusers_component_of_no_named_kind_loads_as_from_pretrained_gives_it(
    tmp_path: Path, model: DiffusersModel, dtype: torch.dtype, way: str
) -> None:
    """Stored in fp32 or bf16, it loads in the dtype its checkpoint stores (a default load
    converts nothing), as `from_pretrained(torch_dtype=<that dtype>)` gives it."""
    root = _written(model, tmp_path, dtype)
    folder = str(root / model.component)
    expected = _model_class(model).from_pretrained(folder, torch_dtype=dtype).eval()  # type: ignore[attr-defined]
    module = _loaded(root, model.component, way)
    _assert_same(module, expected)
    # Within tolerance, not bit for bit: the CPU's convolutions round by where their weights lie
    # (a deep copy of `expected` differs from it by ~1e-6); the state above is bit for bit.
    torch.testing.assert_close(model.output(module), model.output(expected))


@pytest.mark.parametrize("way", ["alone", "whole"])
def test_its_precision_is_the_component_precisions_entry_when_one_is_given(
    tmp_path: Path, way: str
) -> None:
    model = LTX2_CONNECTORS
    root = _written(model, tmp_path, torch.float32)
    args = ServerArgs(runtime_device=CPU, component_precisions={"connectors": torch.bfloat16})
    folder = str(root / model.component)
    expected = _model_class(model).from_pretrained(folder, torch_dtype=torch.bfloat16).eval()  # type: ignore[attr-defined]
    _assert_same(_loaded(root, "connectors", way, args), expected)


def test_which_components_it_covers_is_decided_by_what_their_folders_hold(
    tmp_path: Path,
) -> None:
    """A folder with a model (config.json, weights) is loaded, whatever its name; a tokenizer's
    vocabulary, a scheduler with no folder, and an empty folder are listed as not loaded; a
    model of the transformers library goes to the encoder loader."""
    root = _written(LTX2_CONNECTORS, tmp_path, torch.float32)
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "tokenizer_config.json").write_text("{}")
    (root / "tokenizer" / "tokenizer.json").write_text("{}")
    (root / "empty").mkdir()
    (root / "language_model").mkdir()
    (root / "language_model" / "config.json").write_text("{}")
    save_file({"w": torch.zeros(2)}, str(root / "language_model" / "model.safetensors"))
    index = json.loads((root / "model_index.json").read_text())
    index |= {
        "tokenizer": ["transformers", "GemmaTokenizerFast"],
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "empty": ["diffusers", "Nothing"],
        "language_model": ["transformers", "GPT2Model"],
    }
    (root / "model_index.json").write_text(json.dumps(index))
    pipeline = read_pipeline(root)
    kinds = {n: loader_kind(pipeline.component(n)) for n in ("connectors", "language_model")}
    assert kinds == {"connectors": "module", "language_model": "encoder"}
    assert {name for name, _ in not_loaded(pipeline)} == {"tokenizer", "scheduler", "empty"}


@pytest.mark.parametrize(
    ("library", "class_name"),
    [
        ("ltx2", "LTX2Pipeline"),  # a pipeline, not a model class
        ("ltx2", "os.path"),
        ("diffusers", "ModelMixin"),  # diffusers' base, no model
        ("diffusers", "FlowMatchEulerDiscreteScheduler"),  # not a model class
        ("mylib", "LTX2TextConnectors"),  # another library's class, not registered
    ],
)
def test_a_class_it_cannot_build_refuses_the_pipeline_before_reading(
    tmp_path: Path, library: str, class_name: str
) -> None:
    """PIPE-1: a weight-bearing component is loaded or the load is refused naming it, never
    left out; here refused at admission, before any tensor is read."""
    root = _written(LTX2_CONNECTORS, tmp_path, torch.float32)
    index = json.loads((root / "model_index.json").read_text())
    index["connectors"] = [library, class_name]
    (root / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"connectors.*" + class_name.replace(".", r"\.")):
        load_pipeline(root, ARGS)


def test_a_direct_request_for_it_is_refused_by_its_loader(tmp_path: Path) -> None:
    """ADM-3: the module loader declares no direct-GPU support."""
    root = _written(LTX2_CONNECTORS, tmp_path, torch.float32)
    args = ServerArgs(runtime_device=CPU, component_direct_gpu_weight_loading={"connectors": True})
    with pytest.raises(ComponentCheckpointUnsupportedError, match="connectors"):
        ModuleLoader().admit(read_pipeline(root).component("connectors"), args)


@pytest.mark.parametrize("way", ["alone", "whole"])
def test_a_transformers_model_of_no_encoder_name_loads_as_from_pretrained_gives_it(
    tmp_path: Path, way: str
) -> None:
    """AudioLDM 2 declares `language_model` (`GPT2Model`) and a `vocoder` (`SpeechT5HifiGan`)
    of the transformers library: both load through the encoder loader, the language model in
    the dtype its checkpoint stores (bf16 here), the vocoder in the vocoder's precision
    (`--vae-precision`, fp32 by default)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    models: dict[str, nn.Module] = {
        "language_model": transformers.GPT2Model(
            transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50, n_positions=16)
        ),
        "vocoder": transformers.SpeechT5HifiGan(
            transformers.SpeechT5HifiGanConfig(
                model_in_dim=8,
                upsample_initial_channel=16,
                upsample_rates=[2, 2],
                upsample_kernel_sizes=[4, 4],
                resblock_kernel_sizes=[3],
                resblock_dilation_sizes=[[1, 3]],
            )
        ),
    }
    index: dict[str, object] = {"_class_name": "AudioLDM2Pipeline"}
    for name, model in models.items():
        model.to(torch.bfloat16).save_pretrained(str(tmp_path / name))  # type: ignore[operator]
        index[name] = ["transformers", type(model).__name__]
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    pipeline = read_pipeline(tmp_path)
    loaded = (
        {n: EncoderLoader().load(pipeline.component(n), ARGS).module for n in models}
        if way == "alone"
        else {item.name: item.module for item in load_pipeline(tmp_path, ARGS)}
    )
    for name, dtype in (("language_model", torch.bfloat16), ("vocoder", torch.float32)):
        cls = type(models[name])
        expected = cls.from_pretrained(str(tmp_path / name), torch_dtype=dtype).eval()  # type: ignore[attr-defined]
        _assert_same(loaded[name], expected)


def _stable_diffusion(root: Path) -> Path:
    """A Stable Diffusion pipeline of diffusers' own classes (`UNet2DConditionModel`,
    `AutoencoderKL`, `CLIPTextModel`, its tokenizer and scheduler), tiny, saved in fp32 by
    `StableDiffusionPipeline.save_pretrained` without a safety checker (absent entries are
    written `[null, null]`)."""
    diffusers = pytest.importorskip("diffusers")
    pytest.importorskip("transformers")
    from fakes import text_encoders
    from fakes.diffusers_components import UNET
    from fakes.diffusers_vaes import IMAGE_KL

    _model_class(UNET)
    torch.manual_seed(0)
    pipeline = diffusers.StableDiffusionPipeline(
        vae=IMAGE_KL.build(1),
        text_encoder=text_encoders.build("CLIPTextModel"),
        tokenizer=text_encoders.build("CLIPTokenizer"),
        unet=UNET.build(2),
        scheduler=diffusers.PNDMScheduler(steps_offset=1),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.save_pretrained(str(root))
    return root


def test_a_stable_diffusion_pipeline_loads_whole_as_from_pretrained_gives_it(
    tmp_path: Path,
) -> None:
    """Its UNet (a component of no named kind) loads beside the VAE and the text encoder, each
    bit for bit as diffusers' `DiffusionPipeline.from_pretrained` gives it; the tokenizer and
    the scheduler are listed as not loaded."""
    diffusers = pytest.importorskip("diffusers")
    root = _stable_diffusion(tmp_path)
    loaded = {item.name: item.module for item in load_pipeline(root, ARGS)}
    assert set(loaded) == {"vae", "text_encoder", "unet"}
    assert {name for name, _ in not_loaded(read_pipeline(root))} == {"tokenizer", "scheduler"}
    expected = diffusers.StableDiffusionPipeline.from_pretrained(str(root))
    for name, module in loaded.items():
        _assert_same(module, getattr(expected, name).eval())


def test_a_safety_checker_it_cannot_build_refuses_the_pipeline_saying_how_to_leave_it_out(
    tmp_path: Path,
) -> None:
    """Stable Diffusion 1.x ships `safety_checker` (`["stable_diffusion",
    "StableDiffusionSafetyChecker"]`, a transformers model defined in a diffusers pipeline
    package, which no loader builds): the load is refused naming it (PIPE-1), and with the
    entry marked absent as diffusers marks it, the pipeline loads."""
    transformers = pytest.importorskip("transformers")
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker

    root = _stable_diffusion(tmp_path)
    small = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    config = transformers.CLIPConfig(
        text_config={**small, "num_attention_heads": 4},
        vision_config={**small, "num_attention_heads": 4, "image_size": 8, "patch_size": 4},
        projection_dim=32,
    )
    StableDiffusionSafetyChecker(config).save_pretrained(str(root / "safety_checker"))
    index = json.loads((root / "model_index.json").read_text())
    index["safety_checker"] = ["stable_diffusion", "StableDiffusionSafetyChecker"]
    (root / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"safety_checker.*\[null, null\]"):
        load_pipeline(root, ARGS)
    index["safety_checker"] = [None, None]
    (root / "model_index.json").write_text(json.dumps(index))
    assert {item.name for item in load_pipeline(root, ARGS)} == {"vae", "text_encoder", "unet"}


BF16, FP32 = torch.bfloat16, torch.float32
WHOLE: dict[str, tuple[str, dict[str, torch.dtype]]] = {
    # Each component's default precision: --dit-precision's (bf16) for the DiT,
    # --vae-precision's (fp32) for every VAE and the vocoder, the dtype its checkpoint stores
    # (fp32 here) for a text encoder (TE-3) and a component of no named kind.
    "ltx2": (
        "ltx2_pipeline",
        {
            "transformer": BF16,
            "vae": FP32,
            "audio_vae": FP32,
            "vocoder": FP32,
            "text_encoder": FP32,
            "connectors": FP32,
            "duration_head": FP32,
        },
    ),
    "qwen-image": (
        "qwen_image_pipeline",
        {"transformer": BF16, "vae": FP32, "text_encoder": FP32},
    ),
}


@pytest.mark.parametrize("pipeline", sorted(WHOLE))
def test_a_whole_pipeline_loads_every_component_as_from_pretrained_gives_it(
    tmp_path: Path, pipeline: str
) -> None:
    """`LTX2Pipeline`'s and `QwenImagePipeline`'s `save_pretrained` folders: every component
    loads (LTX-2: DiT, video and audio VAEs, vocoder, Gemma 3 text encoder, text connectors,
    duration head;
    Qwen-Image: DiT, VAE, Qwen2.5-VL text encoder; both text encoders saved under transformers'
    former layout), each bit for bit as its class's `from_pretrained` gives it in its default
    precision; the tokenizer and the scheduler are listed as not loaded."""
    pytest.importorskip("transformers")
    from fakes import diffusers_components

    build, precisions = WHOLE[pipeline]
    try:
        written = getattr(diffusers_components, build)()
    except (AttributeError, ImportError):
        pytest.skip(f"this diffusers or transformers lacks a class of {build}")
    written.save_pretrained(str(tmp_path))
    loaded = {item.name: item.module for item in load_pipeline(tmp_path, ARGS)}
    assert set(loaded) == set(precisions)
    assert {name for name, _ in not_loaded(read_pipeline(tmp_path))} == {"tokenizer", "scheduler"}
    for name, module in loaded.items():
        cls: Any = type(module)
        expected = cls.from_pretrained(str(tmp_path / name), torch_dtype=precisions[name])
        _assert_same(module, expected.eval())


# --- vocoders -------------------------------------------------------------------------------------


@pytest.mark.parametrize("way", ["alone", "whole"])
@pytest.mark.parametrize("vocoder", VOCODERS, ids=lambda v: f"{v.library}-{v.class_name}")
def test_a_diffusers_vocoder_loads_as_from_pretrained_gives_it(
    tmp_path: Path, vocoder: DiffusersModel, way: str
) -> None:
    cls = _model_class(vocoder)
    root = vocoder.write(tmp_path)
    expected: nn.Module = cls.from_pretrained(str(root / "vocoder")).eval()  # type: ignore[attr-defined]
    module = _loaded(root, "vocoder", way, loader=VocoderLoader)
    _assert_same(module, expected)
    assert torch.equal(vocoder.output(module), vocoder.output(expected))


@pytest.mark.parametrize(
    ("library", "class_name"),
    [
        ("ltx2", "LTX2Pipeline"),  # a pipeline, not a model class
        ("ltx2", "AutoencoderKLLTX2Video"),  # a model class the package imports, not defines
        ("ltx2", "os.path"),
        ("diffusers", "LTX2Vocoder"),  # not among diffusers' autoencoders
    ],
)
def test_a_name_that_is_no_diffusers_vocoder_class_is_refused_before_reading(
    tmp_path: Path, library: str, class_name: str
) -> None:
    vocoder = VOCODERS[0]
    _model_class(vocoder)
    root = vocoder.write(tmp_path)
    index = json.loads((root / "model_index.json").read_text())
    index["vocoder"] = [library, class_name]
    (root / "model_index.json").write_text(json.dumps(index))
    spec = read_pipeline(root).component("vocoder")
    with pytest.raises(CheckpointError, match=class_name.replace(".", r"\.")):
        VocoderLoader().admit(spec, ARGS)


def test_a_library_names_a_diffusers_pipeline_package_only_where_diffusers_has_one() -> None:
    assert diffusers_pipeline_package("ltx2") == "diffusers.pipelines.ltx2"
    for library in ("diffusers", "fakes", "os", "../ltx2", "ltx2.vocoder", ""):
        assert diffusers_pipeline_package(library) is None, library
    assert names_diffusers_class("diffusers")
    assert names_diffusers_class("ltx2")
    assert not names_diffusers_class("fakes")
