"""After the tensors are in: buffers, weight processing, deferred CPU offload (FP8-2..6).

Post-load weight processing (online quantization) runs where the plan says, on the weights as
loaded; only then does a deferred component move to CPU. A quantized load that fails raises
`QuantizationLoadError`; nothing here ever hands back an unquantized model in its place.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from reference.errors import QuantizationLoadError
from reference.place.adopt import LinearKinds
from reference.place.modules import own_attribute
from reference.request.plan import CPU
from reference.request.quantization import QuantizationSpec

__all__ = [
    "MODELOPT_FP8_METHODS",
    "OffloadOptions",
    "offload_for_quantization",
    "offload_to_cpu",
    "process_weights",
]

# Pre-serialized ModelOpt-style FP8 checkpoints keep their own offload rule (FP8-3).
MODELOPT_FP8_METHODS = frozenset({"modelopt_fp8"})


def process_weights(
    module: nn.Module,
    *,
    quantization: QuantizationSpec | None,
    kinds: LinearKinds,
    component: str,
) -> int:
    """Run each layer's `quant_method.process_weights_after_loading` (FP8-2, FP8-5).

    Returns:
        The number of layers processed.

    Raises:
        QuantizationLoadError: quantization was requested and no layer uses a quantized method,
            or a layer's processing failed. Never falls back to the unquantized weights.
    """
    layers = [
        (name, sub, method)
        for name, sub in module.named_modules()
        if (method := own_attribute(sub, "quant_method")) is not None
    ]
    quantized = [
        name for name, _, method in layers if not isinstance(method, kinds.unquantized_method)
    ]
    if quantization is not None and not quantized:
        raise QuantizationLoadError(
            f"{component}: quantization {quantization.method!r} was requested but no layer uses a"
            " quantized method; refusing to return an unquantized model. Build the model with the"
            " quantization config applied to its linear layers"
        )
    for name, sub, method in layers:
        try:
            with torch.no_grad():
                method.process_weights_after_loading(sub)
        except Exception as exc:
            if quantization is None:
                raise
            raise QuantizationLoadError(
                f"{component}: {quantization.method} weight processing failed in layer {name!r}"
                f" ({exc}); no unquantized fallback is attempted. Fix the checkpoint or drop the"
                " quantization request"
            ) from exc
    return len(layers)


def offload_to_cpu(module: nn.Module) -> None:
    """Move every parameter and buffer to CPU, bits unchanged (FP8-2, FP8-6)."""
    module.to(CPU)


@dataclass(frozen=True)
class OffloadOptions:
    """How a component is offloaded: whole-component CPU offload, layerwise offload."""

    component_cpu_offload: bool
    layerwise_offload: bool


def offload_for_quantization(
    options: OffloadOptions, quantization: QuantizationSpec | None
) -> OffloadOptions:
    """FP8-3: the offload options a quantization leaves in force.

    Online FP8 (and MXFP4) keep component CPU offload: the plan defers it until the weights were
    processed on the device. A pre-serialized ModelOpt-style FP8 checkpoint turns component CPU
    offload off and keeps layerwise offload. Everything else is unchanged.
    """
    if quantization is not None and quantization.method.lower() in MODELOPT_FP8_METHODS:
        return dataclasses.replace(options, component_cpu_offload=False)
    return options
