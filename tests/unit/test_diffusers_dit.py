"""Real diffusers pipelines (Wan, Flux, SD3, PixArt-Sigma, Sana, LTX-Video, HunyuanDiT), tiny,
written end to end by each pipeline class's own `save_pretrained`
(fakes/diffusers_pipelines.py).

Contract tests load the `transformer` component through the loader under test and judge the
outcome any loader leaves: where each parameter's bytes live (a mapping of the checkpoint file at
that tensor's offset, or not), its values, `requires_grad`, and the model's outputs against
diffusers' own `from_pretrained`. The reference's own command line, class resolution and wording
are judged for the reference alone. Offline: nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from types import ModuleType

import pytest
import torch
from filelock import FileLock
from torch import nn

from fakes.diffusers_pipelines import (
    HUB_PIPELINES,
    WAN22_PIPELINE,
    WAN_DIT,
    WAN_PIPELINE,
    HubPipeline,
    write_hub_pipeline,
)
from fakes.platform import FakePlatform
from reference.extras import install_hint
from reference.kit.judging.evidence import (
    DataReads,
    data_bytes,
    evidence_missing,
    safetensors_files,
)
from reference.kit.judging.file_maps import file_position, maps_missing, tensor_positions
from reference.kit.judging.judge import refusal, tensor_named
from reference.kit.seam import PIPELINES, ComponentRequest, Precisions, SeamLoader, ServingOptions
from reference.request.quantization import QuantizationSpec

from .command import ROOT, Result, run_reference, run_reference_fresh
from .written import copy_of_written

EXTRA = f"needs the diffusers extra: {install_hint('diffusers')}"
OWN_CLI = "drives the reference's own command line, class resolution and wording"
NO_CUDA = FakePlatform(cuda=False)
FP8 = QuantizationSpec("fp8")
PIPELINES_BY_NAME = dict(HUB_PIPELINES)
LAYOUTS = {"single": False, "sharded": True}
WITH_BUFFERS = {"sd3"}
EVIDENCE = ("wan", "flux")
"""Pipelines whose DiT holds megabytes, enough for read and memory evidence to dwarf noise."""
"""Pipelines whose DiT holds a persistent buffer (SD3's positional table): a buffer is copied."""


@pytest.fixture(scope="module")
def diffusers() -> ModuleType:
    module = pytest.importorskip("diffusers", reason=EXTRA)
    # The pipelines' text encoders and tokenizers are transformers' own (the [diffusers] extra).
    transformers = pytest.importorskip("transformers", reason=EXTRA)
    for library in (module, transformers):
        library.utils.logging.set_verbosity_error()
        library.utils.logging.disable_progress_bar()
    return module


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory, diffusers: ModuleType) -> dict[str, Path]:
    """Every pipeline in every layout, written once for the whole run, whatever the number of
    xdist workers (under the folder they share, behind a lock): "wan-single", ..."""
    # Each xdist worker's base folder sits in the run's own: shared by this run's workers only.
    workers = os.environ.get("PYTEST_XDIST_WORKER") is not None
    base = tmp_path_factory.getbasetemp().parent if workers else tmp_path_factory.mktemp("run")
    root = base / "hub"
    with FileLock(f"{root}.lock"):
        if not (root / "written").is_file():
            shutil.rmtree(root, ignore_errors=True)
            for name, pipeline in PIPELINES_BY_NAME.items():
                for layout, sharded in LAYOUTS.items():
                    copy_of_written(
                        ("hub", name, layout),
                        root / f"{name}-{layout}",
                        partial(write_hub_pipeline, pipeline=pipeline, seed=3, sharded=sharded),
                    )
            (root / "written").touch()
    return {
        f"{name}-{layout}": root / f"{name}-{layout}"
        for name in PIPELINES_BY_NAME
        for layout in LAYOUTS
    }


