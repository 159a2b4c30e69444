"""Reference loader for diffusion-model weights (DiT transformers, VAEs), pinned by rules.

The public surface follows a load from end to end: arguments and admission, the pipeline and its
component loaders, plans (where tensors land), checkpoints (headers, shards, a tensor-at-a-time
reader), zero-copy adoption and per-tensor streaming, post-load processing, and the load report;
plus the adapter seam the conformance suite uses.
"""

from reference.admission import admit
from reference.adopt import LinearKinds, Verdict, load_full_state, zero_copy_verdict
from reference.args import ServerArgs, parse_args
from reference.checkpoint import Checkpoint, TensorInfo, TensorReader, open_checkpoint, read_header
from reference.dit import load_dit
from reference.errors import (
    ArgumentError,
    CheckpointError,
    ComponentCheckpointUnsupportedError,
    DeviceMemoryError,
    LoadError,
    PlanError,
    QuantizationLoadError,
    StateDictABIError,
    StateMismatchError,
)
from reference.kit.reference_adapter import ReferenceAdapter
from reference.kit.seam import LoaderAdapter
from reference.load import load_pipeline
from reference.loaders import ComponentLoader
from reference.pipeline import MODELS, read_pipeline
from reference.plan import WeightLoadPlan, resolve_checkpoint_load_device
from reference.postload import OffloadOptions, offload_for_quantization
from reference.preflight import check_device_memory
from reference.quantization import QuantizationSpec, requires_device_weight_processing
from reference.report import LoadReport, TensorRecord
from reference.rules import RULES, Rule
from reference.slots import state_slots
from reference.vae import load_vae

__all__ = [
    "MODELS",
    "RULES",
    "ArgumentError",
    "Checkpoint",
    "CheckpointError",
    "ComponentCheckpointUnsupportedError",
    "ComponentLoader",
    "DeviceMemoryError",
    "LinearKinds",
    "LoadError",
    "LoadReport",
    "LoaderAdapter",
    "OffloadOptions",
    "PlanError",
    "QuantizationLoadError",
    "QuantizationSpec",
    "ReferenceAdapter",
    "Rule",
    "ServerArgs",
    "StateDictABIError",
    "StateMismatchError",
    "TensorInfo",
    "TensorReader",
    "TensorRecord",
    "Verdict",
    "WeightLoadPlan",
    "admit",
    "check_device_memory",
    "load_dit",
    "load_full_state",
    "load_pipeline",
    "load_vae",
    "offload_for_quantization",
    "open_checkpoint",
    "parse_args",
    "read_header",
    "read_pipeline",
    "requires_device_weight_processing",
    "resolve_checkpoint_load_device",
    "state_slots",
    "zero_copy_verdict",
]
