"""Quantization, described in neutral terms.

A loader under test receives a `QuantizationSpec` (method name, whether the checkpoint is already
stored in that format, whether the method loads on CPU) and builds its own config objects from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from reference.errors import ArgumentError

__all__ = [
    "CPU_LOAD_METHODS",
    "ONLINE_DEVICE_METHODS",
    "QuantizationSpec",
    "requires_device_weight_processing",
]

# Methods whose *online* form (checkpoint not yet in that format) rewrites weights after loading,
# with kernels that need the weights on the runtime device.
ONLINE_DEVICE_METHODS = frozenset({"fp8", "mxfp4"})
# Methods whose quantized weights are usable where they were read, so an offloaded component
# may load them straight onto CPU (upstream: GGUF's `quantized_cpu_load_supported`).
CPU_LOAD_METHODS = frozenset({"gguf"})


@dataclass(frozen=True)
class QuantizationSpec:
    """How a component is quantized.

    Attributes:
        method: the method's name as users spell it (`fp8`, `mxfp4`, `modelopt_fp8`, ...).
        serialized: True when the checkpoint already stores weights in that format.
        cpu_load_supported: the method's declaration that its quantized weights may be loaded
            on CPU (DEV-2); None means the method's own default (True for `CPU_LOAD_METHODS`).
    """

    method: str
    serialized: bool = False
    cpu_load_supported: bool | None = None

    def __post_init__(self) -> None:
        if not self.method:
            raise ArgumentError(
                "QuantizationSpec.method must be a non-empty method name, e.g. 'fp8'"
            )
        if self.cpu_load_supported is not None and type(self.cpu_load_supported) is not bool:
            raise ArgumentError(
                "QuantizationSpec.cpu_load_supported must be True, False or None (the method's"
                f" default), got {self.cpu_load_supported!r}"
            )

    @property
    def loads_on_cpu(self) -> bool:
        """DEV-2: whether the method declares that its quantized weights load on CPU."""
        if self.cpu_load_supported is not None:
            return self.cpu_load_supported
        return self.method.lower() in CPU_LOAD_METHODS


def requires_device_weight_processing(quantization: QuantizationSpec | None) -> bool:
    """FP8-1: whether loaded weights must be post-processed on the runtime device.

    Online `fp8` and `mxfp4` (checkpoint not serialized in that format) need it. Serialized
    checkpoints, unknown methods and no quantization do not.
    """
    if quantization is None or quantization.serialized:
        return False
    return quantization.method.lower() in ONLINE_DEVICE_METHODS
