"""PREC: the dtype each component computes in, and what happens to checkpoint tensors of others.

Every load hands the loader its precision explicitly (`Precisions` in the `ServingOptions` of
`make_server_args`, `dtype` in the `DitRequest` and `VaeRequest`): no test leans on a loader's
defaults, except the one that judges the defaults themselves from the command line.
Checkpoints are written as users get them: a DiT saved in bf16 (the class's fp32 modules in
fp32, as diffusers saves a model it loaded with `torch_dtype`), or in fp32; values are judged
against `tensor.to(dtype)` of the file's own tensor, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from fakes.dit import DefaultDtypeDiT, DiTConfig, write_dit_checkpoint
from fakes.layers import LINEAR_KINDS
from fakes.pipelines import (
    MODEL_CLASSES,
    FakeComponent,
    PipelineDiT,
    PipelineKeptDiT,
    PipelineVAE,
    write_pipeline,
)
from fakes.platform import FakePlatform
from fakes.vae_checkpoints import write_vae_checkpoint
from reference.kit.isolated import Attempt
from reference.kit.judging.evidence import evidence_missing
from reference.kit.judging.file_maps import file_position, maps_missing, tensor_positions
from reference.kit.judging.judge import refusal
from reference.kit.judging.load_paths import direct_load_host_growth
from reference.kit.seam import (
    CLI_ARGS,
    DIRECT_DIT,
    PIPELINES,
    VAE_STREAM,
    ZERO_COPY,
    ComponentRequest,
    DitRequest,
    Plan,
    Precisions,
    SeamLoader,
    ServingOptions,
    VaeRequest,
)

CPU = torch.device("cpu")
NO_CUDA = FakePlatform(cuda=False)
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
NAMES = {BF16: "bf16", FP16: "fp16", FP32: "fp32"}


def saved(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files in `folder`, as stored."""
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def pipeline(
    root: Path, *, dit_saved: torch.dtype | None, dit: type[nn.Module] = PipelineDiT
) -> Path:
    """Two DiTs, as Wan 2.2 has them (`transformer` and `transformer_2`, saved in `dit_saved`;
    None: as built, fp32), and a video VAE (fp32)."""
    components = {
        name: FakeComponent(dit, {"hidden": 32, "depth": 2}, seed=seed, checkpoint_dtype=dit_saved)
        for name, seed in (("transformer", 2), ("transformer_2", 4))
    }
    components["vae"] = FakeComponent(PipelineVAE, {}, seed=3)
    return write_pipeline(root, components)


def load_component(
    loader: SeamLoader,
    root: Path,
    component: str,
    precisions: Precisions,
    *,
    offload: bool = False,
) -> nn.Module:
    args = loader.make_server_args(
        ServingOptions(runtime_device=CPU, dit_cpu_offload=offload, precisions=precisions)
    )
    return loader.load_pipeline_component(
        ComponentRequest(root, component, args, platform=NO_CUDA, models=MODEL_CLASSES)
    )


