"""TE: text and image encoders, the `transformers` components of a pipeline (TE-1..4).

Every real encoder class the suite's pipelines declare (T5, UMT5, CLIP text with and without
projection, Gemma 2, BERT; and CLIP vision as an image encoder), tiny, written by transformers'
own `save_pretrained` in fp32 and in bf16, is loaded through the loader under test and judged
slot by slot, bit for bit, against `<Class>.from_pretrained(folder, torch_dtype=...)`: names,
dtypes (the fp32-kept modules included), values; where each slot's bytes live under CPU offload
(a mapping of the checkpoint file at that tensor's offset); ties; refusals and what was read
before them. Offline: nothing is downloaded.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

from fakes import text_encoders
from fakes.platform import FakePlatform
from reference.extras import install_hint
from reference.kit.judging.evidence import (
    DataReads,
    data_bytes,
    evidence_missing,
    safetensors_files,
)
from reference.kit.judging.file_maps import file_position, maps_missing, tensor_positions
from reference.kit.judging.judge import refusal
from reference.kit.seam import (
    CLI_ARGS,
    TEXT_ENCODERS,
    EncoderRequest,
    Precisions,
    SeamLoader,
    ServerArgsLike,
    ServingOptions,
)

EXTRA = f"needs the diffusers extra (transformers): {install_hint('diffusers')}"
NO_CUDA = FakePlatform(cuda=False)
FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
ENCODERS = (
    "T5EncoderModel",
    "UMT5EncoderModel",
    "CLIPTextModel",
    "CLIPTextModelWithProjection",
    "Gemma2Model",
    "BertModel",
    "Gemma3ForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
)
"""Every text encoder class the suite's hub pipelines declare (fakes/diffusers_pipelines.py),
and LTX-2's and Qwen-Image's, which transformers saves under a former layout of their names and
renames on load."""
T5S = ("T5EncoderModel", "UMT5EncoderModel")
STORED = {"fp32": FP32, "bf16": BF16}
TIED = ("shared.weight", "encoder.embed_tokens.weight")
"""T5's tied pair: `save_pretrained` writes the first."""


@pytest.fixture(scope="module")
def transformers() -> ModuleType:
    module = pytest.importorskip("transformers", reason=EXTRA)
    module.utils.logging.set_verbosity_error()
    module.utils.logging.disable_progress_bar()
    return module


def write_pipeline(
    root: Path, encoders: Mapping[str, tuple[str, torch.dtype]], *, seed: int = 0
) -> Path:
    """A pipeline folder whose components are `encoders` (component -> (class, stored dtype)),
    each written by its class's own `save_pretrained`."""
    index: dict[str, Any] = {"_class_name": "EncoderTestPipeline", "_diffusers_version": "0.42.1"}
    for i, (component, (class_name, dtype)) in enumerate(encoders.items()):
        torch.manual_seed(seed + i)
        model = text_encoders.build(class_name).to(dtype)
        model.save_pretrained(str(root / component))
        index[component] = ["transformers", class_name]
    (root / "model_index.json").write_text(json.dumps(index))
    return root


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory, transformers: ModuleType) -> dict[str, Path]:
    """One pipeline per class and stored dtype ("T5EncoderModel-bf16", ...), written once."""
    base = tmp_path_factory.mktemp("encoders")
    return {
        f"{name}-{stored}": write_pipeline(base / f"{name}-{stored}", {"text_encoder": (name, d)})
        for name in ENCODERS
        for stored, d in STORED.items()
    }


def server_args(
    loader: SeamLoader,
    device: torch.device,
    *,
    offload: Mapping[str, bool],
    precisions: Mapping[str, torch.dtype] | None,
) -> ServerArgsLike:
    given = None if precisions is None else Precisions(dit=BF16, vae=FP32, components=precisions)
    options = ServingOptions(runtime_device=device, component_cpu_offload=offload, precisions=given)
    return loader.make_server_args(options)


def load(
    loader: SeamLoader, root: Path, args: ServerArgsLike, component: str = "text_encoder"
) -> nn.Module:
    return loader.load_text_encoder(EncoderRequest(root, component, args=args, platform=NO_CUDA))


def from_pretrained(
    transformers: ModuleType, root: Path, component: str, dtype: torch.dtype
) -> nn.Module:
    index = json.loads((root / "model_index.json").read_text())
    cls = getattr(transformers, index[component][1])
    model: nn.Module = cls.from_pretrained(str(root / component), torch_dtype=dtype)
    return model


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu().reshape(-1).view(torch.uint8)


