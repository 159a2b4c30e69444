"""Checkpoint names read as transformers reads them (`transformers_models.checkpoint_renames`,
`reference.place.ties.renamed`): the names transformers 5 renames on load are renamed, a layout
it converts is refused before any tensor data is read, and a checkpoint holding a name and its
renamed twin is refused naming both.

Needs transformers; without it these tests skip.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # read once when huggingface_hub is imported

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from fakes import text_encoders
from reference.errors import ComponentCheckpointUnsupportedError, StateMismatchError
from reference.kit.judging.evidence import DataReads, data_bytes, safetensors_files
from reference.load.loaders import EncoderLoader
from reference.place.transformers_models import checkpoint_renames
from reference.request.args import ServerArgs
from reference.request.model_index import read_pipeline

pytestmark = pytest.mark.internal

ARGS = ServerArgs(runtime_device=torch.device("cpu"))


@pytest.fixture(scope="module")
def transformers() -> ModuleType:
    module = pytest.importorskip("transformers")
    pytest.importorskip("transformers.conversion_mapping", reason="transformers 4 renames nothing")
    return module


def _written(root: Path, model: Any) -> Path:
    model.save_pretrained(str(root / "text_encoder"))
    index = {"_class_name": "P", "text_encoder": ["transformers", type(model).__name__]}
    (root / "model_index.json").write_text(json.dumps(index))
    return root


def test_gemma3_is_written_under_its_former_layout_and_renamed_on_load(
    transformers: ModuleType,
) -> None:
    model = text_encoders.build("Gemma3ForConditionalGeneration")
    written = [
        "language_model.model.embed_tokens.weight",
        "vision_tower.vision_model.post_layernorm.weight",
        "multi_modal_projector.mm_input_projection_weight",
    ]
    renames = checkpoint_renames(model, written, component="text_encoder")
    assert set(renames) == set(written)
    assert renames[written[0]] == "model.language_model.embed_tokens.weight"
    assert set(renames.values()) <= set(model.state_dict())
    assert checkpoint_renames(model, renames.values(), component="text_encoder") == {}


def test_a_layout_transformers_converts_is_refused_before_any_tensor_is_read(
    transformers: ModuleType, tmp_path: Path
) -> None:
    """Mixtral's experts are written one tensor per expert and merged on load: a conversion,
    not a rename, which the encoder loader does not implement."""
    config = transformers.MixtralConfig(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=2,
        num_experts_per_tok=1,
    )
    root = _written(tmp_path, transformers.MixtralModel(config))
    spec = read_pipeline(root).component("text_encoder")
    EncoderLoader().admit(spec, ARGS)  # the class itself is admitted
    with pytest.raises(ComponentCheckpointUnsupportedError, match="experts"):
        EncoderLoader().load(spec, ARGS)  # once unmeasured: its first run imports modules
    with DataReads() as seen, pytest.raises(ComponentCheckpointUnsupportedError, match="experts"):
        EncoderLoader().load(spec, ARGS)
    seen.assert_no_data_read(data_bytes(*safetensors_files(root)))


def test_a_name_and_its_renamed_twin_in_one_checkpoint_are_refused_naming_both(
    transformers: ModuleType, tmp_path: Path
) -> None:
    root = _written(tmp_path, text_encoders.build("Gemma3ForConditionalGeneration"))
    path = root / "text_encoder" / "model.safetensors"
    tensors = load_file(str(path))
    old = "language_model.model.embed_tokens.weight"
    tensors["model.language_model.embed_tokens.weight"] = tensors[old].clone()
    save_file(tensors, str(path))
    with pytest.raises(StateMismatchError, match=r"embed_tokens.*embed_tokens"):
        EncoderLoader().load(read_pipeline(root).component("text_encoder"), ARGS)