def floating_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's floating slots (parameters and persistent buffers) that a precision sets,
    by name: float8 ones keep their dtype (PREC-2)."""
    return {
        k: v
        for k, v in module.state_dict().items()
        if v.is_floating_point() and v.element_size() > 1
    }


def skip_unless_built_in(
    module: nn.Module, dtype: torch.dtype, *, fp32: tuple[str, ...] = ()
) -> None:
    """Skip a test whose rule presumes the precision asked for: slots outside the `fp32`
    modules not in `dtype` are PREC-1's to judge, not this test's."""
    built = {
        v.dtype for k, v in floating_state(module).items() if not set(k.split(".")) & set(fp32)
    }
    if built != {dtype}:
        pytest.skip(f"the loader built {sorted(map(str, built))}, not {dtype}: PREC-1 judges that")


def assert_values_are_the_file_in(
    module: nn.Module, file: Mapping[str, torch.Tensor], dtype_of: Callable[[str], torch.dtype]
) -> None:
    """Each floating slot has the dtype `dtype_of` names and the file's tensor converted to it,
    bit for bit; the failure names the slot and what differed."""
    wrong_dtype = {
        k: (str(v.dtype), str(dtype_of(k)))
        for k, v in floating_state(module).items()
        if v.dtype != dtype_of(k)
    }
    assert wrong_dtype == {}, f"slots not in their precision (got, wanted): {wrong_dtype}"
    differ = [
        k for k, v in floating_state(module).items() if not torch.equal(v, file[k].to(v.dtype))
    ]
    assert differ == [], f"values differ from the file's tensor converted once: {differ}"


# --- PREC-1: each component in its precision -----------------------------------------------------


@pytest.mark.rule("PREC-1")
@pytest.mark.capability(PIPELINES)
@pytest.mark.parametrize(
    ("dit", "vae"),
    [(BF16, FP32), (FP32, BF16), (FP16, FP16)],
    ids=["bf16-dit-fp32-vae", "fp32-dit-bf16-vae", "fp16-both"],
)
def test_each_component_is_built_in_its_precision(
    loader: SeamLoader, tmp_path: Path, dit: torch.dtype, vae: torch.dtype
) -> None:
    root = pipeline(tmp_path, dit_saved=BF16)
    precisions = Precisions(dit=dit, vae=vae)
    for component, dtype in (("transformer", dit), ("transformer_2", dit), ("vae", vae)):
        module = load_component(loader, root, component, precisions)
        assert_values_are_the_file_in(module, saved(root / component), lambda _, d=dtype: d)


@pytest.mark.rule("PREC-1")
@pytest.mark.capability(PIPELINES)
@pytest.mark.parametrize("component", ["transformer", "transformer_2", "vae"])
def test_a_component_override_wins_over_its_kind(
    loader: SeamLoader, tmp_path: Path, component: str
) -> None:
    """The override names one component: the other DiT keeps `--dit-precision`."""
    root = pipeline(tmp_path, dit_saved=BF16)
    precisions = Precisions(dit=BF16, vae=FP32, components={component: FP16})
    for name in ("transformer", "transformer_2", "vae"):
        dtype = FP16 if name == component else FP32 if name == "vae" else BF16
        module = load_component(loader, root, name, precisions)
        assert_values_are_the_file_in(module, saved(root / name), lambda _, d=dtype: d)


@pytest.mark.rule("PREC-1")
@pytest.mark.capability(CLI_ARGS, PIPELINES)
@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        ((), (BF16, BF16, FP32)),
        (("--dit-precision", "fp32", "--vae-precision=bf16"), (FP32, FP32, BF16)),
        (("--component-precisions.transformer_2=fp16",), (BF16, FP16, FP32)),
        (("--component_precisions.vae", "fp16"), (BF16, BF16, FP16)),
    ],
    ids=["defaults", "both-flags", "override", "underscore-prefix"],
)
def test_the_command_line_gives_a_bf16_dit_and_an_fp32_vae_unless_told(
    loader: SeamLoader,
    tmp_path: Path,
    argv: tuple[str, ...],
    wanted: tuple[torch.dtype, torch.dtype, torch.dtype],
) -> None:
    """Upstream's defaults (`--dit-precision bf16`, `--vae-precision fp32`) and its flags;
    `wanted`: the dtypes of transformer, transformer_2 and vae."""
    root = pipeline(tmp_path, dit_saved=FP32)
    args, rest = loader.parse_server_args(["--zz-unrelated-option", *argv])
    assert rest == ["--zz-unrelated-option"]
    for component, dtype in zip(("transformer", "transformer_2", "vae"), wanted, strict=True):
        module = loader.load_pipeline_component(
            ComponentRequest(root, component, args, platform=NO_CUDA, models=MODEL_CLASSES)
        )
        assert_values_are_the_file_in(module, saved(root / component), lambda _, d=dtype: d)


@pytest.mark.rule("PREC-1")
@pytest.mark.capability(ZERO_COPY)
@pytest.mark.parametrize("dtype", [BF16, FP16], ids=NAMES.get)
def test_load_dit_builds_in_the_dtype_it_is_handed(
    loader: SeamLoader, tmp_path: Path, dtype: torch.dtype
) -> None:
    path, state = write_dit_checkpoint(tmp_path)
    module, _ = loader.load_dit(
        DitRequest(DefaultDtypeDiT, path, plan=Plan(CPU), kinds=LINEAR_KINDS, dtype=dtype)
    )
    assert_values_are_the_file_in(module, state, lambda _: dtype)


@pytest.mark.rule("PREC-1")
@pytest.mark.capability(VAE_STREAM)
def test_load_vae_streams_into_the_dtype_it_is_handed(loader: SeamLoader, tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(5)
    state = {
        k: torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
        for k, v in PipelineVAE().state_dict().items()
    }
    path = write_vae_checkpoint(state, tmp_path)
    loaded, _ = loader.load_vae(VaeRequest(PipelineVAE, path, device=CPU, dtype=BF16))
    assert_values_are_the_file_in(loaded, state, lambda _: BF16)


# --- PREC-2: what stays fp32, and what keeps its dtype -------------------------------------------


@pytest.mark.rule("PREC-2")
@pytest.mark.capability(PIPELINES)
@pytest.mark.parametrize("dit_saved", [BF16, None], ids=["saved-bf16", "saved-fp32"])
@pytest.mark.parametrize("component", ["transformer", "transformer_2"])
def test_modules_the_class_keeps_in_fp32_stay_fp32(
    loader: SeamLoader, tmp_path: Path, dit_saved: torch.dtype | None, component: str
) -> None:
    """`_keep_in_fp32_modules` (norm1, time_embed) stay fp32 in a bf16 DiT, as diffusers'
    `from_pretrained(torch_dtype=torch.bfloat16)` keeps them; the integer buffer keeps int64."""
    root = pipeline(tmp_path, dit_saved=dit_saved, dit=PipelineKeptDiT)
    module = load_component(loader, root, component, Precisions(dit=BF16, vae=FP32))
    kept = PipelineKeptDiT._keep_in_fp32_modules
    skip_unless_built_in(module, BF16, fp32=tuple(kept))

    def wanted(key: str) -> torch.dtype:
        return FP32 if any(m in key.split(".") for m in kept) else BF16

    assert_values_are_the_file_in(module, saved(root / component), wanted)
    positions = module.state_dict()["positions"]
    assert positions.dtype == torch.int64, f"the integer buffer became {positions.dtype}"
    assert torch.equal(positions, torch.arange(4))


# --- PREC-3: refusals ----------------------------------------------------------------------------


@pytest.mark.rule("PREC-3")
@pytest.mark.capability(CLI_ARGS)
@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (("--dit-precision", "fp64"), "--dit-precision"),
        (("--dit-precision=",), "--dit-precision"),
        (("--vae-precision", "float32"), "--vae-precision"),
        (("--component-precisions.vae=fp8",), "--component-precisions"),
        (("--component-precisions.vae=",), "--component-precisions"),
        (("--component-precisions.=bf16",), "--component-precisions"),
    ],
    ids=["fp64", "empty", "long-name", "fp8", "empty-override", "empty-component"],
)
def test_an_unknown_precision_or_an_empty_component_is_refused_naming_the_flag(
    loader: SeamLoader, argv: tuple[str, ...], flag: str
) -> None:
    refusal(lambda: loader.parse_server_args(list(argv)), flag)


@pytest.mark.rule("PREC-3")
@pytest.mark.capability(PIPELINES)
def test_an_override_for_an_undeclared_component_is_refused_before_any_read(
    loader: SeamLoader, tmp_path: Path
) -> None:
    """The transformer's weights are cut short: a loader that read them first would fail on
    the file instead of refusing the override."""
    root = pipeline(tmp_path, dit_saved=BF16)
    for shard in (root / "transformer").glob("*.safetensors"):
        shard.write_bytes(shard.read_bytes()[:64])
    precisions = Precisions(dit=BF16, vae=FP32, components={"video_vae": BF16})
    error = refusal(lambda: load_component(loader, root, "transformer", precisions), "video_vae")
    assert "safetensors" not in str(error), f"the weights were read first: {error}"


# --- PREC-4: adopted when the dtype fits, converted once when not --------------------------------


def mapped(module: nn.Module, positions: Mapping[str, tuple[str, int]]) -> set[str]:
    """Parameters whose memory is the file's own bytes for that tensor."""
    return {k for k, p in module.named_parameters() if file_position(p) == positions.get(k)}


