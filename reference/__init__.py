"""Reference loader for diffusion-model weights (DiT transformers, VAEs), pinned by rules.

The public surface follows a load from end to end: plans (where tensors land), checkpoints
(headers, shards, a tensor-at-a-time reader), and the adapter seam the conformance suite uses.
"""

from reference.adapter import LoaderAdapter, ReferenceAdapter
from reference.checkpoint import Checkpoint, TensorInfo, TensorReader, open_checkpoint, read_header
from reference.errors import (
    CheckpointError,
    ComponentCheckpointUnsupportedError,
    LoadError,
    PlanError,
)
from reference.plan import WeightLoadPlan, resolve_checkpoint_load_device
from reference.quantization import QuantizationSpec, requires_device_weight_processing
from reference.rules import RULES, Rule

__all__ = [
    "RULES",
    "Checkpoint",
    "CheckpointError",
    "ComponentCheckpointUnsupportedError",
    "LoadError",
    "LoaderAdapter",
    "PlanError",
    "QuantizationSpec",
    "ReferenceAdapter",
    "Rule",
    "TensorInfo",
    "TensorReader",
    "WeightLoadPlan",
    "open_checkpoint",
    "read_header",
    "requires_device_weight_processing",
    "resolve_checkpoint_load_device",
]