def assert_as_from_pretrained(module: nn.Module, expected: nn.Module) -> None:
    """TE-1: names, dtypes and values of every slot bit for bit; eval mode; nothing on meta
    (OUT-1). A non-persistent buffer holds what from_pretrained's or an ordinary construction
    gives it, or what from_pretrained's holds once cast to its dtype (PREC-1 leaves its dtype
    free)."""
    state, want = module.state_dict(), expected.state_dict()
    assert sorted(state) == sorted(want)
    for name, tensor in state.items():
        assert tensor.dtype == want[name].dtype, name
        assert tensor.shape == want[name].shape, name
        assert torch.equal(bits(tensor), bits(want[name])), name
    assert not module.training
    assert not any(t.is_meta for t in [*module.parameters(), *module.buffers()])
    built = {k: v for k, v in type(expected)(expected.config).named_buffers() if k not in want}
    theirs = {k: v for k, v in expected.named_buffers() if k not in want}
    for name, buffer in module.named_buffers():
        if name in state:
            continue
        assert name in theirs, name
        same = [torch.equal(buffer.cpu(), b.to(buffer.dtype)) for b in (theirs[name], built[name])]
        # Kept as an fp32 construction made it, where from_pretrained constructs in the
        # precision (Gemma 3's `embed_scale`): the same value once given the same treatment.
        same.append(torch.equal(buffer.cpu().to(theirs[name].dtype), theirs[name].cpu()))
        assert any(same), name


def saved_names(expected: nn.Module) -> dict[str, str]:
    """Each slot of `expected` (loaded by `from_pretrained`) -> the name its checkpoint holds
    it under, as transformers itself maps them back when it saves (`revert_weight_conversion`:
    transformers 5 saves some classes under a former layout); the slot's own name where
    transformers has no such mapping."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        return {name: name for name in expected.state_dict()}
    names = {}
    for name, tensor in expected.state_dict().items():
        (saved,) = revert_weight_conversion(expected, {name: tensor})  # type: ignore[arg-type]
        names[name] = saved
    return names


def assert_adopted(module: nn.Module, folder: Path, names: Mapping[str, str]) -> None:
    """Every slot named in the checkpoint (`names`: slot -> checkpoint name) whose dtype is its
    checkpoint tensor's lies in the file's map at that tensor's offset (ZC-2b, PREC-4). A tied
    name the checkpoint does not hold is TE-2's to judge."""
    positions = tensor_positions(folder)
    dtypes = {n: t.dtype for n, t in module.state_dict().items()}
    stored = _stored_dtypes(folder)
    checked = 0
    for name, tensor in module.state_dict().items():
        written = names.get(name, name)
        if written not in positions or stored[written] != dtypes[name]:
            continue
        assert file_position(tensor) == positions[written], f"{name} was not adopted"
        checked += 1
    assert checked, "no slot was in its checkpoint's dtype"


def _stored_dtypes(folder: Path) -> dict[str, torch.dtype]:
    names = {"F32": FP32, "BF16": BF16, "F16": FP16, "I64": torch.int64}
    found: dict[str, torch.dtype] = {}
    for path in safetensors_files(folder):
        with path.open("rb") as f:
            length = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(length))
        for name, entry in header.items():
            if name != "__metadata__":
                found[name] = names.get(entry["dtype"], torch.uint8)
    return found


# --- TE-1: every class, both stored dtypes, offloaded and resident -------------------------------


@pytest.mark.rule("TE-1")
@pytest.mark.capability(TEXT_ENCODERS)
@pytest.mark.parametrize("offload", [True, False], ids=["offloaded", "resident"])
@pytest.mark.parametrize("stored", list(STORED))
@pytest.mark.parametrize("name", ENCODERS)
@pytest.mark.parametrize("precision", ["stored", "other"])
def test_every_encoder_loads_as_from_pretrained_gives_it(
    loader: SeamLoader,
    *,
    transformers: ModuleType,
    written: dict[str, Path],
    runtime_device: torch.device,
    name: str,
    stored: str,
    offload: bool,
    precision: str,
) -> None:
    """Each class, stored in fp32 or bf16, loaded in its stored dtype and in the other one:
    every slot as `from_pretrained(torch_dtype=)` gives it, bit for bit; offloaded and in its
    slot's dtype, every tensor adopted from the file; resident, on the runtime device."""
    root = written[f"{name}-{stored}"]
    dtype = STORED[stored] if precision == "stored" else (BF16 if stored == "fp32" else FP32)
    args = server_args(
        loader,
        runtime_device,
        offload={"text_encoder": offload},
        precisions={"text_encoder": dtype},
    )
    module = load(loader, root, args)
    expected = from_pretrained(transformers, root, "text_encoder", dtype)
    assert_as_from_pretrained(module, expected)
    if offload:
        assert all(t.device.type == "cpu" for t in module.state_dict().values())
        if precision == "stored" and maps_missing() is None:
            assert_adopted(module, root / "text_encoder", saved_names(expected))
    else:
        assert {t.device.type for t in module.state_dict().values()} == {runtime_device.type}