@pytest.mark.rule("PREC-4")
@pytest.mark.capability(ZERO_COPY)
@pytest.mark.parametrize("dtype", [BF16, FP16], ids=NAMES.get)
def test_a_checkpoint_in_the_slot_dtype_is_adopted_as_an_fp32_one_is(
    loader: SeamLoader, tmp_path: Path, dtype: torch.dtype
) -> None:
    """Under CPU offload, a bf16 (fp16) checkpoint loaded at that precision maps the file for
    the same parameters an fp32 checkpoint does at fp32: adoption compares with the slot's dtype
    after precision (ZC-8 after PREC-1)."""
    reason = maps_missing()
    if reason is not None:
        pytest.skip(reason)
    adopted: dict[torch.dtype, set[str]] = {}
    for saved_dtype in (FP32, dtype):
        path, _ = write_dit_checkpoint(tmp_path / NAMES[saved_dtype], dtype=saved_dtype)
        module, _ = loader.load_dit(
            DitRequest(DefaultDtypeDiT, path, plan=Plan(CPU), kinds=LINEAR_KINDS, dtype=saved_dtype)
        )
        built = {v.dtype for v in floating_state(module).values()}
        if built != {saved_dtype}:
            pytest.skip(f"the loader built {built}, not {saved_dtype}: PREC-1 judges that")
        adopted[saved_dtype] = mapped(module, tensor_positions(path))
    assert adopted[FP32], "the fp32 checkpoint adopted nothing: ZC-1 and ZC-2b judge that"
    missed = sorted(adopted[FP32] - adopted[dtype])
    assert missed == [], f"adopted at fp32 but copied at {NAMES[dtype]}: {missed}"