def from_pretrained(
    diffusers: ModuleType, root: Path, pipeline: HubPipeline, *, component: str = "transformer"
) -> nn.Module:
    """diffusers' own load of the pipeline's transformer (or `component`), in the precision the
    loads below ask for (`torch_dtype=DIT_DTYPE`: the class's fp32 modules stay fp32).

    A class that keeps modules in float32 (Wan) loads only through diffusers' low-memory path,
    which needs accelerate: without it there is nothing to compare with, so the test skips.
    """
    cls = getattr(diffusers, pipeline.dit.class_name)
    if cls._keep_in_fp32_modules is not None and importlib.util.find_spec("accelerate") is None:
        pytest.skip(f"diffusers' from_pretrained of {cls.__name__} needs accelerate: {EXTRA}")
    model: nn.Module = cls.from_pretrained(str(root / component), torch_dtype=DIT_DTYPE)
    return model


DIT_DTYPE = torch.bfloat16
"""The hub pipelines' transformers are stored in bf16, as users get them (`write_hub_pipeline`);
every load here asks for that precision, and the command line's default is it (PREC-1)."""
PRECISIONS = Precisions(dit=DIT_DTYPE, vae=torch.float32)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu().reshape(-1).view(torch.uint8)


def assert_same_as_diffusers(
    module: nn.Module, expected: nn.Module, pipeline: HubPipeline, device: torch.device
) -> None:
    """Same state bit for bit, same buffers, same output of one forward pass. The class is the
    loader's choice (SPEC, "State, not identity"): a native implementation of the model passes
    when its state and outputs are diffusers'."""
    got, want = module.state_dict(), expected.state_dict()
    assert set(got) == set(want)
    for key, tensor in want.items():
        assert got[key].dtype == tensor.dtype, key
        assert torch.equal(bits(got[key]), bits(tensor)), key
    # Non-persistent ones too (rotary tables), by name: that a buffer stayed a buffer is ZC-15's.
    for key, buffer in expected.named_buffers():
        assert torch.equal(bits(tensor_named(module, key)), bits(buffer)), key
    out = pipeline.dit.forward(module, device).cpu()
    assert torch.equal(out, pipeline.dit.forward(expected.to(device), device).cpu())


def param_names(module: nn.Module) -> dict[str, torch.Tensor]:
    return dict(module.named_parameters())


# --- ZC-2b: a diffusers DiT under CPU offload takes its checkpoint tensors as they are ------------


def load_offloaded(
    loader: SeamLoader, runtime_device: torch.device, root: Path
) -> tuple[nn.Module, dict[str, torch.Tensor], set[str]]:
    """The transformer loaded under CPU offload; its parameters; those whose bytes are the
    checkpoint file's own (first byte maps the file at the offset of one of its tensors: by
    where it lies, not by name, since a loader's own class may name its parameters its own
    way)."""
    reason = maps_missing()
    if reason is not None:
        pytest.skip(reason)
    positions = tensor_positions(root / "transformer")
    args = loader.make_server_args(
        ServingOptions(runtime_device=runtime_device, dit_cpu_offload=True, precisions=PRECISIONS)
    )
    module = loader.load_pipeline_component(
        ComponentRequest(root, "transformer", args, platform=NO_CUDA)
    )
    params = param_names(module)
    assert params, "the transformer has parameters"
    starts = set(positions.values())
    in_place = {key for key, p in params.items() if file_position(p) in starts}
    return module, params, in_place


@pytest.mark.capability(PIPELINES)
@pytest.mark.rule("ZC-2b")
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", list(PIPELINES_BY_NAME))
def test_offloaded_diffusers_dit_adopts_its_checkpoint_in_place(
    loader: SeamLoader,
    runtime_device: torch.device,
    hub: dict[str, Path],
    diffusers: ModuleType,
    *,
    name: str,
    layout: str,
) -> None:
    """ZC-2b: every parameter of a plain-torch DiT is a plain `nn.Parameter` with no
    `weight_loader` whose checkpoint tensor already fits (float32, contiguous): under CPU offload
    each one *is* the file's bytes (its first byte maps the checkpoint file at that tensor's
    offset), and the model equals from_pretrained's, state and outputs."""
    root, pipeline = hub[f"{name}-{layout}"], PIPELINES_BY_NAME[name]
    module, params, in_place = load_offloaded(loader, runtime_device, root)
    total = sum(p.nbytes for p in params.values())
    adopted = sum(params[key].nbytes for key in in_place)
    assert adopted >= 0.99 * total, sorted(set(params) - in_place)
    assert set(in_place) == set(params)  # every parameter fits: none may be copied
    assert all(type(p) is nn.Parameter for p in params.values())
    expected = from_pretrained(diffusers, root, pipeline)
    assert_same_as_diffusers(module, expected, pipeline, torch.device("cpu"))


