"""ARGS, DG-1, DG-2, DG-7: server arguments, their command line, and the DiT flag's admission.

Direct-GPU loading is about a CUDA runtime device, so admission tests use `cuda:0` as a value and
fake the platform (CUDA present or not); no device is touched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fakes.pipelines import FakeBlock, FakeComponent, write_pipeline
from fakes.platform import FakePlatform
from reference.adapter import ADMISSION, CLI_ARGS, PIPELINES, LoaderAdapter

ACCEL = torch.device("cuda", 0)
CUDA = FakePlatform(cuda=True)
DIT = "--direct-gpu-weight-loading"
SEL = "--component-direct-gpu-weight-loading"


# --- DG-1: the DiT flag on the command line -------------------------------------------------------


@pytest.mark.rule("DG-1")
@pytest.mark.capability(CLI_ARGS)
def test_direct_flag_is_off_by_default(loader: LoaderAdapter) -> None:
    args, rest = loader.parse_server_args(["--seed", "1"])
    assert args.direct_gpu_weight_loading is False
    assert rest == ["--seed", "1"]
    assert loader.make_server_args(runtime_device=ACCEL).direct_gpu_weight_loading is False


@pytest.mark.rule("DG-1")
@pytest.mark.capability(CLI_ARGS)
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([DIT], True),
        ([DIT, "--seed", "1"], True),
        ([f"{DIT}=true"], True),
        ([f"{DIT}=TRUE"], True),
        ([f"{DIT}=False"], False),
        ([DIT, "tRuE"], True),
        ([DIT, "FALSE"], False),
        (["--direct_gpu_weight_loading=true"], True),
    ],
)
def test_direct_flag_values(loader: LoaderAdapter, argv: list[str], expected: bool) -> None:
    args, rest = loader.parse_server_args(argv)
    assert args.direct_gpu_weight_loading is expected
    assert rest == [a for a in argv if a in ("--seed", "1")]


@pytest.mark.rule("DG-1")
@pytest.mark.capability(CLI_ARGS)
@pytest.mark.parametrize(
    "argv", [[f"{DIT}=maybe"], [f"{DIT}="], [f"{DIT}=1"], [f"{DIT}=yes"], [DIT, "maybe"]]
)
def test_direct_flag_other_values_are_errors(loader: LoaderAdapter, argv: list[str]) -> None:
    with pytest.raises(ValueError, match=f"{DIT}.*true or false") as info:
        loader.parse_server_args(argv)
    assert "unrecognized" not in str(info.value)


# --- ARGS-1: the per-component flag in every documented form --------------------------------------


@pytest.mark.rule("ARGS-1")
@pytest.mark.capability(CLI_ARGS)
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([f"{SEL}.vae"], {"vae": True}),
        ([f"{SEL}.vae=true"], {"vae": True}),
        ([f"{SEL}.vae=FALSE"], {"vae": False}),
        ([f"{SEL}.vae", "True"], {"vae": True}),
        ([f"{SEL}.vae", "false"], {"vae": False}),
        (["--component_direct_gpu_weight_loading.vae"], {"vae": True}),
        (["--component_direct_gpu_weight_loading.audio_vae=false"], {"audio_vae": False}),
        ([f"{SEL}.video-vae"], {"video_vae": True}),
        ([f"{SEL}.video-vae", f"{SEL}.audio-vae=false"], {"video_vae": True, "audio_vae": False}),
        ([f"{SEL}.vae", f"{SEL}.vae=true"], {"vae": True}),
    ],
)
def test_component_flag_forms(
    loader: LoaderAdapter, argv: list[str], expected: dict[str, bool]
) -> None:
    args, rest = loader.parse_server_args(argv)
    assert dict(args.component_direct_gpu_weight_loading) == expected
    assert rest == []
    assert args.direct_gpu_weight_loading is False


# --- ARGS-2: bad input is an error naming the flag ------------------------------------------------


@pytest.mark.rule("ARGS-2")
@pytest.mark.capability(CLI_ARGS)
@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([f"{SEL}.vae=maybe"], rf"{SEL}\.vae.*true or false.*'maybe'"),
        ([f"{SEL}.vae="], rf"{SEL}\.vae.*true or false.*''"),
        ([f"{SEL}.vae", "maybe"], rf"{SEL}\.vae.*'maybe'"),
        ([f"{SEL}.=true"], rf"{SEL}\..*component name is empty"),
        ([f"{SEL}.", "true"], rf"{SEL}\..*component name is empty"),
        ([SEL, "vae"], rf"{SEL}.*names no component"),
        (
            [f"{SEL}.video-vae=true", f"{SEL}.video_vae=false"],
            rf"{SEL}\.video-vae=true and {SEL}\.video_vae=false.*'video_vae'",
        ),
        (
            ["--component_direct_gpu_weight_loading.vae", f"{SEL}.vae", "false"],
            r"'vae' different values",
        ),
    ],
    ids=[
        "bad-value",
        "empty-value",
        "bad-next-token",
        "empty-component",
        "empty-component-eats-nothing",
        "no-component",
        "two-spellings",
        "two-prefixes",
    ],
)
def test_component_flag_errors(loader: LoaderAdapter, argv: list[str], words: str) -> None:
    with pytest.raises(ValueError, match=words) as info:
        loader.parse_server_args(["--seed", "1", *argv])
    assert "unrecognized" not in str(info.value)


# --- ARGS-3: everything else passes through untouched and in order --------------------------------


@pytest.mark.rule("ARGS-3")
@pytest.mark.capability(CLI_ARGS)
def test_unrelated_arguments_pass_through_in_order(loader: LoaderAdapter) -> None:
    argv = [
        "load",
        "some/dir",
        "--prompt",
        "a cat",
        f"{SEL}.vae",
        "--seed=3",
        DIT,
        "-v",
        f"{SEL}.video-vae",
        "false",
        "--height",
        "64",
        "--",
        f"{SEL}.audio_vae",
    ]
    args, rest = loader.parse_server_args(argv)
    assert rest == [
        "load",
        "some/dir",
        "--prompt",
        "a cat",
        "--seed=3",
        "-v",
        "--height",
        "64",
        "--",
        f"{SEL}.audio_vae",
    ]
    assert dict(args.component_direct_gpu_weight_loading) == {"vae": True, "video_vae": False}
    assert args.direct_gpu_weight_loading is True
    assert argv[4] == f"{SEL}.vae"  # the caller's list is not modified


# --- ARGS-4: programmatic construction validates too ----------------------------------------------


@pytest.mark.rule("ARGS-4")
@pytest.mark.capability(CLI_ARGS)
@pytest.mark.parametrize(
    ("selection", "words"),
    [
        ({"vae": "true"}, r"'vae'.*True or False"),
        ({"vae": 1}, r"'vae'.*True or False"),
        ({"vae": None}, r"'vae'.*True or False"),
        ({"": True}, r"empty"),
        ({"-": True}, r"empty"),
        ({"video-vae": True, "video_vae": False}, r"'video_vae'.*different values"),
    ],
    ids=["string", "int", "none", "empty", "dash-only", "conflicting-spellings"],
)
def test_construction_refuses_bad_entries(
    loader: LoaderAdapter, selection: dict[str, object], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        loader.make_server_args(runtime_device=ACCEL, component_direct_gpu_weight_loading=selection)


@pytest.mark.rule("ARGS-4")
@pytest.mark.capability(CLI_ARGS)
@pytest.mark.parametrize("value", ["true", 1, None])
def test_construction_refuses_a_dit_flag_that_is_not_a_bool(
    loader: LoaderAdapter, value: object
) -> None:
    with pytest.raises(ValueError, match=r"direct_gpu_weight_loading.*True or False"):
        loader.make_server_args(runtime_device=ACCEL, direct_gpu_weight_loading=value)  # type: ignore[arg-type]


@pytest.mark.rule("ARGS-4")
@pytest.mark.capability(CLI_ARGS)
def test_construction_normalises_names(loader: LoaderAdapter) -> None:
    args = loader.make_server_args(
        runtime_device=ACCEL,
        component_direct_gpu_weight_loading={"video-vae": True, "video_vae": True, "vae": False},
    )
    assert dict(args.component_direct_gpu_weight_loading) == {"video_vae": True, "vae": False}


# --- ARGS-5: the per-component question -----------------------------------------------------------


@pytest.mark.rule("ARGS-5")
@pytest.mark.capability(CLI_ARGS)
def test_should_direct_load_answers_by_exact_normalised_name(loader: LoaderAdapter) -> None:
    args, _ = loader.parse_server_args([f"{SEL}.video-vae", f"{SEL}.audio_vae=false"])
    ask = args.should_direct_gpu_weight_load_component
    assert (ask("video_vae"), ask("video-vae")) == (True, True)
    assert ask("audio_vae") is False
    assert (ask("vae"), ask("VIDEO_VAE"), ask("video"), ask("transformer")) == (False,) * 4
    empty = loader.make_server_args(runtime_device=ACCEL, direct_gpu_weight_loading=True)
    assert empty.should_direct_gpu_weight_load_component("video_vae") is False


# --- DG-2 and DG-7: admission of the DiT flag -----------------------------------------------------

TWO_DITS = {"transformer": FakeComponent(FakeBlock), "transformer_2": FakeComponent(FakeBlock)}


@pytest.fixture(scope="module")
def one_dit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("one_dit")
    return write_pipeline(root, {"transformer": FakeComponent(FakeBlock)})


@pytest.fixture(scope="module")
def two_dits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pipeline(tmp_path_factory.mktemp("two_dits"), TWO_DITS)


@pytest.mark.rule("DG-2")
@pytest.mark.capability(CLI_ARGS, ADMISSION, PIPELINES)
def test_direct_dit_is_admitted_when_every_condition_holds(
    loader: LoaderAdapter, one_dit: Path
) -> None:
    args = loader.make_server_args(runtime_device=ACCEL, direct_gpu_weight_loading=True)
    loader.admit(one_dit, args, platform=CUDA)


@pytest.mark.rule("DG-2")
@pytest.mark.capability(CLI_ARGS, ADMISSION, PIPELINES)
@pytest.mark.parametrize(
    ("options", "platform", "words"),
    [
        ({}, FakePlatform(cuda=False), "needs CUDA"),
        ({"runtime_device": torch.device("cpu")}, CUDA, "CUDA runtime device.*--device"),
        ({"dit_cpu_offload": True}, CUDA, "--dit-cpu-offload"),
        ({"component_cpu_offload": {"transformer": True}}, CUDA, "--component-cpu-offload"),
        ({"dit_layerwise_offload": True}, CUDA, "--dit-layerwise-offload"),
        ({"fsdp_inference": True}, CUDA, "--fsdp-inference"),
        ({"tp_size": 2}, CUDA, "--tp-size 2.*--tp-size 1"),
    ],
    ids=["no-cuda", "cpu-runtime", "dit-offload", "component-offload", "layerwise", "fsdp", "tp"],
)
def test_direct_dit_refusals_name_flag_component_and_fix(
    loader: LoaderAdapter,
    one_dit: Path,
    options: dict[str, object],
    platform: FakePlatform,
    words: str,
) -> None:
    options = {"runtime_device": ACCEL, **options}
    args = loader.make_server_args(direct_gpu_weight_loading=True, **options)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=words) as info:
        loader.admit(one_dit, args, platform=platform)
    message = str(info.value)
    assert DIT in message
    assert "'transformer'" in message
    assert "drop" in message or "set" in message  # the fix
    # The same options without the flag are fine: the refusal is about the flag.
    loader.admit(one_dit, loader.make_server_args(**options), platform=platform)  # type: ignore[arg-type]


@pytest.mark.rule("DG-2")
@pytest.mark.capability(CLI_ARGS, ADMISSION, PIPELINES)
def test_component_offload_entry_false_keeps_the_dit_resident(
    loader: LoaderAdapter, one_dit: Path
) -> None:
    args = loader.make_server_args(
        runtime_device=ACCEL,
        direct_gpu_weight_loading=True,
        component_cpu_offload={"vae": True, "transformer": False},
    )
    loader.admit(one_dit, args, platform=CUDA)


@pytest.mark.rule("DG-7")
@pytest.mark.capability(CLI_ARGS, ADMISSION, PIPELINES)
def test_residency_is_checked_for_every_transformer(loader: LoaderAdapter, two_dits: Path) -> None:
    args = loader.make_server_args(
        runtime_device=ACCEL,
        direct_gpu_weight_loading=True,
        component_cpu_offload={"transformer_2": True},
    )
    with pytest.raises(
        ValueError, match=r"'transformer_2'.*--component-cpu-offload\.transformer_2"
    ):
        loader.admit(two_dits, args, platform=CUDA)


@pytest.mark.rule("DG-7")
@pytest.mark.capability(CLI_ARGS, ADMISSION, PIPELINES)
@pytest.mark.parametrize(
    "options", [{"dit_layerwise_offload": True}, {"dit_cpu_offload": True}, {"tp_size": 4}]
)
def test_dit_refusal_names_every_transformer(
    loader: LoaderAdapter, two_dits: Path, options: dict[str, object]
) -> None:
    args = loader.make_server_args(
        runtime_device=ACCEL,
        direct_gpu_weight_loading=True,
        **options,  # type: ignore[arg-type]
    )
    with pytest.raises(ValueError, match=DIT) as info:
        loader.admit(two_dits, args, platform=CUDA)
    assert "'transformer'" in str(info.value)
    assert "'transformer_2'" in str(info.value)


@pytest.mark.rule("DG-7")
@pytest.mark.capability(CLI_ARGS, ADMISSION, PIPELINES)
def test_undeclared_second_transformer_is_not_checked(loader: LoaderAdapter, one_dit: Path) -> None:
    args = loader.make_server_args(
        runtime_device=ACCEL,
        direct_gpu_weight_loading=True,
        component_cpu_offload={"transformer_2": True},
    )
    loader.admit(one_dit, args, platform=CUDA)
