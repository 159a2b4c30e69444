"""Quantization, described in neutral terms.

A loader under test receives a `QuantizationSpec` (method name + whether the checkpoint is already
stored in that format) and builds its own config objects from it.
"""

from __future__ import annotations

from dataclasses import dataclass

# Methods whose *online* form (checkpoint not yet in that format) rewrites weights after loading,
# with kernels that need the weights on the runtime device.
ONLINE_DEVICE_METHODS = frozenset({"fp8", "mxfp4"})


@dataclass(frozen=True)
class QuantizationSpec:
    """How a component is quantized.

    Attributes:
        method: the method's name as users spell it (`fp8`, `mxfp4`, `modelopt_fp8`, ...).
        serialized: True when the checkpoint already stores weights in that format.
    """

    method: str
    serialized: bool = False

    def __post_init__(self) -> None:
        if not self.method:
            raise ValueError("QuantizationSpec.method must be a non-empty method name, e.g. 'fp8'")


def requires_device_weight_processing(quantization: QuantizationSpec | None) -> bool:
    """FP8-1: whether loaded weights must be post-processed on the runtime device.

    Online `fp8` and `mxfp4` (checkpoint not serialized in that format) need it. Serialized
    checkpoints, unknown methods and no quantization do not.
    """
    if quantization is None or quantization.serialized:
        return False
    return quantization.method.lower() in ONLINE_DEVICE_METHODS