@pytest.mark.capability(PIPELINES)
@pytest.mark.rule("ZC-9")
@pytest.mark.parametrize("name", list(PIPELINES_BY_NAME))
def test_adopted_diffusers_parameters_do_not_require_grad(
    loader: SeamLoader, runtime_device: torch.device, hub: dict[str, Path], name: str
) -> None:
    """ZC-9: a parameter adopted from the file (construction made it requires_grad=True) comes
    back with requires_grad False, holding the checkpoint's values."""
    root = hub[f"{name}-single"]
    _, params, in_place = load_offloaded(loader, runtime_device, root)
    assert in_place, "some parameter was adopted"
    assert not any(params[key].requires_grad for key in in_place)


@pytest.mark.capability(PIPELINES)
@pytest.mark.rule("ZC-13")
def test_writing_an_adopted_diffusers_parameter_leaves_the_file_unchanged(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    diffusers: ModuleType,
) -> None:
    """ZC-13: the adopted bytes are a private (copy-on-write) map: writing to every parameter
    changes none of the checkpoint's files."""
    root = write_hub_pipeline(tmp_path / "wan", WAN_PIPELINE, seed=5, sharded=True)
    before = {path: path.read_bytes() for path in safetensors_files(root / "transformer")}
    _, params, in_place = load_offloaded(loader, runtime_device, root)
    assert in_place, "some parameter was adopted"
    with torch.no_grad():
        for key in in_place:
            params[key].add_(1.0)
    assert {path: path.read_bytes() for path in before} == before


@pytest.mark.capability(PIPELINES)
@pytest.mark.rule("ZC-2b")
@pytest.mark.parametrize("name", EVIDENCE)
def test_offloaded_diffusers_dit_load_allocates_no_copy_of_its_weights(
    loader: SeamLoader,
    runtime_device: torch.device,
    hub: dict[str, Path],
    diffusers: ModuleType,
    name: str,
) -> None:
    """ZC-2b judged by memory: loading the offloaded DiT neither reads its tensor data into
    anonymous memory nor touches it (peak growth far below the checkpoint's bytes)."""
    reason = evidence_missing()
    if reason is not None:
        pytest.skip(reason)
    root = hub[f"{name}-sharded"]
    files = safetensors_files(root / "transformer")
    args = loader.make_server_args(
        ServingOptions(runtime_device=runtime_device, dit_cpu_offload=True, precisions=PRECISIONS)
    )
    loader.load_pipeline_component(
        ComponentRequest(root, "transformer", args, platform=NO_CUDA)
    )  # warm: imports
    with DataReads() as reads:
        module = loader.load_pipeline_component(
            ComponentRequest(root, "transformer", args, platform=NO_CUDA)
        )
    reads.assert_no_data_read(data_bytes(*files), what="the transformer's weights")
    assert all(p.device.type == "cpu" for p in module.parameters())


@pytest.mark.capability(PIPELINES)
@pytest.mark.rule("ZC-1")
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", list(PIPELINES_BY_NAME))
def test_resident_diffusers_dit_is_bit_identical_to_from_pretrained(
    loader: SeamLoader,
    runtime_device: torch.device,
    hub: dict[str, Path],
    diffusers: ModuleType,
    *,
    name: str,
    layout: str,
) -> None:
    """Resident on the runtime device: on a CUDA device every tensor is copied there (ZC-1: the
    checkpoint tensor is not on CPU); on CPU the rules adopt as under offload. Either way the
    state, the non-persistent rotary buffers and one forward pass equal from_pretrained's."""
    root, pipeline = hub[f"{name}-{layout}"], PIPELINES_BY_NAME[name]
    args = loader.make_server_args(
        ServingOptions(runtime_device=runtime_device, precisions=PRECISIONS)
    )
    module = loader.load_pipeline_component(
        ComponentRequest(root, "transformer", args, platform=NO_CUDA)
    )
    assert all(t.device.type == runtime_device.type for t in module.state_dict().values())
    assert all(b.device.type == runtime_device.type for b in module.buffers())
    if runtime_device.type != "cpu":
        assert all(file_position(p) is None for p in module.parameters())
    expected = from_pretrained(diffusers, root, pipeline)
    assert_same_as_diffusers(module, expected, pipeline, runtime_device)