@pytest.mark.rule("PREC-4")
@pytest.mark.capability(ZERO_COPY)
@pytest.mark.parametrize(
    ("stored", "dtype"),
    [(FP32, BF16), (FP32, FP16), (BF16, FP32), (FP16, BF16), (BF16, FP16)],
    ids=lambda d: NAMES[d],
)
def test_a_checkpoint_in_another_dtype_is_converted_once(
    loader: SeamLoader, tmp_path: Path, stored: torch.dtype, dtype: torch.dtype
) -> None:
    """Values equal `tensor.to(slot dtype)` of the file's tensor (through an intermediate dtype
    they would not: fp32 -> bf16 -> fp16 loses fp16's mantissa bits), in memory of their own."""
    path, _ = write_dit_checkpoint(tmp_path, dtype=stored)
    file = saved(path.parent)
    module, _ = loader.load_dit(
        DitRequest(DefaultDtypeDiT, path, plan=Plan(CPU), kinds=LINEAR_KINDS, dtype=dtype)
    )
    slots = floating_state(module)
    assert_values_are_the_file_in(module, file, lambda k: slots[k].dtype)
    converted = {k for k, v in slots.items() if v.dtype != file[k].dtype}
    if maps_missing() is None:
        both = sorted(converted & mapped(module, tensor_positions(path)))
        assert both == [], f"converted, yet still the file's bytes: {both}"


