"""Real diffusers vocoders (`fakes.diffusers_components`), saved by diffusers' own
`save_pretrained` and named in model_index.json as real pipelines name them: the vocoder loader
builds diffusers' own class, alone and in a whole pipeline, and the module holds what diffusers'
`from_pretrained` gives (every state entry bit for bit, the same waveform); a name that is not
one of diffusers' model classes is refused before anything is read.

Needs the diffusers extra; without it these tests skip.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # read once when huggingface_hub is imported

from pathlib import Path

import pytest
import torch
from torch import nn

from fakes.diffusers_components import VOCODERS, DiffusersModel
from reference.errors import CheckpointError
from reference.load.loaders import VocoderLoader
from reference.load.pipeline import load_pipeline
from reference.request.args import ServerArgs
from reference.request.model_index import (
    diffusers_pipeline_package,
    names_diffusers_class,
    read_pipeline,
)

pytestmark = [
    pytest.mark.internal,
    # Two of these classes build with torch's older weight_norm, which warns that it is.
    pytest.mark.filterwarnings("ignore:.*torch.nn.utils.weight_norm:FutureWarning"),
]

CPU = torch.device("cpu")
ARGS = ServerArgs(runtime_device=CPU)


@pytest.fixture(autouse=True)
def diffusers_installed() -> None:
    pytest.importorskip("diffusers", reason="needs the [diffusers] extra")


def _model_class(vocoder: DiffusersModel) -> type[nn.Module]:
    try:
        cls: type[nn.Module] = vocoder.model_class()
    except (AttributeError, ImportError):
        pytest.skip(f"this diffusers has no {vocoder.class_name}")
    return cls


def _loaded(root: Path, way: str) -> nn.Module:
    if way == "alone":
        return VocoderLoader().load(read_pipeline(root).component("vocoder"), ARGS).module
    return {item.name: item.module for item in load_pipeline(root, ARGS)}["vocoder"]


@pytest.mark.parametrize("way", ["alone", "whole"])
@pytest.mark.parametrize("vocoder", VOCODERS, ids=lambda v: f"{v.library}-{v.class_name}")
def test_a_diffusers_vocoder_loads_as_from_pretrained_gives_it(
    tmp_path: Path, vocoder: DiffusersModel, way: str
) -> None:
    cls = _model_class(vocoder)
    root = vocoder.write(tmp_path)
    expected: nn.Module = cls.from_pretrained(str(root / "vocoder")).eval()  # type: ignore[attr-defined]
    module = _loaded(root, way)
    assert type(module) is cls
    assert not module.training
    state, wanted = module.state_dict(), expected.state_dict()
    assert set(state) == set(wanted)
    for name, tensor in wanted.items():
        assert state[name].dtype == tensor.dtype, name
        assert torch.equal(state[name], tensor), name
    assert torch.equal(vocoder.output(module), vocoder.output(expected))


@pytest.mark.parametrize(
    ("library", "class_name"),
    [
        ("ltx2", "LTX2Pipeline"),  # a pipeline, not a model class
        ("ltx2", "AutoencoderKLLTX2Video"),  # a model class the package imports, not defines
        ("ltx2", "os.path"),
        ("diffusers", "LTX2Vocoder"),  # not among diffusers' autoencoders
    ],
)
def test_a_name_that_is_no_diffusers_model_class_is_refused_before_reading(
    tmp_path: Path, library: str, class_name: str
) -> None:
    vocoder = VOCODERS[0]
    _model_class(vocoder)
    root = vocoder.write(tmp_path)
    index = json.loads((root / "model_index.json").read_text())
    index["vocoder"] = [library, class_name]
    (root / "model_index.json").write_text(json.dumps(index))
    spec = read_pipeline(root).component("vocoder")
    with pytest.raises(CheckpointError, match=class_name.replace(".", r"\.")):
        VocoderLoader().admit(spec, ARGS)


def test_a_library_names_a_diffusers_pipeline_package_only_where_diffusers_has_one() -> None:
    assert diffusers_pipeline_package("ltx2") == "diffusers.pipelines.ltx2"
    for library in ("diffusers", "fakes", "os", "../ltx2", "ltx2.vocoder", ""):
        assert diffusers_pipeline_package(library) is None, library
    assert names_diffusers_class("diffusers")
    assert names_diffusers_class("ltx2")
    assert not names_diffusers_class("fakes")