@pytest.mark.capability(PIPELINES)
@pytest.mark.rule("ZC-2b")
def test_a_second_diffusers_transformer_is_adopted_too(
    loader: SeamLoader, runtime_device: torch.device, tmp_path: Path, diffusers: ModuleType
) -> None:
    """`transformer_2` (Wan 2.2's second expert, as `WanPipeline.save_pretrained` writes it) is
    a DiT component like `transformer`: under `--dit-cpu-offload` its plain parameters are the
    file's bytes as well, holding its own values (not the first expert's)."""
    root = write_hub_pipeline(tmp_path / "wan22", WAN22_PIPELINE, seed=6)
    positions = tensor_positions(root / "transformer_2")
    args = loader.make_server_args(
        ServingOptions(runtime_device=runtime_device, dit_cpu_offload=True, precisions=PRECISIONS)
    )
    reason = maps_missing()
    if reason is not None:
        pytest.skip(reason)
    module = loader.load_pipeline_component(
        ComponentRequest(root, "transformer_2", args, platform=NO_CUDA)
    )
    params = param_names(module)
    starts = set(positions.values())  # transformer_2's own files, by where each tensor lies
    assert all(file_position(p) in starts for p in params.values())
    expected = from_pretrained(diffusers, root, WAN22_PIPELINE, component="transformer_2")
    assert_same_as_diffusers(module, expected, WAN22_PIPELINE, torch.device("cpu"))


# --- FP8-5: a quantization a diffusers DiT cannot take is refused, never dropped ------------------


@pytest.mark.capability(PIPELINES)
@pytest.mark.rule("FP8-5")
@pytest.mark.parametrize("where", ["flag", "config"])
def test_quantization_of_a_plain_diffusers_dit_is_refused_before_any_read(
    loader: SeamLoader,
    runtime_device: torch.device,
    tmp_path: Path,
    diffusers: ModuleType,
    where: str,
) -> None:
    """A diffusers DiT has plain `nn.Linear` layers: the loader has no online FP8 for them.
    Asked for fp8 (by flag, or by the checkpoint's own config), it refuses naming the component
    and the method, before reading any tensor data; it never hands back an unquantized model."""
    reason = evidence_missing()
    if reason is not None:
        pytest.skip(reason)
    root = write_hub_pipeline(tmp_path / "wan", WAN_PIPELINE, seed=3)
    if where == "config":
        config_path = root / "transformer" / "config.json"
        config = json.loads(config_path.read_text())
        config["quantization_config"] = {"quant_method": "fp8"}
        config_path.write_text(json.dumps(config))
    quantization = FP8 if where == "flag" else None
    args = loader.make_server_args(
        ServingOptions(
            runtime_device=runtime_device, dit_cpu_offload=True, quantization=quantization
        )
    )
    files = safetensors_files(root / "transformer")
    with DataReads() as reads:
        refusal(
            lambda: loader.load_pipeline_component(
                ComponentRequest(root, "transformer", args, platform=NO_CUDA)
            ),
            "transformer",
            "fp8",
        )
    reads.assert_no_data_read(data_bytes(*files))


# --- the reference's command line on Hub-layout pipelines -----------------------------------------


def run_load(*argv: str) -> Result:
    """`python -m reference load ...` in this interpreter, CUDA hidden."""
    return run_reference("load", *argv, hide_cuda=True)


def run_load_fresh(*argv: str, pythonpath: str = "") -> subprocess.CompletedProcess[str]:
    """`python -m reference load ...` in a fresh interpreter, offline, CUDA hidden."""
    return run_reference_fresh("load", *argv, pythonpath=pythonpath)