@pytest.mark.rule("TE-1")
@pytest.mark.capability(TEXT_ENCODERS)
def test_the_build_initialises_and_allocates_nothing(
    loader: SeamLoader,
    transformers: ModuleType,
    tmp_path: Path,
    runtime_device: torch.device,
) -> None:
    """A CLIP text model of a few MiB stored in bf16 (no tied slots: those are TE-2's), loaded
    CPU-offloaded in bf16: the load draws no random number (a real initialisation draws one per
    weight) and the process's resident memory grows by far less than the weights (a build that
    allocates its slots grows by their bytes)."""
    if (reason := evidence_missing()) is not None:
        pytest.skip(reason)
    config = transformers.CLIPTextConfig(
        vocab_size=8192,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=8,
        max_position_embeddings=77,
    )
    folder = tmp_path / "clip"
    transformers.CLIPTextModel(config).to(BF16).save_pretrained(str(folder / "text_encoder"))
    index = {
        "_class_name": "EncoderTestPipeline",
        "text_encoder": ["transformers", "CLIPTextModel"],
    }
    (folder / "model_index.json").write_text(json.dumps(index))
    args = server_args(loader, runtime_device, offload={"text_encoder": True}, precisions=None)
    load(loader, folder, args)  # warm: the first load of a kind pays one-time costs
    data = data_bytes(*safetensors_files(folder / "text_encoder"))
    state = torch.random.get_rng_state()
    with DataReads() as seen:
        module = load(loader, folder, args)
    assert torch.equal(torch.random.get_rng_state(), state), "the load drew random numbers"
    assert seen.peak_growth < data // 4, (
        f"resident memory grew {seen.peak_growth} bytes loading {data} bytes of weights"
    )
    del module


# --- TE-2: ties ----------------------------------------------------------------------------------


def _resaved(source: Path, root: Path, edit: Any) -> Path:
    """A copy of the pipeline at `source` whose text encoder's tensors `edit` rewrote."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, root)
    path = root / "text_encoder" / "model.safetensors"
    tensors = dict(load_file(str(path)))
    save_file(edit(tensors), str(path), metadata={"format": "pt"})
    return root


@pytest.mark.rule("TE-2")
@pytest.mark.capability(TEXT_ENCODERS)
@pytest.mark.parametrize("offload", [True, False], ids=["offloaded", "resident"])
@pytest.mark.parametrize("name", T5S)
def test_tied_slots_share_one_storage(
    loader: SeamLoader,
    written: dict[str, Path],
    runtime_device: torch.device,
    name: str,
    offload: bool,
) -> None:
    """T5's embeddings, as `save_pretrained` wrote them (one name): one storage for both names
    after the load, holding the checkpoint's values."""
    root = written[f"{name}-bf16"]
    args = server_args(loader, runtime_device, offload={"text_encoder": offload}, precisions=None)
    module = load(loader, root, args)
    state = module.state_dict()
    assert state[TIED[0]].data_ptr() == state[TIED[1]].data_ptr()
    assert module.get_parameter(TIED[0]) is module.get_parameter(TIED[1])


