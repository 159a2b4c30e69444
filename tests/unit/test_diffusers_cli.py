"""diffusers VAEs through the reference's command line, its class resolution, and the error a user
gets without the diffusers extra. The command runs in this interpreter (command.py), on local
folders only: nothing is downloaded."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from pytest_mock import MockerFixture

from fakes.diffusers_vaes import IMAGE_KL, VIDEO_WAN, write_diffusers_pipeline
from fakes.platform import FakePlatform
from reference.errors import CheckpointError
from reference.extras import install_hint
from reference.load.loaders import VAELoader
from reference.place.diffusers_models import VAE_PACKAGE, resolve_vae_class
from reference.programs.cli import HEADER, load_command, load_with_table
from reference.request.args import parse_args
from reference.request.model_index import read_pipeline

from .command import Result, run_reference

EXTRA = f"needs the diffusers extra: {install_hint('diffusers')}"
SEL = "--component-direct-gpu-weight-loading.vae"
# The command line and diffusers resolution are the reference's own: they judge nothing else.
OWN_CLI = "drives the reference's own command line and diffusers resolution"


@pytest.fixture(scope="module")
def diffusers() -> ModuleType:
    module = pytest.importorskip("diffusers", reason=EXTRA)
    module.utils.logging.set_verbosity_error()
    module.utils.logging.disable_progress_bar()
    # The VAE package's own first import pulls in much of diffusers; tests that watch what a
    # resolution imports must not see it, whichever test happens to run first.
    importlib.import_module(VAE_PACKAGE)
    importlib.import_module("diffusers.models.modeling_utils")
    return module


def run_load(*argv: str) -> Result:
    """`python -m reference load ...`, run in this interpreter."""
    return run_reference("load", *argv)


def table_rows(stdout: str) -> dict[str, list[str]]:
    """The load table's rows by component (the table ends at the first blank line)."""
    lines = stdout.splitlines()
    assert HEADER in lines, stdout
    body = lines[lines.index(HEADER) + 1 :]
    end = body.index("") if "" in body else len(body)
    return {line.split()[0]: line.split() for line in body[:end]}


def not_loaded_rows(stdout: str) -> dict[str, str]:
    """The `not loaded:` section: component -> why."""
    lines = stdout.splitlines()
    if "not loaded:" not in lines:
        return {}
    rows = lines[lines.index("not loaded:") + 1 :]
    return {line.split()[0]: line.split(maxsplit=1)[1] for line in rows if line.strip()}


def table_row(stdout: str, component: str) -> list[str]:
    rows = table_rows(stdout)
    assert list(rows) == [component], stdout
    # The scheduler has no loader: listed as not loaded, with why, not refused.
    assert "scheduler" in not_loaded_rows(stdout), stdout
    return rows[component]


def assert_same_state(module: Any, expected: Any) -> None:
    got, want = module.state_dict(), expected.state_dict()
    assert set(got) == set(want)
    assert all(torch.equal(got[k].cpu(), want[k].cpu()) for k in want)


@pytest.mark.rule("ADM-6")
@pytest.mark.reference_only(OWN_CLI)
def test_load_command_loads_a_diffusers_vae(
    runtime_device: torch.device, tmp_path: Path, diffusers: ModuleType
) -> None:
    root = write_diffusers_pipeline(tmp_path, IMAGE_KL, sharded=True)
    done = run_load(str(root), "--device", str(runtime_device))
    assert done.returncode == 0, done.stderr
    row = table_row(done.stdout, "vae")
    assert row[1] == "fp32"  # the VAE's precision by default (PREC-1)
    assert row[2] == str(runtime_device)  # load device
    assert row[5] == "no"  # direct
    # The command's own load, in process: the same module diffusers' from_pretrained gives.
    args, rest = parse_args(["--device", str(runtime_device)])
    assert rest == []
    (loaded,) = load_with_table(root, args)
    expected = diffusers.AutoencoderKL.from_pretrained(str(root / "vae"), low_cpu_mem_usage=False)
    assert type(loaded.loaded.module) is diffusers.AutoencoderKL
    assert_same_state(loaded.loaded.module, expected)
    assert {r.how for r in loaded.loaded.report.records} == {"copied"}


