"""ARGS-2, ARGS-4, DG-1: the reference's exact wording for each refused option.

Other loaders are judged on the error type and the flag named (test_args.py); the sentences,
each with its fix, are the reference's own and are pinned here alone.
"""

from __future__ import annotations

import pytest

from reference.errors import ArgumentError
from reference.request.args import ServerArgs, parse_args

pytestmark = pytest.mark.reference_only("pins the reference's own ArgumentError wording")

BOOL_HINT = (
    "{flag}: expected true or false (any case), got 'maybe'; write {flag}=true or"
    " {flag}=false (a bare {flag} means true when no plain argument follows it)"
)
NO_COMPONENT = "{flag}: names no component; write {flag}.<component>, as in {flag}.vae"


@pytest.mark.rule("ARGS-2", "DG-1")
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dit-cpu-offload=maybe"], BOOL_HINT.format(flag="--dit-cpu-offload")),
        (
            ["--component-cpu-offload.vae=maybe"],
            BOOL_HINT.format(flag="--component-cpu-offload.vae"),
        ),
        (
            ["--tp-size"],
            "argument --tp-size/--tp_size: expected one argument;"
            " see python -m reference load --help",
        ),
        (["--tp-size", "0"], "--tp-size: expected an integer >= 1, got '0'"),
        (
            ["--device", "nonsense"],
            "--device: 'nonsense' is not a device; write cuda, cuda:0 or cpu",
        ),
        (["--quantization", ""], "--quantization: empty method; write --quantization fp8"),
        (
            ["--quantization-serialized"],
            "--quantization-serialized needs --quantization METHOD; add it or drop the flag",
        ),
        (
            ["--component-cpu-offload=.vae=true"],
            NO_COMPONENT.format(flag="--component-cpu-offload"),
        ),
        (
            ["--component-direct-gpu-weight-loading=true"],
            NO_COMPONENT.format(flag="--component-direct-gpu-weight-loading"),
        ),
        (
            ["--component-cpu-offload.-"],
            "--component-cpu-offload.-: the component name is empty; write"
            " --component-cpu-offload.<component>, as in --component-cpu-offload.vae=true",
        ),
        (
            ["--component-cpu-offload.vae", "--component_cpu_offload.vae=false"],
            "--component-cpu-offload.vae=true and --component_cpu_offload.vae=false give"
            " component 'vae' different values; keep one of them",
        ),
    ],
)
def test_command_line_messages(argv: list[str], message: str) -> None:
    with pytest.raises(ArgumentError) as caught:
        parse_args(argv)
    assert str(caught.value) == message


@pytest.mark.rule("ARGS-4")
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"runtime_device": "cpu"},
            "runtime_device must be a torch.device, got 'cpu'; write torch.device('cpu')",
        ),
        (
            {"dit_cpu_offload": "true"},
            "dit_cpu_offload must be True or False, got str 'true'; pass a real bool",
        ),
        (
            {"direct_gpu_weight_loading": "x"},
            "direct_gpu_weight_loading must be True or False, got str 'x'; pass a real bool",
        ),
        ({"tp_size": 0}, "tp_size must be an integer >= 1, got 0"),
        ({"quantization": "fp8"}, "quantization must be a QuantizationSpec or None, got 'fp8'"),
        (
            {"component_cpu_offload": [("vae", True)]},
            "component_cpu_offload must map component names to True/False, got list",
        ),
        (
            {"component_cpu_offload": {"": True}},
            "component_cpu_offload: component name '' is empty; name a component, as in"
            " --component-cpu-offload.vae",
        ),
        (
            {"component_cpu_offload": {"vae": "true"}},
            "component_cpu_offload['vae'] must be True or False, got str 'true'; pass a real bool"
            " (--component-cpu-offload.vae=true on the command line)",
        ),
        (
            {"component_cpu_offload": {"video-vae": True, "video_vae": False}},
            "component_cpu_offload: 'video-vae'=True and 'video_vae'=False name the same"
            " component 'video_vae' with different values; keep one",
        ),
    ],
)
def test_construction_messages(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ArgumentError) as caught:
        ServerArgs(**fields)  # type: ignore[arg-type]
    assert str(caught.value) == message
