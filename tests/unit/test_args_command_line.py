"""The reference's command line beyond the per-component flags: every option reaches its field.

`ServerArgsLike` exposes only the direct-loading answers, so the other fields (runtime device,
offload, FSDP, TP size, quantization) are read from the reference's own `ServerArgs` here; the
rules they feed (DG-2, DG-3) are judged for every loader through admission in test_args.py.
"""

from __future__ import annotations

import pytest
import torch

from reference.errors import ArgumentError
from reference.request.args import ServerArgs, own_server_args, parse_args
from reference.request.quantization import QuantizationSpec

pytestmark = pytest.mark.reference_only("reads fields of the reference's own ServerArgs")


@pytest.mark.rule("DG-2")
def test_every_option_reaches_its_field() -> None:
    args, rest = parse_args(
        [
            "--device",
            "cpu",
            "--dit-cpu-offload",
            "--dit-layerwise-offload=true",
            "--component-cpu-offload.vae",
            "--fsdp-inference",
            "true",
            "--tp-size",
            "2",
            "--quantization",
            "fp8",
            "--quantization-serialized",
            "--direct-gpu-weight-loading=false",
            "--component-direct-gpu-weight-loading.video-vae=true",
        ]
    )
    assert rest == []
    assert args.runtime_device == torch.device("cpu")
    assert args.dit_cpu_offload is True
    assert args.dit_layerwise_offload is True
    assert dict(args.component_cpu_offload) == {"vae": True}
    assert args.fsdp_inference is True
    assert args.tp_size == 2
    assert args.quantization == QuantizationSpec("fp8", serialized=True)
    assert args.direct_gpu_weight_loading is False
    assert dict(args.component_direct_gpu_weight_loading) == {"video_vae": True}


@pytest.mark.rule("DG-2")
def test_defaults_without_options() -> None:
    args, rest = parse_args([])
    assert rest == []
    assert args == ServerArgs()
    assert args.runtime_device is None  # the platform decides when a load starts
    assert args.tp_size == 1
    assert args.quantization is None


@pytest.mark.rule("DG-2")
@pytest.mark.parametrize(
    ("argv", "size"), [(["--tp-size", "1"], 1), (["--tp_size", "3"], 3), (["--tp-size=4"], 4)]
)
def test_tp_size_spellings(argv: list[str], size: int) -> None:
    assert parse_args(argv)[0].tp_size == size


@pytest.mark.rule("DG-3")
def test_online_quantization_is_not_serialized() -> None:
    assert parse_args(["--quantization", "mxfp4"])[0].quantization == QuantizationSpec("mxfp4")


@pytest.mark.rule("ARGS-3")
@pytest.mark.parametrize(
    "argv",
    [["-h"], ["--help"], ["--dev", "cpu"], ["--tp", "2"], ["--quant", "fp8"]],
    ids=["h", "help", "device-abbrev", "tp-abbrev", "quantization-abbrev"],
)
def test_help_and_abbreviations_are_not_options(argv: list[str]) -> None:
    """No help action and no prefix matching: such tokens belong to whoever parses the rest."""
    args, rest = parse_args(argv)
    assert rest == argv
    assert args == ServerArgs()


@pytest.mark.rule("ARGS-2")
@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--tp-size"], "argument --tp-size/--tp_size"),
        (["--tp-size", "0"], "--tp-size"),
        (["--tp-size", "x"], "--tp-size"),
        (["--tp-size", "1.5"], "--tp-size"),
        (["--device", "nonsense"], "--device"),
        (["--dit-cpu-offload=maybe"], "--dit-cpu-offload"),
        (["--quantization", ""], "--quantization"),
        (["--quantization-serialized"], "--quantization-serialized"),
        (["--component-cpu-offload=.vae=true"], "--component-cpu-offload"),
        (["--component-cpu-offload.-"], "--component-cpu-offload.-"),
        (
            ["--component-direct-gpu-weight-loading.__=true"],
            "--component-direct-gpu-weight-loading",
        ),
    ],
)
def test_malformed_options_are_refused_naming_the_flag(argv: list[str], flag: str) -> None:
    """The message starts with the flag (argparse's own errors with its "argument" prefix)."""
    with pytest.raises(ArgumentError) as caught:
        parse_args(argv)
    assert str(caught.value).startswith(flag)


@pytest.mark.rule("ARGS-1")
@pytest.mark.parametrize("name", ["X", "vae_", "_vae"])
def test_component_names_keep_letters_and_edge_underscores(name: str) -> None:
    """Only a name made of nothing but `-`/`_` is empty; anything else is a component."""
    args, _ = parse_args([f"--component-cpu-offload.{name}=false"])
    assert dict(args.component_cpu_offload) == {name: False}
    assert dict(ServerArgs(component_cpu_offload={name: True}).component_cpu_offload) == {
        name: True
    }


@pytest.mark.rule("ARGS-4")
@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"runtime_device": "cpu"}, "runtime_device"),
        ({"dit_cpu_offload": "true"}, "dit_cpu_offload"),
        ({"dit_layerwise_offload": None}, "dit_layerwise_offload"),
        ({"fsdp_inference": 1}, "fsdp_inference"),
        ({"direct_gpu_weight_loading": "x"}, "direct_gpu_weight_loading"),
        ({"tp_size": True}, "tp_size"),
        ({"tp_size": 2.0}, "tp_size"),
        ({"tp_size": 0}, "tp_size"),
        ({"quantization": "fp8"}, "quantization"),
        ({"component_cpu_offload": [("vae", True)]}, "component_cpu_offload"),
        ({"component_cpu_offload": {"": True}}, "--component-cpu-offload.vae"),
        (
            {"component_direct_gpu_weight_loading": {"-": True}},
            "--component-direct-gpu-weight-loading.vae",
        ),
        ({"component_cpu_offload": {"vae": "true"}}, "--component-cpu-offload.vae=true"),
        ({"component_cpu_offload": {"video-vae": True, "video_vae": False}}, "'video-vae'"),
    ],
)
def test_construction_refusals_name_the_field(fields: dict[str, object], name: str) -> None:
    with pytest.raises(ArgumentError) as caught:
        ServerArgs(**fields)  # type: ignore[arg-type]
    assert name in str(caught.value)


@pytest.mark.rule("ARGS-4")
def test_foreign_server_args_are_refused() -> None:
    with pytest.raises(ArgumentError, match=r"ServerArgs, got object; build one"):
        own_server_args(object())  # type: ignore[arg-type]
