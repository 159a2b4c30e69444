"""The reference's own command line, driven as a user would run it: in this interpreter
(tests/unit/command.py), and in a fresh one where what a new interpreter holds is the point."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fakes.pipelines import SMALL_PIPELINE, FakeComponent, PipelineDiT, write_pipeline

from .command import Result, run_reference, run_reference_fresh

pytestmark = pytest.mark.internal


def run(*argv: str) -> Result:
    """`python -m reference ARGV` with CUDA hidden (with `--models fakes.pipelines`
    after `load DIR`), run in this interpreter."""
    if argv[:1] == ("load",) and len(argv) > 1:
        argv = (*argv[:2], "--models", "fakes.pipelines", *argv[2:])
    return run_reference(*argv, hide_cuda=True)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A DiT of a few MiB, so the table's MiB columns show what was adopted; saved in bf16,
    # the DiT precision serving runs by default (PREC-1).
    dit = FakeComponent(
        PipelineDiT, {"hidden": 256, "depth": 1}, seed=2, checkpoint_dtype=torch.bfloat16
    )
    components = {**SMALL_PIPELINE, "transformer": dit}
    return write_pipeline(tmp_path_factory.mktemp("pipeline"), components)


def table(stdout: str) -> dict[str, list[str]]:
    """The load table (the output's first block): each component's columns after its name."""
    lines = stdout.strip().split("\n\n")[0].splitlines()
    assert lines[0].split()[:6] == ["component", "dtype", "load", "post", "defer", "direct"]
    return {line.split()[0]: line.split()[1:] for line in lines[1:]}


def test_load_prints_one_row_per_component(pipeline: Path) -> None:
    result = run("load", str(pipeline))
    assert result.returncode == 0, result.stderr
    rows = table(result.stdout)
    assert list(rows) == ["transformer", "vae", "vocoder"]
    assert all(row[1:5] == ["cpu", "-", "no", "no"] for row in rows.values())


def test_cpu_offload_adopts_the_dit_checkpoint(pipeline: Path) -> None:
    result = run("load", str(pipeline), "--dit-cpu-offload")
    assert result.returncode == 0, result.stderr
    row = table(result.stdout)["transformer"]
    assert row[0] == "bf16"
    assert float(row[5]) > 0  # adopted MiB (the merged QKV and pos_embed are copied: ZC-2/3)
    assert "converted" not in result.stdout  # the bf16 checkpoint needs no conversion


def test_online_fp8_defers_offload(pipeline: Path) -> None:
    result = run("load", str(pipeline), "--quantization", "fp8", "--dit-cpu-offload")
    assert result.returncode == 0, result.stderr
    assert table(result.stdout)["transformer"][1:5] == ["cpu", "cpu", "yes", "no"]


@pytest.mark.parametrize(
    ("flags", "dtypes"),
    [
        ((), ("bf16", "fp32", "fp32")),
        (("--dit-precision", "fp32"), ("fp32", "fp32", "fp32")),
        (("--vae-precision=fp16",), ("bf16", "fp16", "fp16")),
        (("--component-precisions.vae=bf16",), ("bf16", "bf16", "fp32")),
        (("--component_precisions.transformer", "fp16"), ("fp16", "fp32", "fp32")),
    ],
    ids=["defaults", "dit-fp32", "vae-fp16", "vae-override", "underscore-prefix"],
)
def test_precision_flags_set_each_component_dtype(
    pipeline: Path, flags: tuple[str, ...], dtypes: tuple[str, str, str]
) -> None:
    """PREC-1 on the command line: a bf16 DiT and an fp32 VAE (and vocoder) by default; each
    flag does what it says, and a conversion is listed, from -> to, under the table."""
    result = run("load", str(pipeline), *flags)
    assert result.returncode == 0, result.stderr
    rows = table(result.stdout)
    assert tuple(rows[name][0] for name in ("transformer", "vae", "vocoder")) == dtypes
    if dtypes[0] != "bf16":  # the DiT's checkpoint is bf16: converted once, and said so
        assert f"transformer    bf16 -> {dtypes[0]}:" in result.stdout


ACCEPTED = "fp32, fp16, bf16"


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (("--dit-precision", "fp64"), ("--dit-precision", ACCEPTED)),
        (("--vae-precision=BF16",), ("--vae-precision", ACCEPTED)),
        (("--component-precisions.vae=fp8",), ("--component-precisions.vae", ACCEPTED)),
        (("--component-precisions.vae",), ("--component-precisions.vae", ACCEPTED)),
        (("--component-precisions.=bf16",), ("--component-precisions", "empty")),
        (("--component-precisions.video_vae=bf16",), ("video_vae", "declares")),
    ],
    ids=["unknown", "case", "fp8", "no-value", "no-component", "undeclared"],
)
def test_bad_precision_flags_exit_2_in_one_line_naming_the_flag(
    pipeline: Path, flags: tuple[str, ...], words: tuple[str, ...]
) -> None:
    """PREC-3 on the command line: exit 2, one line naming the flag (and the accepted values,
    for a value), before anything is loaded."""
    result = run("load", str(pipeline), *flags)
    assert result.returncode == 2, result.stdout
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert [w for w in words if w not in lines[0]] == [], lines[0]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (
            ["--component-direct-gpu-weight-loading.vae"],
            "--component-direct-gpu-weight-loading.vae: direct-GPU loading of component 'vae'"
            " needs CUDA",
        ),
        (["--direct-gpu-weight-loading=maybe"], "--direct-gpu-weight-loading"),
        (["--component-direct-gpu-weight-loading.vae=maybe"], "maybe"),
        (["--component-direct-gpu-weight-loading.=true"], "the component name is empty"),
    ],
    ids=["vae-without-cuda", "bad-dit-value", "bad-component-value", "empty-component"],
)
def test_refusals_are_one_line_and_exit_2(pipeline: Path, flags: list[str], words: str) -> None:
    result = run("load", str(pipeline), *flags)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert words in lines[0]


class FailingPlatform:
    """A platform with a bug: every question raises something that is not a refusal."""

    def cuda_available(self) -> bool:
        raise ZeroDivisionError("a bug in the platform")

    def device_count(self) -> int:
        raise ZeroDivisionError("a bug in the platform")

    def free_device_memory(self, device: object) -> int:
        raise ZeroDivisionError("a bug in the platform")


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_an_internal_error_is_not_a_refusal(
    pipeline: Path, debug: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bug (not a `LoadError`) exits 3 with one line saying it is internal; `--debug` adds
    the traceback before that line. A refusal keeps exit 2 (above)."""
    from reference.programs.cli import load_command

    argv = [str(pipeline), "--models", "fakes.pipelines", "--dit-cpu-offload"]
    code = load_command([*argv, "--debug"] if debug else argv, platform=FailingPlatform())
    err = capsys.readouterr().err
    assert code == 3
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: internal error: ZeroDivisionError: a bug in the platform")
    assert "--debug" in last
    assert ("Traceback (most recent call last)" in err) is debug
    assert len(err.strip().splitlines()) > 1 if debug else len(err.strip().splitlines()) == 1


def test_undeclared_component_is_listed(pipeline: Path) -> None:
    result = run(
        "load",
        str(pipeline),
        "--component-direct-gpu-weight-loading.audio_vae",
        "--component-direct-gpu-weight-loading.video_vae",
    )
    assert result.returncode == 2
    assert "audio_vae" in result.stderr
    assert "video_vae" in result.stderr


def test_missing_pipeline_folder_is_a_clear_error(tmp_path: Path) -> None:
    result = run("load", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert "nowhere" in result.stderr


def test_a_refusal_goes_where_the_caller_says(
    pipeline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo passes stdout, so a refusal stays under its heading however streams are piped."""
    import io

    from fakes.platform import FakePlatform
    from reference.programs.cli import load_command

    here = io.StringIO()
    argv = [
        str(pipeline),
        "--models",
        "fakes.pipelines",
        "--component-direct-gpu-weight-loading.vae",
    ]
    assert load_command(argv, platform=FakePlatform(cuda=False), errors=here) == 2
    assert here.getvalue().startswith("error: --component-direct-gpu-weight-loading.vae")
    assert here.getvalue().count("\n") == 1
    assert capsys.readouterr().err == ""


def test_without_models_a_fake_class_is_not_offered(pipeline: Path) -> None:
    """In a fresh interpreter: the command itself imports no module that registers a class
    (in this one, other tests have imported the fakes)."""
    result = run_reference_fresh("load", str(pipeline))
    assert result.returncode == 2
    assert "--models" in result.stderr
    assert "PipelineDiT" in result.stderr  # the class model_index.json names
    assert "registered: none" in result.stderr  # nothing imported by default


@pytest.mark.long  # the whole demo in a fresh interpreter
def test_demo_keeps_each_refusal_under_its_heading_when_piped() -> None:
    result = run("demo")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "error:" not in result.stderr
    lines = result.stdout.splitlines()
    heading = lines.index("## refused: direct DiT loading of an offloaded DiT")
    assert lines[heading + 1].startswith("$ python -m reference load ")
    assert "--models fakes.pipelines" in lines[heading + 1]
    assert lines[heading + 2].startswith("error: --direct-gpu-weight-loading")
    assert lines[-1].startswith("removed ")  # its temporary folder, saying so
    assert "--keep DIR" in lines[-1]


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("--dit-cpu-ofload", "--dit-cpu-offload"),
        ("--quantisation", "--quantization"),
        ("--component-cpu-ofload.vae", "--component-cpu-offload.vae"),
        ("--direct-gpu-weight-load", "--direct-gpu-weight-loading"),
        ("--model", "--models"),
    ],
)
def test_a_misspelled_flag_names_the_nearest_one(pipeline: Path, typed: str, meant: str) -> None:
    result = run("load", str(pipeline), typed)
    assert result.returncode == 2
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert f"{typed}: did you mean {meant}?" in line


def test_a_path_that_does_not_exist_is_not_called_a_missing_index(tmp_path: Path) -> None:
    result = run("load", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert "nowhere: does not exist" in result.stderr
    assert "model_index.json" in result.stderr  # what a pipeline folder holds, as the fix
    result = run("load", str(tmp_path))
    assert "holds no model_index.json" in result.stderr


def test_demo_says_it_removed_its_folder_or_keeps_it(tmp_path: Path) -> None:
    result = run("demo", "--keep", str(tmp_path / "kept"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "kept" / "pipeline" / "model_index.json").is_file()
    assert f"stay in {tmp_path / 'kept'}" in result.stdout
    command = next(line for line in result.stdout.splitlines() if line.startswith("$ python -m"))
    assert str(tmp_path / "kept" / "pipeline") in command  # the printed commands still run


def test_an_error_line_escapes_every_control_character() -> None:
    """NUL, escape sequences and lone surrogates from the input are written as escapes: the
    `error:` line stays one line of plain text, whatever the input held."""
    from reference.errors import CheckpointError
    from reference.programs.cli import one_line

    line = one_line(
        CheckpointError("/p/a\x00b.safetensors", "t\x1b", "shard 'c\x00\udcff' bad\x07")
    )
    assert line.isprintable(), repr(line)
    assert "\\x00" in line
    assert "\\x07" in line
