"""ADM-1/3, DG-2/3/7: the reference's admission gates, their exact messages and their requests.

Other loaders are judged on the error type and the names in the message (test_adm.py,
test_args.py); the sentences (the declared list, the loader's support in words, the fix, the
joining of several problems) are the reference's own and are pinned here alone.
"""

from __future__ import annotations

import pytest
import torch

from fakes.platform import FakePlatform
from reference.errors import ArgumentError, ComponentCheckpointUnsupportedError
from reference.request.admission import (
    NO_DIRECT_SUPPORT,
    DirectRequest,
    DirectSupport,
    check_arguments,
    check_loader,
    check_pipeline,
    direct_requests,
)
from reference.request.args import ServerArgs
from reference.request.quantization import QuantizationSpec

pytestmark = pytest.mark.reference_only("pins the reference's own admission wording")

ACCEL = torch.device("cuda", 0)
DIT = "--direct-gpu-weight-loading"
PER = "--component-direct-gpu-weight-loading"
VAES = frozenset({"vae", "video_vae"})


def dit_flag(**more: object) -> ServerArgs:
    return ServerArgs(runtime_device=ACCEL, direct_gpu_weight_loading=True, **more)  # type: ignore[arg-type]


def per_component(*names: str) -> ServerArgs:
    return ServerArgs(
        runtime_device=ACCEL, component_direct_gpu_weight_loading=dict.fromkeys(names, True)
    )


def undeclared(name: str) -> str:
    return (
        f"{PER}.{name} selects component {name!r}, which model_index.json does not declare"
        " (declared: vae, text_encoder); correct the name or drop the flag"
    )


@pytest.mark.rule("ADM-1", "DG-7")
@pytest.mark.parametrize(
    ("declared", "listed"), [((), "none"), (("vae", "text_encoder"), "vae, text_encoder")]
)
def test_dit_flag_without_a_transformer(declared: tuple[str, ...], listed: str) -> None:
    with pytest.raises(ComponentCheckpointUnsupportedError) as caught:
        check_pipeline(dit_flag(), declared=declared)
    assert str(caught.value) == (
        f"{DIT} asks for the transformer components, but model_index.json declares none"
        f" (declared: {listed}); drop {DIT}"
    )


@pytest.mark.rule("ADM-1")
def test_every_undeclared_selection_is_listed_in_one_message() -> None:
    with pytest.raises(ComponentCheckpointUnsupportedError) as caught:
        check_pipeline(per_component("vocoder", "audio_vae"), declared=("vae", "text_encoder"))
    assert str(caught.value) == f"{undeclared('vocoder')}; {undeclared('audio_vae')}"


@pytest.mark.rule("ADM-3")
@pytest.mark.parametrize(
    ("support", "component", "says"),
    [
        (
            DirectSupport(components=VAES),
            "transformer",
            f"it supports {PER}.<vae|video_vae>); use {DIT} for transformer components",
        ),
        (
            DirectSupport(dit_flag=True, components=VAES),
            "audio_vae",
            f"it supports transformer components via {DIT} and {PER}.<vae|video_vae>);"
            f" drop {PER}.audio_vae",
        ),
        (NO_DIRECT_SUPPORT, "vocoder", f"it supports no direct-GPU loading); drop {PER}.vocoder"),
    ],
    ids=["transformer-by-component-flag", "unsupported-component", "no-support"],
)
def test_loader_refusal_says_what_it_supports(
    support: DirectSupport, component: str, says: str
) -> None:
    with pytest.raises(ComponentCheckpointUnsupportedError) as caught:
        check_loader(support, component, per_component(component), loader="some")
    assert str(caught.value) == (
        f"{PER}.{component}: the some loader cannot load component {component!r} directly onto"
        f" the GPU ({says}"
    )


@pytest.mark.rule("DG-3b")
@pytest.mark.parametrize(
    ("checkpoint", "source"),
    [
        (QuantizationSpec("fp8"), "its config.json declares quantization 'fp8'"),
        (None, "it is quantized with --quantization fp8"),
    ],
    ids=["config", "flag"],
)
def test_quantized_refusal_names_its_source(
    checkpoint: QuantizationSpec | None, source: str
) -> None:
    args = dit_flag(quantization=None if checkpoint else QuantizationSpec("fp8"))
    with pytest.raises(ComponentCheckpointUnsupportedError) as caught:
        check_loader(
            DirectSupport(dit_flag=True),
            "transformer",
            args,
            loader="transformer",
            checkpoint_quantization=checkpoint,
        )
    assert str(caught.value) == (
        f"{DIT}: component 'transformer' is quantized ({source}); direct-GPU loading supports"
        f" only unquantized checkpoints; drop {DIT} or load an unquantized checkpoint"
    )


@pytest.mark.rule("DG-2", "DG-7")
def test_layerwise_offload_is_named_for_each_transformer() -> None:
    with pytest.raises(ArgumentError) as caught:
        check_arguments(
            dit_flag(dit_layerwise_offload=True),
            platform=FakePlatform(),
            declared=("transformer", "transformer_2"),
        )
    assert str(caught.value) == "; ".join(
        f"{DIT}: component {name!r} is offloaded (--dit-layerwise-offload), and direct-GPU"
        f" loading needs it resident on the runtime device; drop --dit-layerwise-offload or"
        f" drop {DIT}"
        for name in ("transformer", "transformer_2")
    )


@pytest.mark.rule("DG-2")
def test_tp_size_refusal_names_the_size() -> None:
    with pytest.raises(ArgumentError) as caught:
        check_arguments(dit_flag(tp_size=2), platform=FakePlatform())
    assert str(caught.value) == (
        f"{DIT}: component 'transformer' runs with --tp-size 2, and direct-GPU loading needs"
        f" --tp-size 1; set --tp-size 1 or drop {DIT}"
    )


@pytest.mark.rule("DG-7")
def test_dit_flag_without_declared_transformers_asks_for_transformer() -> None:
    assert direct_requests(dit_flag(), ("vae",)) == (DirectRequest("transformer", DIT),)