@pytest.mark.rule("TE-2")
@pytest.mark.capability(TEXT_ENCODERS)
@pytest.mark.parametrize("held", ["both-equal", "other-name"])
def test_either_tied_name_fills_the_slot(
    loader: SeamLoader,
    *,
    transformers: ModuleType,
    written: dict[str, Path],
    tmp_path: Path,
    runtime_device: torch.device,
    held: str,
) -> None:
    """A checkpoint holding both tied names with equal values, or only the name
    `save_pretrained` does not write: the slot is one storage with those values; offloaded, it
    is adopted once, from one of the names' bytes in the file."""
    source = written["T5EncoderModel-bf16"]

    def edit(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        shared = tensors.pop(TIED[0])
        if held == "both-equal":
            return {**tensors, TIED[0]: shared, TIED[1]: shared.clone()}
        return {**tensors, TIED[1]: shared}

    root = _resaved(source, tmp_path / held, edit)
    args = server_args(loader, runtime_device, offload={"text_encoder": True}, precisions=None)
    module = load(loader, root, args)
    expected = from_pretrained(transformers, source, "text_encoder", BF16)
    assert_as_from_pretrained(module, expected)
    state = module.state_dict()
    assert state[TIED[0]].data_ptr() == state[TIED[1]].data_ptr()
    if maps_missing() is None:
        positions = tensor_positions(root / "text_encoder")
        spots = {positions[n] for n in TIED if n in positions}
        assert file_position(state[TIED[0]]) in spots, "the tied slot was not adopted"


@pytest.mark.rule("TE-2")
@pytest.mark.capability(TEXT_ENCODERS)
def test_different_tied_values_are_refused_naming_both(
    loader: SeamLoader, written: dict[str, Path], tmp_path: Path, runtime_device: torch.device
) -> None:
    """Both tied names, different values: which would the model hold? Refused, naming both."""

    def edit(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {**tensors, TIED[1]: tensors[TIED[0]] + 1}

    root = _resaved(written["T5EncoderModel-bf16"], tmp_path / "different", edit)
    args = server_args(loader, runtime_device, offload={"text_encoder": True}, precisions=None)
    refusal(lambda: load(loader, root, args), *TIED)


# --- TE-3: precision -----------------------------------------------------------------------------


@pytest.mark.rule("TE-3")
@pytest.mark.capability(TEXT_ENCODERS)
@pytest.mark.parametrize("stored", list(STORED))
@pytest.mark.parametrize("name", ["T5EncoderModel", "CLIPTextModel"])
def test_default_precision_is_the_stored_dtype(
    loader: SeamLoader,
    *,
    transformers: ModuleType,
    written: dict[str, Path],
    runtime_device: torch.device,
    name: str,
    stored: str,
) -> None:
    """With no precision given, an encoder computes in the dtype its checkpoint stores: every
    slot as `from_pretrained(torch_dtype=<stored>)` gives it, nothing converted (offloaded,
    every tensor adopted)."""
    root = written[f"{name}-{stored}"]
    args = server_args(loader, runtime_device, offload={"text_encoder": True}, precisions=None)
    module = load(loader, root, args)
    expected = from_pretrained(transformers, root, "text_encoder", STORED[stored])
    assert_as_from_pretrained(module, expected)


@pytest.fixture(scope="module")
def two_encoders(tmp_path_factory: pytest.TempPathFactory, transformers: ModuleType) -> Path:
    """FLUX's pair: a CLIP text model and a T5 encoder, both stored in bf16, and an image
    encoder (CLIP vision) stored in fp32."""
    return write_pipeline(
        tmp_path_factory.mktemp("two") / "pipeline",
        {
            "text_encoder": ("CLIPTextModel", BF16),
            "text_encoder_2": ("T5EncoderModel", BF16),
            "image_encoder": ("CLIPVisionModelWithProjection", FP32),
        },
    )


@pytest.mark.rule("TE-3")
@pytest.mark.capability(TEXT_ENCODERS, CLI_ARGS)
@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--text-encoder-precisions", "fp16"], {"text_encoder": FP16, "text_encoder_2": FP16}),
        (
            ["--text-encoder-precisions", "fp32", "fp16"],
            {"text_encoder": FP32, "text_encoder_2": FP16},
        ),
        (
            ["--text-encoder-precisions", "fp16", "--component-precisions.text_encoder_2=fp32"],
            {"text_encoder": FP16, "text_encoder_2": FP32},
        ),
        (["--image-encoder-precision", "fp16"], {"image_encoder": FP16, "text_encoder": BF16}),
        (["--component-precisions.image_encoder=bf16"], {"image_encoder": BF16}),
    ],
    ids=["one-for-all", "one-each", "component-over-all", "image-encoder", "component"],
)
def test_precision_flags_set_each_encoder(
    loader: SeamLoader,
    *,
    transformers: ModuleType,
    two_encoders: Path,
    runtime_device: torch.device,
    flags: list[str],
    expected: dict[str, torch.dtype],
) -> None:
    """The flags upstream names: every encoder in the dtype they give it, the modules the class
    keeps in fp32 (T5's `wo` under fp16) as `from_pretrained(torch_dtype=)` keeps them."""
    args, rest = loader.parse_server_args(
        [
            *flags,
            "--device",
            runtime_device.type,
            *(f"--component-cpu-offload.{c}" for c in expected),
        ]
    )
    assert rest == []
    for component, dtype in expected.items():
        module = load(loader, two_encoders, args, component)
        assert_as_from_pretrained(
            module, from_pretrained(transformers, two_encoders, component, dtype)
        )