def sections(stdout: str) -> dict[str, dict[str, str]]:
    """The load output's blocks (separated by blank lines) by heading; the table's heading is
    "table". Each block maps its first word per line to the rest of the line."""
    from reference.programs.cli import HEADER

    blocks = [block.splitlines() for block in stdout.strip().split("\n\n")]
    assert blocks[0][0] == HEADER, stdout
    found = {"table": blocks[0][1:]} | {block[0]: block[1:] for block in blocks[1:]}
    return {
        heading: dict(line.split(maxsplit=1) for line in lines) for heading, lines in found.items()
    }


def table(stdout: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(the load table's rows by component, the `not loaded:` section: component -> why)."""
    found = sections(stdout)
    rows = {name: rest.split() for name, rest in found["table"].items()}
    return rows, found.get("not loaded:", {})


def assert_one_error_line(done: Result | subprocess.CompletedProcess[str], *words: str) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


SETTINGS = {
    "wan": {"boundary_ratio": "null", "expand_timesteps": "false"},
    "hunyuan": {"requires_safety_checker": "false"},
}
"""The settings diffusers 0.42 writes into model_index.json for these pipelines."""


CLI_PIPELINES = [
    pytest.param(name, marks=() if name in ("wan", "flux") else pytest.mark.long)
    for name in PIPELINES_BY_NAME
]
"""The command line on every hub pipeline; Wan and Flux in the unit tier, the others in
`tox -e selftest` (the library path judges every pipeline in the unit tier)."""


FRESH = ("wan", "sharded")
"""The one hub pipeline the command loads in a fresh interpreter, as a user runs it: the slowest
case of the unit tier's CLI tests, so `tox -e selftest` runs it."""


@pytest.mark.capability(PIPELINES)
@pytest.mark.internal
@pytest.mark.reference_only(OWN_CLI)
@pytest.mark.parametrize(
    ("name", "layout"),
    [
        pytest.param(
            *case.values,
            layout,
            marks=(
                *case.marks,
                *((pytest.mark.long,) if (case.values[0], layout) == FRESH else ()),
            ),
            id=f"{case.values[0]}-{layout}",
        )
        for case in CLI_PIPELINES
        for layout in LAYOUTS
    ],
)
def test_load_command_loads_a_hub_pipeline_and_adopts_the_offloaded_transformer(
    hub: dict[str, Path], name: str, layout: str
) -> None:
    """As a user runs it (`python -m reference load DIR --dit-cpu-offload`), on every pipeline
    as diffusers saved it: exit 0; the transformer's bytes adopted (all of them where it holds
    no persistent buffer); the weightless and foreign components listed with why; the
    pipeline's own settings listed, not refused. Wan runs in a fresh interpreter."""
    root = hub[f"{name}-{layout}"]
    argv = (str(root), "--dit-cpu-offload", "--measure")
    done = run_load_fresh(*argv) if (name, layout) == FRESH else run_load(*argv)
    assert done.returncode == 0, done.stderr
    found = sections(done.stdout)
    rows, skipped = table(done.stdout)
    others = PIPELINES_BY_NAME[name].others
    encoders = {c for c in others if c.startswith("text_encoder")}
    assert set(rows) == {"transformer", "vae", *encoders}  # TE-1: every weight loaded
    dtype, load, post, defer, direct, adopted, copied = rows["transformer"][:7]
    assert (dtype, load, post, defer, direct) == ("bf16", "cpu", "-", "no", "no")
    share = 0.9 if name in WITH_BUFFERS else 0.99
    assert float(adopted) >= share * (float(adopted) + float(copied)) > 0
    # Peak anon MiB: a copy of the weights would take at least their bytes again.
    assert float(rows["transformer"][-1]) < float(adopted)
    assert set(skipped) == set(others) - encoders  # listed, not refused
    assert all("no weights" in why for why in skipped.values())
    settings = found.get("pipeline settings (model_index.json):", {})
    assert settings == SETTINGS.get(name, {})


@pytest.mark.capability(PIPELINES)
@pytest.mark.internal
@pytest.mark.reference_only(OWN_CLI)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", CLI_PIPELINES)
def test_load_command_gives_the_module_from_pretrained_gives(
    hub: dict[str, Path], diffusers: ModuleType, name: str, layout: str
) -> None:
    """The command's own load, in process: the transformer and the VAE equal diffusers' loads,
    in eval mode; requires_grad as from_pretrained gives it, except adopted parameters, which
    ZC-9 turns off."""
    from reference.programs.cli import load_with_table
    from reference.request.args import parse_args

    root, pipeline = hub[f"{name}-{layout}"], PIPELINES_BY_NAME[name]
    for flags in ([], ["--dit-cpu-offload"]):
        args, rest = parse_args(["--device", "cpu", *flags])
        assert rest == []
        rows = {row.loaded.name: row.loaded for row in load_with_table(root, args)}
        dit, vae = rows["transformer"], rows["vae"]
        assert not dit.module.training
        assert not vae.module.training
        adopted = {r.name for r in dit.report.records if r.how == "adopted"}
        for key, param in dit.module.named_parameters():
            assert param.requires_grad == (key not in adopted), key
        assert all(p.requires_grad for p in vae.module.parameters())
        assert_same_as_diffusers(
            dit.module, from_pretrained(diffusers, root, pipeline), pipeline, torch.device("cpu")
        )
        expected_vae = getattr(diffusers, pipeline.vae.class_name).from_pretrained(
            str(root / "vae")
        )
        got, want = vae.module.state_dict(), expected_vae.state_dict()
        assert set(got) == set(want)
        assert all(torch.equal(bits(got[k]), bits(want[k])) for k in want)
        latents = pipeline.vae.sample_latents(torch.device("cpu"))
        with torch.no_grad():
            decoded = vae.module.decode(latents).sample  # type: ignore[operator]
            assert torch.equal(decoded, expected_vae.decode(latents).sample)
        assert not expected_vae.training
        assert all(p.requires_grad for p in expected_vae.parameters())


@pytest.mark.capability(PIPELINES)
@pytest.mark.internal
@pytest.mark.reference_only(OWN_CLI)
def test_load_command_refuses_fp8_for_a_diffusers_dit_naming_what_is_missing(
    hub: dict[str, Path],
) -> None:
    done = run_load(
        str(hub["wan-single"]), "--quantization", "fp8", "--dit-cpu-offload", "--device", "cpu"
    )
    line = assert_one_error_line(
        done, "'transformer'", "--quantization fp8", "diffusers.WanTransformer3DModel"
    )
    assert "quant method" in line
    assert "Drop --quantization" in line


@pytest.mark.capability(PIPELINES)
@pytest.mark.internal
@pytest.mark.reference_only(OWN_CLI)
def test_unregistered_class_error_offers_diffusers_and_models_never_fakes(
    tmp_path: Path,
) -> None:
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text("{}")
    index = {"_class_name": "P", "transformer": ["mylib", "MyDiT"]}
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    line = assert_one_error_line(
        run_load(str(tmp_path), "--device", "cpu"), "'MyDiT'", "--models", "diffusers"
    )
    for fake in ("FakeBlock", "FakeVocoder", "PipelineDiT", "PipelineVAE"):
        assert fake not in line


@pytest.mark.capability(PIPELINES)
@pytest.mark.internal
@pytest.mark.reference_only(OWN_CLI)
def test_unexpected_failures_are_one_error_line_without_a_traceback(
    tmp_path: Path, hub: dict[str, Path]
) -> None:
    """The model's own exception in a fresh interpreter, as a user meets it: exit 2, one line,
    no traceback on stderr; the other failures in this interpreter."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "boom_models.py").write_text(
        "from torch import nn\n"
        "\n\n"
        "class BoomDiT(nn.Module):\n"
        "    def __init__(self, **config):\n"
        "        super().__init__()\n"
        "        raise ZeroDivisionError('boom in __init__')\n\n\n"
        'MODEL_CLASSES = {"BoomDiT": BoomDiT}\n'
    )
    root = tmp_path / "pipeline"
    (root / "transformer").mkdir(parents=True)
    (root / "transformer" / "config.json").write_text("{}")
    index = {"_class_name": "P", "transformer": ["mylib", "BoomDiT"]}
    (root / "model_index.json").write_text(json.dumps(index))
    source = hub["wan-single"] / "transformer" / "diffusion_pytorch_model.safetensors"
    (root / "transformer" / source.name).write_bytes(source.read_bytes())
    assert_one_error_line(
        run_load_fresh(
            str(root), "--models", "boom_models", "--device", "cpu", pythonpath=str(models)
        ),
        "ZeroDivisionError",
        "boom in __init__",
    )
    assert_one_error_line(
        run_load(str(root), "--models", "no_such_models_module", "--device", "cpu"),
        "--models no_such_models_module",
    )
    assert_one_error_line(run_load("--device", "cpu"), "pipeline")  # usage errors too
    bad = hub["wan-single"].parent / "bad-config"
    write_hub_pipeline(bad, WAN_PIPELINE)
    config_path = bad / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    config["num_attention_heads"] = "four"
    config_path.write_text(json.dumps(config))
    assert_one_error_line(run_load(str(bad), "--device", "cpu"), "WanTransformer3DModel")


@pytest.mark.capability(PIPELINES)
@pytest.mark.internal
@pytest.mark.reference_only(OWN_CLI)
def test_load_help_lists_every_loading_flag() -> None:
    from reference.request import args as flags

    done = run_load("--help")
    assert done.returncode == 0, done.stderr
    for flag in (
        flags.DEVICE_FLAG,
        flags.DIT_OFFLOAD_FLAG,
        flags.LAYERWISE_FLAG,
        flags.COMPONENT_OFFLOAD_FLAG,
        flags.DIRECT_FLAG,
        flags.COMPONENT_DIRECT_FLAG,
        flags.FSDP_FLAG,
        flags.TP_FLAG,
        flags.QUANTIZATION_FLAG,
        "--quantization-serialized",
        "--models",
    ):
        assert flag in done.stdout, flag
    assert "diffusers" in done.stdout


# --- class resolution: only diffusers' own transformer classes ------------------------------------


@pytest.mark.capability(PIPELINES)
@pytest.mark.internal
@pytest.mark.reference_only(OWN_CLI)
@pytest.mark.parametrize("class_name", ["AutoencoderKL", "UNet2DConditionModel", "os", "a.b.C"])
def test_only_diffusers_transformer_classes_resolve(
    tmp_path: Path, diffusers: ModuleType, class_name: str
) -> None:
    from reference.errors import CheckpointError
    from reference.place.diffusers_models import DIT_PACKAGE, resolve_dit_class
    from reference.request.model_index import read_pipeline

    index = {"_class_name": "P", "transformer": ["diffusers", class_name]}
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    spec = read_pipeline(tmp_path).component("transformer")
    with pytest.raises(CheckpointError, match=f"is not a transformer class of {DIT_PACKAGE}") as e:
        resolve_dit_class(spec)
    assert "WanTransformer3DModel" in str(e.value)
    assert "FluxTransformer2DModel" in str(e.value)
    index["transformer"] = ["diffusers", WAN_DIT.class_name]
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    assert resolve_dit_class(read_pipeline(tmp_path).component("transformer")) is getattr(
        diffusers, WAN_DIT.class_name
    )


@pytest.mark.capability(PIPELINES)
@pytest.mark.internal
def test_without_diffusers_a_diffusers_dit_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reference.errors import CheckpointError
    from reference.load.loaders import TransformerLoader
    from reference.request.args import ServerArgs
    from reference.request.model_index import read_pipeline

    monkeypatch.setitem(sys.modules, "diffusers", None)  # the platform fact: not installed
    index = {"_class_name": "P", "transformer": ["diffusers", WAN_DIT.class_name]}
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    spec = read_pipeline(tmp_path).component("transformer")
    with pytest.raises(CheckpointError, match=r"\[transformer\]: names the diffusers") as e:
        TransformerLoader(platform=NO_CUDA).load(
            spec, ServerArgs(runtime_device=torch.device("cpu"))
        )
    assert str(e.value).endswith(install_hint("diffusers"))


@pytest.mark.capability(PIPELINES)
@pytest.mark.internal
def test_reference_imports_without_diffusers() -> None:
    """`reference` and the pipeline writer import with diffusers blocked (lazy imports)."""
    code = (
        "import sys; sys.modules['diffusers'] = None\n"
        "import reference, reference.programs.cli, reference.load.loaders\n"
        "import fakes.diffusers_pipelines\n"
        "print('ok')"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr
