"""Reference loader for diffusion-model weights (DiT transformers, VAEs), pinned by rules.

The entry points, in the order a load runs: `parse_args` (the serving flags) ->
`load_pipeline` (admission, then one component loader per component) -> `load_dit` /
`load_vae` (one component) -> a `LoadReport` per component, whose `WeightLoadPlan` says where
tensors landed. Every refusal is a `LoadError`. The conformance kit that judges loaders lives
in `reference.kit`; this package never imports it.
"""

from reference.errors import (
    ArgumentError,
    CheckpointError,
    ComponentCheckpointUnsupportedError,
    ComponentLoadError,
    DeviceMemoryError,
    HostMemoryError,
    LoadError,
    PlanError,
    QuantizationLoadError,
    StateDictABIError,
    StateMismatchError,
)
from reference.load.dit import load_dit
from reference.load.pipeline import load_pipeline
from reference.load.vae import load_vae
from reference.place.adopt import LinearKinds
from reference.place.records import TensorRecord
from reference.report.summary import LoadReport
from reference.request.args import ServerArgs, parse_args
from reference.request.plan import WeightLoadPlan
from reference.request.quantization import QuantizationSpec

__all__ = [
    "ArgumentError",
    "CheckpointError",
    "ComponentCheckpointUnsupportedError",
    "ComponentLoadError",
    "DeviceMemoryError",
    "HostMemoryError",
    "LinearKinds",
    "LoadError",
    "LoadReport",
    "PlanError",
    "QuantizationLoadError",
    "QuantizationSpec",
    "ServerArgs",
    "StateDictABIError",
    "StateMismatchError",
    "TensorRecord",
    "WeightLoadPlan",
    "load_dit",
    "load_pipeline",
    "load_vae",
    "parse_args",
]