@pytest.mark.rule("TE-3")
@pytest.mark.capability(TEXT_ENCODERS, CLI_ARGS)
@pytest.mark.parametrize("values", [["fp16", "fp16", "fp16"], ["bf16", "fp32", "fp16", "fp16"]])
def test_another_count_of_text_encoder_precisions_is_refused(
    loader: SeamLoader, two_encoders: Path, values: list[str]
) -> None:
    """Two text encoders: one value or two; three or four name the flag."""
    refusal(
        lambda: load(
            loader,
            two_encoders,
            loader.parse_server_args(["--text-encoder-precisions", *values])[0],
        ),
        "--text-encoder-precisions",
    )


# --- TE-4: refusals before any tensor data is read ----------------------------------------------


MIB = 1 << 20


def write_refused(root: Path, class_name: str, config: Mapping[str, Any]) -> Path:
    """A pipeline whose text encoder names `class_name`, with `config` and 8 MiB of weights
    (enough for read evidence to dwarf headers and bookkeeping)."""
    from safetensors.torch import save_file

    folder = root / "text_encoder"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(
        {"shared.weight": torch.zeros(2 * MIB, dtype=FP32)}, str(folder / "model.safetensors")
    )
    index = {"_class_name": "EncoderTestPipeline", "text_encoder": ["transformers", class_name]}
    (root / "model_index.json").write_text(json.dumps(index))
    return root


T5_CONFIG = {"model_type": "t5", "vocab_size": 32, "d_model": 32, "num_layers": 1}
REFUSED = {
    "missing-class": ("NoSuchEncoderModel", T5_CONFIG),
    "auto-map": (
        "T5EncoderModel",
        {**T5_CONFIG, "auto_map": {"AutoModel": "modeling_evil.EvilModel"}},
    ),
    "quantization": (
        "T5EncoderModel",
        {
            **T5_CONFIG,
            "quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True},
        },
    ),
    "no-transformers": ("T5EncoderModel", T5_CONFIG),
}


@pytest.mark.rule("TE-4")
@pytest.mark.capability(TEXT_ENCODERS)
@pytest.mark.parametrize("case", list(REFUSED))
def test_an_encoder_that_cannot_be_built_is_refused_before_its_data_is_read(
    loader: SeamLoader,
    *,
    transformers: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    runtime_device: torch.device,
    case: str,
) -> None:
    """A class this transformers lacks, custom code, a quantization the loader does not
    implement, transformers not installed: refused, naming the component and the class, with
    no tensor data read (nor loaded by another library instead)."""
    if (reason := evidence_missing()) is not None:
        pytest.skip(reason)
    class_name, config = REFUSED[case]
    root = write_refused(tmp_path / case, class_name, config)
    args = server_args(loader, runtime_device, offload={"text_encoder": True}, precisions=None)
    if case == "no-transformers":
        monkeypatch.setitem(sys.modules, "transformers", None)  # an import of it now fails
    with DataReads() as seen:
        refusal(lambda: load(loader, root, args), "text_encoder", class_name)
    seen.assert_no_data_read(data_bytes(*safetensors_files(root / "text_encoder")))


@pytest.mark.rule("TE-4")
@pytest.mark.reference_only("drives the reference's own command line and wording")
def test_the_load_command_refuses_before_any_component_is_read(
    transformers: ModuleType, tmp_path: Path
) -> None:
    """`python -m reference load` on a pipeline whose second encoder names a class transformers
    lacks: exit 2, one line naming the component and the class, and not a byte of the first
    (loadable) encoder's weights read: every component is admitted before any loads."""
    if (reason := evidence_missing()) is not None:
        pytest.skip(reason)
    from .command import run_reference

    root = tmp_path / "pipeline"
    config = transformers.CLIPTextConfig(
        vocab_size=8192, hidden_size=256, intermediate_size=512, num_hidden_layers=2
    )
    transformers.CLIPTextModel(config).to(BF16).save_pretrained(str(root / "text_encoder"))
    write_refused(root / "second", "NoSuchEncoderModel", T5_CONFIG)
    shutil.move(root / "second" / "text_encoder", root / "text_encoder_2")
    index = {
        "_class_name": "EncoderTestPipeline",
        "text_encoder": ["transformers", "CLIPTextModel"],
        "text_encoder_2": ["transformers", "NoSuchEncoderModel"],
    }
    (root / "model_index.json").write_text(json.dumps(index))
    with DataReads() as seen:
        done = run_reference("load", str(root), "--device", "cpu", hide_cuda=True)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "text_encoder_2" in line
    assert "NoSuchEncoderModel" in line
    seen.assert_no_data_read(data_bytes(*safetensors_files(root / "text_encoder")))
