"""ARGS, DG-1, DG-2, DG-7: server arguments, their command line, and the DiT flag's admission.

Direct-GPU loading is about a CUDA runtime device, so admission tests use `cuda:0` as a value and
fake the platform (CUDA present or not); no device is touched. Refusals are judged by contract
(`reference/kit/judging/judge.py`): a ValueError naming the flag (in either spelling of its prefix)
and, where a component is at fault, the component; the reference's wording is pinned only in
reference-only tests.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fakes.pipelines import FakeBlock, FakeComponent, write_pipeline
from fakes.platform import FakePlatform
from reference.kit.judging.judge import refusal, skip_cpu_runtime_without_the_setting
from reference.kit.seam import ADMISSION, CLI_ARGS, SeamLoader, ServingOptions

ACCEL = torch.device("cuda", 0)
CUDA = FakePlatform(cuda=True)
DIT = "--direct-gpu-weight-loading"
DIT_U = "--direct_gpu_weight_loading"
SEL = "--component-direct-gpu-weight-loading"
SEL_U = "--component_direct_gpu_weight_loading"
TRUE_WORDS = ["true", "True", "TRUE", "tRuE"]
FALSE_WORDS = ["false", "False", "FALSE", "fAlSe"]
REFUSED_VALUES = ["1", "0", "yes", "no", "on", "off", "maybe", ""]
REFUSED_NEXT_TOKENS = ["yes", "maybe"]


def assert_names_one_of(error: BaseException, *names: str) -> None:
    """The message names at least one of `names` (spellings of one thing)."""
    assert any(n in str(error) for n in names), f"names none of {names}: {error}"


def names_component(message: str, name: str) -> bool:
    """`name` appears as a whole component name (`transformer` is not `transformer_2`)."""
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", message) is not None


def spellings(component: str) -> tuple[str, str]:
    return component.replace("_", "-"), component.replace("-", "_")


# --- DG-1: the DiT flag on the command line -------------------------------------------------------


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("DG-1")
def test_direct_flag_is_off_by_default(loader: SeamLoader) -> None:
    args, rest = loader.parse_server_args(["--zz-unrelated-option", "1"])
    assert args.direct_gpu_weight_loading is False
    assert sorted(rest) == ["--zz-unrelated-option", "1"]  # their order is ARGS-3's
    assert (
        loader.make_server_args(ServingOptions(runtime_device=ACCEL)).direct_gpu_weight_loading
        is False
    )


def dit_flag_cases(*flags: str) -> list[tuple[list[str], bool]]:
    cases: list[tuple[list[str], bool]] = []
    for flag in flags:
        cases += [
            ([flag], True),
            ([flag, "--zz-unrelated-option", "1"], True),
            (["--zz-unrelated-option", "1", flag], True),
        ]
        for words, value in ((TRUE_WORDS, True), (FALSE_WORDS, False)):
            cases += [([f"{flag}={w}"], value) for w in words]
            cases += [([flag, w], value) for w in words]
            cases += [([flag, w, "--zz-unrelated-option", "1"], value) for w in words[:1]]
    return cases


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("DG-1")
@pytest.mark.parametrize(("argv", "expected"), dit_flag_cases(DIT), ids=str)
def test_direct_flag_values(loader: SeamLoader, argv: list[str], expected: bool) -> None:
    args, rest = loader.parse_server_args(argv)
    assert args.direct_gpu_weight_loading is expected
    unrelated = [a for a in argv if a in ("--zz-unrelated-option", "1")]
    assert sorted(rest) == sorted(unrelated)  # their order is ARGS-3's


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("DG-1")
@pytest.mark.reference_only("the underscore spelling is free (DG-1): the reference accepts it")
@pytest.mark.parametrize(("argv", "expected"), dit_flag_cases(DIT_U), ids=str)
def test_reference_accepts_the_underscore_spelling(
    loader: SeamLoader, argv: list[str], expected: bool
) -> None:
    args, rest = loader.parse_server_args(argv)
    assert args.direct_gpu_weight_loading is expected
    unrelated = [a for a in argv if a in ("--zz-unrelated-option", "1")]
    assert sorted(rest) == sorted(unrelated)  # their order is ARGS-3's


def refused_dit_values() -> list[list[str]]:
    cases = []
    for flag in (DIT,):
        cases += [[f"{flag}={v}"] for v in REFUSED_VALUES]
        cases += [[flag, v] for v in REFUSED_NEXT_TOKENS]
    return cases


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("DG-1")
@pytest.mark.parametrize("argv", refused_dit_values(), ids=str)
def test_direct_flag_other_values_are_errors(loader: SeamLoader, argv: list[str]) -> None:
    error = refusal(lambda: loader.parse_server_args(["--zz-unrelated-option", "1", *argv]))
    assert_names_one_of(error, DIT, DIT_U)


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("DG-1")
@pytest.mark.reference_only("checks the reference's wording")
def test_direct_flag_error_wording() -> None:
    from reference.errors import ArgumentError
    from reference.request.args import parse_args

    with pytest.raises(ArgumentError, match=f"{DIT}.*true or false") as info:
        parse_args([f"{DIT}=maybe"])
    assert "unrecognized" not in str(info.value)


# --- ARGS-1: the per-component flag in every documented form --------------------------------------


def component_flag_cases() -> list[tuple[list[str], dict[str, bool]]]:
    cases: list[tuple[list[str], dict[str, bool]]] = []
    for prefix in (SEL, SEL_U):
        for raw, key in (("vae", "vae"), ("video-vae", "video_vae"), ("audio_vae", "audio_vae")):
            flag = f"{prefix}.{raw}"
            cases += [([flag], {key: True}), ([flag, "--zz-unrelated-option", "1"], {key: True})]
            for words, value in ((TRUE_WORDS, True), (FALSE_WORDS, False)):
                cases += [([f"{flag}={w}"], {key: value}) for w in words]
                cases += [([flag, w], {key: value}) for w in words]
    cases += [
        ([f"{SEL}.video-vae", f"{SEL}.audio-vae=false"], {"video_vae": True, "audio_vae": False}),
        ([f"{SEL}.vae", f"{SEL}.vae=true"], {"vae": True}),
        # Two spellings of one component (name and prefix) with equal values: one entry.
        ([f"{SEL}.video-vae", f"{SEL_U}.video_vae=true"], {"video_vae": True}),
        ([f"{SEL_U}.video_vae=false", f"{SEL}.video-vae", "FALSE"], {"video_vae": False}),
        ([f"{SEL}.audio_vae", "true", f"{SEL}.audio-vae"], {"audio_vae": True}),
    ]
    return cases


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("ARGS-1")
@pytest.mark.parametrize(("argv", "expected"), component_flag_cases(), ids=str)
def test_component_flag_forms(
    loader: SeamLoader, argv: list[str], expected: dict[str, bool]
) -> None:
    args, rest = loader.parse_server_args(argv)
    assert dict(args.component_direct_gpu_weight_loading) == expected
    unrelated = [a for a in argv if a in ("--zz-unrelated-option", "1")]
    assert sorted(rest) == sorted(unrelated)  # their order is ARGS-3's
    assert args.direct_gpu_weight_loading is False


# --- ARGS-2: bad input is an error naming the flag ------------------------------------------------


def bad_value_cases() -> list[tuple[list[str], str]]:
    cases: list[tuple[list[str], str]] = []
    for prefix in (SEL, SEL_U):
        for raw in ("vae", "video-vae"):
            cases += [([f"{prefix}.{raw}={v}"], raw) for v in REFUSED_VALUES]
            cases += [([f"{prefix}.{raw}", v], raw) for v in REFUSED_NEXT_TOKENS]
    return cases


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("ARGS-2")
@pytest.mark.parametrize(("argv", "component"), bad_value_cases(), ids=str)
def test_component_flag_bad_values_name_the_flag(
    loader: SeamLoader, argv: list[str], component: str
) -> None:
    error = refusal(lambda: loader.parse_server_args(["--zz-unrelated-option", "1", *argv]))
    assert_names_one_of(error, SEL, SEL_U)
    assert_names_one_of(error, *spellings(component))


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("ARGS-2")
@pytest.mark.parametrize(
    "argv",
    [
        argv
        for p in (SEL, SEL_U)
        for argv in ([f"{p}.=true"], [f"{p}."], [f"{p}.", "true"], [f"{p}.", "false"], [p, "vae"])
    ],
    ids=str,
)
def test_empty_component_is_an_error_naming_the_flag(loader: SeamLoader, argv: list[str]) -> None:
    error = refusal(lambda: loader.parse_server_args(["--zz-unrelated-option", "1", *argv]))
    assert_names_one_of(error, SEL, SEL_U)


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("ARGS-2")
@pytest.mark.parametrize(
    ("argv", "component"),
    [
        ([f"{SEL}.video-vae=true", f"{SEL}.video_vae=false"], "video_vae"),
        ([f"{SEL}.video_vae", f"{SEL}.video-vae", "false"], "video_vae"),
        ([f"{SEL_U}.vae", f"{SEL}.vae", "false"], "vae"),
        ([f"{SEL}.audio-vae=FALSE", f"{SEL_U}.audio_vae=True"], "audio_vae"),
        ([f"{SEL}.vae=true", f"{SEL}.vae=false"], "vae"),
    ],
    ids=["two-names", "two-names-next-token", "two-prefixes", "both-differ", "same-spelling"],
)
def test_one_component_with_different_values_is_an_error(
    loader: SeamLoader, argv: list[str], component: str
) -> None:
    error = refusal(lambda: loader.parse_server_args(["--zz-unrelated-option", "1", *argv]))
    assert_names_one_of(error, SEL, SEL_U)
    assert_names_one_of(error, *spellings(component))


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("ARGS-2")
@pytest.mark.reference_only("checks the reference's wording")
@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([f"{SEL}.vae=maybe"], rf"{SEL}\.vae.*true or false.*'maybe'"),
        ([f"{SEL}.vae="], rf"{SEL}\.vae.*true or false.*''"),
        ([f"{SEL}.=true"], rf"{SEL}\..*component name is empty"),
        ([SEL, "vae"], rf"{SEL}.*names no component"),
        (
            [f"{SEL}.video-vae=true", f"{SEL}.video_vae=false"],
            rf"{SEL}\.video-vae=true and {SEL}\.video_vae=false.*'video_vae'",
        ),
    ],
)
def test_component_flag_error_wording(argv: list[str], words: str) -> None:
    from reference.errors import ArgumentError
    from reference.request.args import parse_args

    with pytest.raises(ArgumentError, match=words) as info:
        parse_args(argv)
    assert "unrecognized" not in str(info.value)


# --- ARGS-3: everything else passes through untouched and in order --------------------------------

# Arguments that are not loading options, some of them looking like one. None is a prefix of a
# flag a serving stack plausibly has (SPEC ARGS-3: `--prompt`, `--seed`, `--vae` could be).
UNRELATED = [
    "load",
    "some/dir",
    "--zz-unrelated-option",
    "a cat",
    "--zz-other-option=3",
    "--direct-gpu-weight-loading-v2",
    "--component-direct-gpu-weight-loadings.vae",
    "--component-direct-gpu-weight-loading-vae=true",
    "--zz-last-option",
    "64",
]


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("ARGS-3")
def test_unrelated_arguments_pass_through_in_order(loader: SeamLoader) -> None:
    argv = [
        *UNRELATED[:4],
        f"{SEL}.vae",
        *UNRELATED[4:5],
        DIT,
        *UNRELATED[5:8],
        f"{SEL_U}.video-vae",
        "false",
        *UNRELATED[8:],
    ]
    given = list(argv)
    args, rest = loader.parse_server_args(argv)
    # What `--` does to the flags after it is not pinned: SPEC leaves it free
    # (docs/spec-questions.md).
    assert rest == UNRELATED
    assert dict(args.component_direct_gpu_weight_loading) == {"vae": True, "video_vae": False}
    assert args.direct_gpu_weight_loading is True
    assert argv == given  # the caller's list is not modified


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("ARGS-3")
def test_without_loading_options_everything_passes_through(loader: SeamLoader) -> None:
    args, rest = loader.parse_server_args(UNRELATED)
    assert rest == UNRELATED
    assert args.direct_gpu_weight_loading is False
    assert dict(args.component_direct_gpu_weight_loading) == {}


# --- ARGS-4: programmatic construction validates too ----------------------------------------------


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("ARGS-4")
@pytest.mark.parametrize("value", ["true", "True", 1, 0, None, 1.0], ids=repr)
@pytest.mark.parametrize("name", ["vae", "video-vae"])
def test_construction_refuses_component_values_that_are_not_bools(
    loader: SeamLoader, name: str, value: object
) -> None:
    error = refusal(
        lambda: loader.make_server_args(
            ServingOptions(runtime_device=ACCEL, component_direct_gpu_weight_loading={name: value})
        )
    )
    assert_names_one_of(error, *spellings(name))


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("ARGS-4")
def test_construction_refuses_an_empty_component_name(loader: SeamLoader) -> None:
    refusal(
        lambda: loader.make_server_args(
            ServingOptions(runtime_device=ACCEL, component_direct_gpu_weight_loading={"": True})
        )
    )


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("ARGS-4")
def test_construction_refuses_two_spellings_with_different_values(loader: SeamLoader) -> None:
    error = refusal(
        lambda: loader.make_server_args(
            ServingOptions(
                runtime_device=ACCEL,
                component_direct_gpu_weight_loading={"video-vae": True, "video_vae": False},
            )
        )
    )
    assert_names_one_of(error, *spellings("video_vae"))


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("ARGS-4")
@pytest.mark.parametrize("value", ["true", "False", 1, 0, None], ids=repr)
def test_construction_refuses_a_dit_flag_that_is_not_a_bool(
    loader: SeamLoader, value: object
) -> None:
    error = refusal(
        lambda: loader.make_server_args(
            ServingOptions(runtime_device=ACCEL, direct_gpu_weight_loading=value)
        )  # type: ignore[arg-type]
    )
    assert_names_one_of(error, "direct_gpu_weight_loading", DIT)


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("ARGS-4")
@pytest.mark.parametrize("value", [True, False])
def test_construction_accepts_real_bools(loader: SeamLoader, value: bool) -> None:
    args = loader.make_server_args(
        ServingOptions(
            runtime_device=ACCEL,
            direct_gpu_weight_loading=value,
            component_direct_gpu_weight_loading={"vae": value, "audio-vae": not value},
        )
    )
    assert args.direct_gpu_weight_loading is value
    assert dict(args.component_direct_gpu_weight_loading) == {"vae": value, "audio_vae": not value}


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("ARGS-4")
def test_construction_normalises_names(loader: SeamLoader) -> None:
    args = loader.make_server_args(
        ServingOptions(
            runtime_device=ACCEL,
            component_direct_gpu_weight_loading={
                "video-vae": True,
                "video_vae": True,
                "vae": False,
            },
        )
    )
    assert dict(args.component_direct_gpu_weight_loading) == {"video_vae": True, "vae": False}


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("ARGS-4")
@pytest.mark.reference_only("the reference's choices and wording beyond the rule")
@pytest.mark.parametrize(
    ("selection", "words"),
    [
        ({"vae": "true"}, r"'vae'.*True or False"),
        ({"-": True}, r"empty"),
        ({"video-vae": True, "video_vae": False}, r"'video_vae'.*different values"),
    ],
)
def test_construction_error_wording(selection: dict[str, object], words: str) -> None:
    from reference.errors import ArgumentError
    from reference.request.args import ServerArgs

    with pytest.raises(ArgumentError, match=words):
        ServerArgs(component_direct_gpu_weight_loading=selection)  # type: ignore[arg-type]


# --- ARGS-5: the per-component question -----------------------------------------------------------


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("ARGS-5")
def test_should_direct_load_answers_by_exact_normalised_name(loader: SeamLoader) -> None:
    """Asked by the normalised name; whether the query itself is normalised is left free."""
    args, _ = loader.parse_server_args([f"{SEL}.video-vae", f"{SEL_U}.audio_vae=false"])
    ask = args.should_direct_gpu_weight_load_component
    assert ask("video_vae") is True
    assert ask("audio_vae") is False
    for other in ("vae", "VIDEO_VAE", "Video_Vae", "video", "video_vae_2", "transformer"):
        assert ask(other) is False, other
    built = loader.make_server_args(
        ServingOptions(
            runtime_device=ACCEL, component_direct_gpu_weight_loading={"video-vae": True}
        )
    )
    assert built.should_direct_gpu_weight_load_component("video_vae") is True
    assert built.should_direct_gpu_weight_load_component("VIDEO_VAE") is False


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("ARGS-5")
def test_should_direct_load_is_false_by_default(loader: SeamLoader) -> None:
    for args in (
        loader.make_server_args(ServingOptions(runtime_device=ACCEL)),
        loader.make_server_args(
            ServingOptions(runtime_device=ACCEL, direct_gpu_weight_loading=True)
        ),
        loader.parse_server_args([])[0],
    ):
        for name in ("vae", "video_vae", "audio_vae", "vocoder"):
            assert args.should_direct_gpu_weight_load_component(name) is False, name


# --- DG-2 and DG-7: admission of the DiT flag -----------------------------------------------------

TWO_DITS = {"transformer": FakeComponent(FakeBlock), "transformer_2": FakeComponent(FakeBlock)}


@pytest.fixture(scope="module")
def one_dit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("one_dit")
    return write_pipeline(root, {"transformer": FakeComponent(FakeBlock)})


@pytest.fixture(scope="module")
def two_dits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pipeline(tmp_path_factory.mktemp("two_dits"), TWO_DITS)


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("DG-2")
@pytest.mark.parametrize(
    ("device", "platform"),
    [
        (ACCEL, CUDA),
        (torch.device("cuda"), CUDA),
        (torch.device("cuda", 1), FakePlatform(cuda=True, devices=2)),
    ],
    ids=["cuda:0", "cuda", "cuda:1"],
)
def test_direct_dit_is_admitted_when_every_condition_holds(
    loader: SeamLoader, one_dit: Path, device: torch.device, platform: FakePlatform
) -> None:
    args = loader.make_server_args(
        ServingOptions(runtime_device=device, direct_gpu_weight_loading=True)
    )
    loader.admit(one_dit, args, platform=platform)


DG2_REFUSALS = [
    pytest.param({}, FakePlatform(cuda=False), id="no-cuda"),
    pytest.param({"runtime_device": torch.device("cpu")}, CUDA, id="cpu-runtime"),
    pytest.param({"runtime_device": torch.device("cpu", 0)}, CUDA, id="cpu-0-runtime"),
    pytest.param({"dit_cpu_offload": True}, CUDA, id="dit-offload"),
    pytest.param({"component_cpu_offload": {"transformer": True}}, CUDA, id="component-offload"),
    pytest.param({"dit_layerwise_offload": True}, CUDA, id="layerwise"),
    pytest.param({"fsdp_inference": True}, CUDA, id="fsdp"),
    pytest.param({"tp_size": 2}, CUDA, id="tp"),
]


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("DG-2")
@pytest.mark.parametrize(("options", "platform"), DG2_REFUSALS)
def test_direct_dit_refusals_name_the_flag(
    loader: SeamLoader, one_dit: Path, options: dict[str, object], platform: FakePlatform
) -> None:
    options = {"runtime_device": ACCEL, **options}
    skip_cpu_runtime_without_the_setting(loader, options["runtime_device"])
    # Construction may refuse already (ARGS-4: it validates too); else admission must.
    error = refusal(
        lambda: loader.admit(
            one_dit,
            loader.make_server_args(ServingOptions(direct_gpu_weight_loading=True, **options)),  # type: ignore[arg-type]
            platform=platform,
        )
    )
    assert_names_one_of(error, DIT, DIT_U)
    # The same options without the flag are fine: the refusal is about the flag.
    loader.admit(one_dit, loader.make_server_args(ServingOptions(**options)), platform=platform)  # type: ignore[arg-type]


@pytest.mark.capability(CLI_ARGS)
@pytest.mark.rule("DG-2")
@pytest.mark.reference_only("checks the reference's wording of the cause and the fix")
@pytest.mark.parametrize(
    ("options", "platform", "words"),
    [
        ({}, FakePlatform(cuda=False), "needs CUDA.*drop --direct-gpu-weight-loading"),
        ({"runtime_device": torch.device("cpu")}, CUDA, "CUDA runtime device.*--device cuda"),
        ({"dit_cpu_offload": True}, CUDA, "drop --dit-cpu-offload or drop --direct"),
        ({"component_cpu_offload": {"transformer": True}}, CUDA, "--component-cpu-offload"),
        ({"dit_layerwise_offload": True}, CUDA, "drop --dit-layerwise-offload"),
        ({"fsdp_inference": True}, CUDA, "drop --fsdp-inference"),
        ({"tp_size": 2}, CUDA, "--tp-size 2.*set --tp-size 1"),
    ],
)
def test_direct_dit_refusal_wording(
    one_dit: Path, options: dict[str, object], platform: FakePlatform, words: str
) -> None:
    from reference.errors import ArgumentError
    from reference.request.admission import admit
    from reference.request.args import ServerArgs
    from reference.request.model_index import read_pipeline

    args = ServerArgs(**{"runtime_device": ACCEL, "direct_gpu_weight_loading": True, **options})  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match=words) as info:
        admit(read_pipeline(one_dit), args, platform=platform)
    assert "'transformer'" in str(info.value)


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("DG-2")
def test_component_offload_entry_false_keeps_the_dit_resident(
    loader: SeamLoader, one_dit: Path
) -> None:
    args = loader.make_server_args(
        ServingOptions(
            runtime_device=ACCEL,
            direct_gpu_weight_loading=True,
            component_cpu_offload={"vae": True, "transformer": False},
        )
    )
    loader.admit(one_dit, args, platform=CUDA)


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("DG-7")
@pytest.mark.parametrize(
    ("offloaded", "named"),
    [
        ({"transformer_2": True}, "transformer_2"),
        ({"transformer-2": True}, "transformer_2"),
        ({"transformer": True}, "transformer"),
        ({"transformer": True, "transformer_2": True}, "transformer_2"),
    ],
    ids=["second", "second-dashed", "first", "both"],
)
def test_residency_is_checked_for_every_transformer(
    loader: SeamLoader, two_dits: Path, offloaded: dict[str, bool], named: str
) -> None:
    args = loader.make_server_args(
        ServingOptions(
            runtime_device=ACCEL, direct_gpu_weight_loading=True, component_cpu_offload=offloaded
        )
    )
    error = refusal(lambda: loader.admit(two_dits, args, platform=CUDA))
    # (naming the flag is DG-2's to judge: here the component the refusal names)
    assert names_component(str(error), named), f"does not name {named!r}: {error}"
    loader.admit(
        two_dits, loader.make_server_args(ServingOptions(runtime_device=ACCEL)), platform=CUDA
    )


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("DG-7")
@pytest.mark.parametrize(
    "options",
    [
        {"dit_layerwise_offload": True},
        {"dit_cpu_offload": True},
    ],
    ids=str,
)
def test_dit_refusal_names_every_transformer(
    loader: SeamLoader, two_dits: Path, options: dict[str, object]
) -> None:
    args = loader.make_server_args(
        ServingOptions(
            runtime_device=ACCEL,
            direct_gpu_weight_loading=True,
            **options,  # type: ignore[arg-type]
        )
    )
    error = refusal(lambda: loader.admit(two_dits, args, platform=CUDA))
    # (naming the flag is DG-2's to judge: here the components the refusal names)
    for name in ("transformer", "transformer_2"):
        assert names_component(str(error), name), f"does not name {name!r}: {error}"


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("DG-2", "DG-7")
@pytest.mark.parametrize(
    ("options", "platform", "causes"),
    [
        ({"tp_size": 4}, CUDA, ("tp-size", "tp_size", "tensor parallel", "tensor-parallel")),
        ({"fsdp_inference": True}, CUDA, ("fsdp",)),
        ({}, FakePlatform(cuda=False), ("cuda",)),
    ],
    ids=["tp", "fsdp", "no-cuda"],
)
def test_a_global_cause_names_the_flag_and_the_cause(
    loader: SeamLoader,
    two_dits: Path,
    options: dict[str, object],
    platform: FakePlatform,
    causes: tuple[str, ...],
) -> None:
    """A refusal whose cause is global names the flag and the cause; naming each component
    is not required (DG-7). Construction may refuse already (ARGS-4: it validates too)."""
    error = refusal(
        lambda: loader.admit(
            two_dits,
            loader.make_server_args(
                ServingOptions(
                    runtime_device=ACCEL,
                    direct_gpu_weight_loading=True,
                    **options,  # type: ignore[arg-type]
                )
            ),
            platform=platform,
        )
    )
    assert_names_one_of(error, DIT, DIT_U)
    message = str(error).lower()
    assert any(cause in message for cause in causes), f"names no cause {causes}: {error}"


@pytest.mark.capability(ADMISSION)
@pytest.mark.rule("DG-7")
def test_undeclared_second_transformer_is_not_checked(loader: SeamLoader, one_dit: Path) -> None:
    args = loader.make_server_args(
        ServingOptions(
            runtime_device=ACCEL,
            direct_gpu_weight_loading=True,
            component_cpu_offload={"transformer_2": True},
        )
    )
    loader.admit(one_dit, args, platform=CUDA)