@pytest.mark.rule("PREC-4")
@pytest.mark.capability(PIPELINES)
def test_a_bf16_pipeline_dit_under_offload_adopts_its_file(
    loader: SeamLoader, tmp_path: Path
) -> None:
    """The headline on the pipeline path: a transformer stored in bf16, loaded as a bf16 DiT
    under CPU offload, maps its file for what an fp32 one at fp32 maps."""
    reason = maps_missing()
    if reason is not None:
        pytest.skip(reason)
    adopted = {}
    for stored in (None, BF16):
        root = pipeline(tmp_path / str(stored), dit_saved=stored)
        dtype = BF16 if stored is BF16 else FP32
        module = load_component(
            loader, root, "transformer", Precisions(dit=dtype, vae=FP32), offload=True
        )
        skip_unless_built_in(module, dtype)
        adopted[dtype] = mapped(module, tensor_positions(root / "transformer"))
    assert adopted[FP32], "the fp32 transformer adopted nothing: ZC-1 and ZC-2b judge that"
    missed = sorted(adopted[FP32] - adopted[BF16])
    assert missed == [], f"adopted at fp32 but copied at bf16: {missed}"


# --- PREC-5: per tensor, on the target device ----------------------------------------------------

BIG = DiTConfig(hidden=512, heads=8, depth=3)
HOST_SLACK = 2 * 1024**2


@pytest.mark.rule("PREC-5")
@pytest.mark.capability(DIRECT_DIT)
def test_a_direct_load_converts_one_tensor_at_a_time(
    loader: SeamLoader,
    runtime_device: torch.device,
    isolated_with: Callable[..., Attempt],
    tmp_path: Path,
) -> None:
    """A direct load of an fp32 checkpoint as a bf16 DiT onto the CPU, in a fresh process
    warmed by the same load of a small DiT (SPEC, "Memory is the load's own"):
    host memory grows by the bf16 model plus at most one fp32 tensor in flight (a loader that
    converts the whole state first holds all of it beside the model). The GPU tier's peak
    device memory judges CUDA."""
    if runtime_device.type != "cpu":
        pytest.skip("onto CUDA, the GPU tier's peak device memory judges this")
    reason = evidence_missing()
    if reason is not None:
        pytest.skip(reason)
    path, state = write_dit_checkpoint(tmp_path, config=BIG)
    largest = max(t.nbytes for t in state.values())
    del state
    small, _ = write_dit_checkpoint(tmp_path / "warm")
    result = isolated_with(
        direct_load_host_growth,
        path,
        BIG,
        runtime_device,
        dtype=BF16,
        deadline=60,
        warm=(direct_load_host_growth, (small, DiTConfig(), runtime_device), {"dtype": BF16}),
    )
    assert result.outcome == "returned", f"the direct load {result.outcome}: {result.message}"
    growth, devices, model = result.value  # the model as loaded (its dtype is PREC-1's)
    assert set(devices) == {"cpu"}
    bound = model + largest + HOST_SLACK
    assert growth < bound, (
        f"host memory grew {growth} bytes for a {model}-byte model (bound: the model plus one"
        f" fp32 tensor, {bound}): tensors were converted beside each other, not one by one"
    )


# --- PREC-6: the report says so ------------------------------------------------------------------


@pytest.mark.rule("PREC-6")
@pytest.mark.capability(ZERO_COPY)
@pytest.mark.parametrize("stored", [FP32, BF16], ids=NAMES.get)
def test_the_report_states_the_precision_and_each_conversion(
    loader: SeamLoader, tmp_path: Path, stored: torch.dtype
) -> None:
    path, state = write_dit_checkpoint(tmp_path, dtype=stored)
    module, report = loader.load_dit(
        DitRequest(DefaultDtypeDiT, path, plan=Plan(CPU), kinds=LINEAR_KINDS, dtype=BF16)
    )
    skip_unless_built_in(module, BF16)
    assert report.precision == BF16, f"the report states precision {report.precision}"
    converted = [k for k, v in state.items() if v.is_floating_point() and v.dtype != BF16]
    expected = {}
    if converted:
        nbytes = sum(module.state_dict()[k].nbytes for k in converted)
        expected = {(stored, BF16): (len(converted), nbytes)}
    found = {pair: tuple(tally) for pair, tally in report.conversions.items()}
    assert found == expected, f"conversions reported {found}, made {expected}"