@pytest.mark.rule("ADM-2")
@pytest.mark.reference_only(OWN_CLI)
def test_load_command_refuses_the_direct_flag_without_a_cuda_runtime_device(
    runtime_device: torch.device, tmp_path: Path, diffusers: ModuleType
) -> None:
    if runtime_device.type == "cuda":
        pytest.skip("the CUDA tier runs the direct flag for real (next test)")
    root = write_diffusers_pipeline(tmp_path, IMAGE_KL)
    done = run_load(str(root), SEL, "--device", "cpu")
    assert done.returncode == 2
    assert done.stdout == ""
    assert f"error: {SEL}: direct-GPU loading of component 'vae' needs" in done.stderr
    assert "drop --component-direct-gpu-weight-loading.vae" in done.stderr


@pytest.mark.rule("VAE-1", "VAE-13")
@pytest.mark.reference_only(OWN_CLI)
def test_load_command_streams_a_diffusers_vae_with_the_direct_flag(
    runtime_device: torch.device, tmp_path: Path, diffusers: ModuleType
) -> None:
    if runtime_device.type != "cuda":
        pytest.skip("the direct flag needs a CUDA runtime device; the CPU tier checks its refusal")
    root = write_diffusers_pipeline(tmp_path, VIDEO_WAN, sharded=True)
    done = run_load(str(root), SEL, "--device", str(runtime_device))
    assert done.returncode == 0, done.stderr
    row = table_row(done.stdout, "vae")
    assert row[1] == str(runtime_device)
    assert row[4] == "yes"


def _pipeline_naming(root: Path, class_name: str, config: dict[str, Any]) -> Path:
    """model_index.json naming diffusers' `class_name` for the vae, and its config.json only:
    these refusals come before any weight file is looked for."""
    (root / "vae").mkdir(parents=True)
    (root / "vae" / "config.json").write_text(json.dumps(config))
    index = {"_class_name": "P", "vae": ["diffusers", class_name]}
    (root / "model_index.json").write_text(json.dumps(index))
    return root


@pytest.mark.internal
def test_without_diffusers_the_error_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "diffusers", None)  # the platform fact: not installed
    root = _pipeline_naming(tmp_path, "AutoencoderKL", {"latent_channels": 4})
    spec = read_pipeline(root).component("vae")
    args, _ = parse_args(["--device", "cpu"])
    with pytest.raises(CheckpointError) as info:
        VAELoader(platform=FakePlatform(cuda=False)).load(spec, args)
    assert str(info.value).startswith(f"{root / 'model_index.json'} [vae]: names the diffusers")
    hint = install_hint("diffusers")
    assert str(info.value).endswith(f"install it: {hint}")
    assert "pip install -e '.[diffusers]'" in hint  # a command that works from a clone today
    assert load_command([str(root), "--device", "cpu"], platform=FakePlatform(cuda=False)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert hint in err


@pytest.mark.internal
@pytest.mark.parametrize(
    "class_name",
    ["UNet2DConditionModel", "StableDiffusionPipeline", "os", "vae", "AutoencoderKL.from_config"],
)
def test_only_diffusers_vae_classes_resolve(
    tmp_path: Path, diffusers: ModuleType, mocker: MockerFixture, class_name: str
) -> None:
    """A UNet, a pipeline, a submodule or a dotted path is not looked up, let alone imported."""
    importer = mocker.spy(__import__("importlib"), "import_module")
    spec = read_pipeline(_pipeline_naming(tmp_path, class_name, {})).component("vae")
    with pytest.raises(CheckpointError, match=rf"is not a VAE class of {VAE_PACKAGE}") as info:
        resolve_vae_class(spec)
    assert "AutoencoderKL," in str(info.value)
    assert "AutoencoderKLWan" in str(info.value)
    assert {call.args[0] for call in importer.call_args_list} <= {
        "diffusers",
        VAE_PACKAGE,
        "diffusers.models.modeling_utils",
    }


@pytest.mark.internal
def test_a_config_the_class_rejects_names_config_json(
    tmp_path: Path, diffusers: ModuleType
) -> None:
    root = _pipeline_naming(tmp_path, "AutoencoderKL", {"down_block_types": ["NoSuchBlock2D"]})
    spec = read_pipeline(root).component("vae")
    build = VAELoader().model_builder(spec)
    with pytest.raises(CheckpointError, match=r"vae/config\.json: does not fit AutoencoderKL"):
        build()
    assert resolve_vae_class(spec) is diffusers.AutoencoderKL
