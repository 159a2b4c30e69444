"""Quant methods for the fake linear layers: unquantized, online FP8, serialized FP8, online MXFP4.

As in a serving stack, a layer's quant method creates the layer's weight parameters (attaching
`weight_loader`, `input_dim` and `output_dim`), computes its matmul, and may rewrite the weights
after loading. The online methods quantize in `process_weights_after_loading` and record the device
each run saw in `runs`, so a test can check where processing ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from reference.request.quantization import QuantizationSpec

__all__ = [
    "E8M0_BIAS",
    "FP4_MAX",
    "FP4_VALUES",
    "FP8",
    "FP8_MAX",
    "LinearMethod",
    "OnlineFp8LinearMethod",
    "OnlineMxfp4LinearMethod",
    "SerializedFp8LinearMethod",
    "UnquantizedLinearMethod",
    "dequantize_mxfp4",
    "quant_method_factory",
    "quantize_fp8",
    "quantize_mxfp4",
    "set_weight_attrs",
]

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
# The magnitudes an FP4 E2M1 element can hold; the code of a magnitude is its index (+8 if < 0).
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4_MAX = 6.0
E8M0_BIAS = 127


def set_weight_attrs(param: torch.Tensor, attrs: dict[str, Any]) -> None:
    """Attach loading attributes (`weight_loader`, `input_dim`, ...) to a parameter instance."""
    for key, value in attrs.items():
        setattr(param, key, value)


class LinearMethod:
    """Base quant method: full-precision weights, nothing to do after loading."""

    def __init__(self) -> None:
        self.runs: list[torch.device] = []

    def create_weights(
        self, layer: nn.Module, *, input_size: int, output_size: int, params_dtype: torch.dtype
    ) -> None:
        weight = nn.Parameter(
            torch.empty(output_size, input_size, dtype=params_dtype), requires_grad=False
        )
        layer.register_parameter("weight", weight)
        set_weight_attrs(
            weight, {"input_dim": 1, "output_dim": 0, "weight_loader": layer.weight_loader}
        )

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        return None

    def dequantized_weight(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        return layer.get_parameter("weight").to(dtype)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, self.dequantized_weight(layer, x.dtype), bias)


class UnquantizedLinearMethod(LinearMethod):
    """The serving stack's unquantized method: the only one whose weights may be adopted."""


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor FP8 E4M3: (weight / scale) in float8 and the float32 scale, shape (1,)."""
    amax = weight.detach().abs().max().float().clamp(min=1e-12)
    scale = (amax / FP8_MAX).reshape(1)
    quantized = (weight.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return quantized, scale


class OnlineFp8LinearMethod(LinearMethod):
    """Online FP8: loads full-precision weights, quantizes them on the device after loading."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        weight = layer.get_parameter("weight").detach()
        self.runs.append(weight.device)
        if not bool(torch.isfinite(weight).all()):
            raise ValueError(
                f"fp8: weight of shape {tuple(weight.shape)} holds non-finite values;"
                " it cannot be quantized"
            )
        quantized, scale = quantize_fp8(weight)
        layer.weight = nn.Parameter(quantized, requires_grad=False)
        layer.weight_scale = nn.Parameter(scale, requires_grad=False)

    def dequantized_weight(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        if layer.get_parameter("weight").dtype != FP8:
            return layer.get_parameter("weight").to(dtype)
        return (layer.get_parameter("weight").float() * layer.get_parameter("weight_scale")).to(
            dtype
        )


class SerializedFp8LinearMethod(OnlineFp8LinearMethod):
    """A checkpoint already in FP8 (weight + per-tensor `weight_scale`): nothing to process."""

    def create_weights(
        self, layer: nn.Module, *, input_size: int, output_size: int, params_dtype: torch.dtype
    ) -> None:
        super().create_weights(
            layer, input_size=input_size, output_size=output_size, params_dtype=FP8
        )
        scale = nn.Parameter(torch.empty(1, dtype=torch.float32), requires_grad=False)
        layer.register_parameter("weight_scale", scale)
        set_weight_attrs(scale, {"weight_loader": layer.weight_loader})

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        return None


def quantize_mxfp4(weight: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 along the input dim: packed E2M1 codes (2 per byte) and E8M0 block scales (uint8)."""
    rows, cols = weight.shape
    blocks = weight.detach().float().reshape(rows, cols // block, block)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    # The smallest power of two that brings the block's largest magnitude within FP4's 6.0.
    exponent = torch.ceil(torch.log2(amax.clamp(min=2.0**-126) / FP4_MAX)).clamp(-127, 127)
    scaled = blocks / torch.exp2(exponent)
    values = torch.tensor(FP4_VALUES, device=weight.device)
    index = (scaled.abs().clamp(max=FP4_MAX).unsqueeze(-1) - values).abs().argmin(dim=-1)
    codes = (index + 8 * (scaled < 0)).to(torch.uint8).reshape(rows, cols)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    scales = (exponent.squeeze(-1) + E8M0_BIAS).to(torch.uint8)
    return packed, scales


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    """The float32 weight that `quantize_mxfp4` encoded."""
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1).long()
    values = torch.tensor(FP4_VALUES, device=packed.device)
    magnitude = values[codes & 7]
    signed = torch.where(codes >= 8, -magnitude, magnitude)
    exponent = scales.float() - E8M0_BIAS
    return signed * torch.exp2(exponent).repeat_interleave(block, dim=1)


class OnlineMxfp4LinearMethod(LinearMethod):
    """Online MXFP4: loads full-precision weights, packs them into FP4 blocks after loading."""

    def __init__(self, block: int = 32) -> None:
        super().__init__()
        self.block = block

    def create_weights(
        self, layer: nn.Module, *, input_size: int, output_size: int, params_dtype: torch.dtype
    ) -> None:
        if input_size % self.block:
            raise ValueError(
                f"mxfp4: input size {input_size} is not a multiple of the block size {self.block}"
            )
        super().create_weights(
            layer, input_size=input_size, output_size=output_size, params_dtype=params_dtype
        )

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        weight = layer.get_parameter("weight").detach()
        self.runs.append(weight.device)
        packed, scales = quantize_mxfp4(weight, self.block)
        layer.weight = nn.Parameter(packed, requires_grad=False)
        layer.weight_scale = nn.Parameter(scales, requires_grad=False)

    def dequantized_weight(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        if layer.get_parameter("weight").dtype != torch.uint8:
            return layer.get_parameter("weight").to(dtype)
        return dequantize_mxfp4(
            layer.get_parameter("weight"), layer.get_parameter("weight_scale"), self.block
        ).to(dtype)


def quant_method_factory(quantization: QuantizationSpec | None) -> Callable[[], LinearMethod]:
    """The method class the fake layers use for `quantization` (a fresh instance per layer).

    Raises:
        ValueError: for a method the fakes do not model.
    """
    if quantization is None:
        return UnquantizedLinearMethod
    method = quantization.method.lower()
    if method == "fp8" and not quantization.serialized:
        return OnlineFp8LinearMethod
    if method in ("fp8", "modelopt_fp8"):
        return SerializedFp8LinearMethod
    if method == "mxfp4" and not quantization.serialized:
        return OnlineMxfp4LinearMethod
    raise ValueError(f"fakes: no quant method models {quantization}")
