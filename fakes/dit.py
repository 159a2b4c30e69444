"""A tiny DiT built from the fake parallel linears, and checkpoint writers for it.

Besides the linears it has parameters without `weight_loader` (norms, a time embedding), one
parameter with a plain-function loader (`pos_embed`) and a persistent buffer (`time_scale`, in the
checkpoint). It computes its rotary frequencies when called: a buffer computed in `__init__` is
what ZC-15 judges, so only that rule's own fixture, `RotaryDiT`, carries one (SPEC, "One defect,
its rules only").

`PlainDiT` is made of plain torch layers only (linear, conv, norm, embedding), as every diffusers
model is: none of its parameters carries a `weight_loader` (ZC-2b).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fakes.checkpoints import write_checkpoint
from fakes.layers import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    default_weight_loader,
)
from fakes.quant import quant_method_factory, quantize_fp8
from reference.request.quantization import QuantizationSpec

__all__ = [
    "DefaultDtypeDiT",
    "DiTBlock",
    "DiTConfig",
    "FollowingRotary",
    "HookedRotaryDiT",
    "PlainDiT",
    "RotaryDiT",
    "TinyDiT",
    "dit_state",
    "random_state",
    "rotary_freqs",
    "write_dit_checkpoint",
    "write_plain_dit_checkpoint",
]


@dataclass(frozen=True)
class DiTConfig:
    """Sizes of the tiny DiT (hidden must be a multiple of 32 for MXFP4 blocks)."""

    in_channels: int = 8
    hidden: int = 32
    heads: int = 2
    mlp_ratio: int = 2
    depth: int = 2
    num_steps: int = 16
    params_dtype: torch.dtype = torch.float32


def rotary_freqs(hidden: int, device: torch.device | None = None) -> torch.Tensor:
    """The frequencies the DiT computes at construction (its non-persistent buffer)."""
    exponents = torch.arange(0, hidden, 2, dtype=torch.float32, device=device) / hidden
    return 1.0 / (10000.0**exponents)


class DiTBlock(nn.Module):
    """Attention (fused QKV, column-parallel; row-parallel out) and an MLP, with TP sharding."""

    def __init__(
        self,
        config: DiTConfig,
        *,
        quantization: QuantizationSpec | None,
        tp_rank: int,
        tp_size: int,
    ) -> None:
        super().__init__()
        h, dtype = config.hidden, config.params_dtype
        method = quant_method_factory(quantization)

        def column(output: int) -> ColumnParallelLinear:
            return ColumnParallelLinear(
                h,
                output,
                params_dtype=dtype,
                quant_method=method(),
                tp_rank=tp_rank,
                tp_size=tp_size,
            )

        def row(input_size: int) -> RowParallelLinear:
            return RowParallelLinear(
                input_size,
                h,
                params_dtype=dtype,
                quant_method=method(),
                tp_rank=tp_rank,
                tp_size=tp_size,
            )

        self.heads = config.heads // tp_size
        self.norm1 = nn.LayerNorm(h, dtype=dtype)
        self.qkv = MergedColumnParallelLinear(
            h,
            [h, h, h],
            params_dtype=dtype,
            quant_method=method(),
            tp_rank=tp_rank,
            tp_size=tp_size,
        )
        self.proj = row(h)
        self.norm2 = nn.LayerNorm(h, dtype=dtype)
        self.mlp_up = column(config.mlp_ratio * h)
        self.mlp_down = row(config.mlp_ratio * h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(batch, tokens, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, tokens, -1)
        x = x + self.proj(attn)
        out: torch.Tensor = x + self.mlp_down(F.gelu(self.mlp_up(self.norm2(x))))
        return out


class TinyDiT(nn.Module):
    """A small diffusion transformer: patch embed, time embed, blocks, final norm, head."""

    time_scale: torch.Tensor

    def __init__(
        self,
        config: DiTConfig | None = None,
        *,
        quantization: QuantizationSpec | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        super().__init__()
        config = config or DiTConfig()
        self.config = config
        h, dtype = config.hidden, config.params_dtype
        self.patch_embed = ReplicatedLinear(config.in_channels, h, params_dtype=dtype)
        self.time_embed = nn.Embedding(config.num_steps, h, dtype=dtype)
        self.register_buffer("time_scale", torch.ones(config.num_steps, dtype=dtype))  # persistent
        self.pos_embed = nn.Parameter(torch.zeros(1, h, dtype=dtype))
        self.pos_embed.weight_loader = default_weight_loader  # type: ignore[attr-defined]
        self.blocks = nn.ModuleList(
            DiTBlock(config, quantization=quantization, tp_rank=tp_rank, tp_size=tp_size)
            for _ in range(config.depth)
        )
        self.final_norm = nn.LayerNorm(h, dtype=dtype)
        self.head = ReplicatedLinear(h, config.in_channels, params_dtype=dtype)

    def rotary(self, device: torch.device) -> torch.Tensor:
        """The rotary frequencies, computed on CPU as construction would, moved to `device`."""
        return rotary_freqs(self.config.hidden).to(device)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        tokens = x.shape[1]
        phase = torch.arange(tokens, device=x.device, dtype=torch.float32)[:, None]
        phase = phase * self.rotary(x.device)
        position = torch.cat([phase.sin(), phase.cos()], dim=-1).to(x.dtype)
        time = self.time_embed(t) * self.time_scale[t, None]
        h = self.patch_embed(x) + self.pos_embed + position + time[:, None]
        for block in self.blocks:
            h = block(h)
        out: torch.Tensor = self.head(self.final_norm(h))
        return out


class DefaultDtypeDiT(TinyDiT):
    """The tiny DiT built in torch's default dtype at construction, as a real model class is
    (diffusers' and transformers' classes take no dtype: they build in the default one), so a
    loader that builds under the precision's default dtype gets the precision, as one that
    casts after the build does. `TinyDiT` itself builds in `DiTConfig.params_dtype` (fp32)."""

    def __init__(self, config: DiTConfig | None = None, **options: object) -> None:
        config = replace(config or DiTConfig(), params_dtype=torch.get_default_dtype())
        super().__init__(config, **options)  # type: ignore[arg-type]


class RotaryDiT(TinyDiT):
    """ZC-15's fixture: the rotary frequencies computed in `__init__`, a non-persistent buffer
    (no checkpoint holds it), as diffusers' DiTs build their rotary tables."""

    freqs: torch.Tensor

    def __init__(self, config: DiTConfig | None = None, **options: object) -> None:
        super().__init__(config, **options)  # type: ignore[arg-type]
        self.register_buffer("freqs", rotary_freqs(self.config.hidden), persistent=False)

    def rotary(self, device: torch.device) -> torch.Tensor:
        return self.freqs.to(device)


class FollowingRotary(nn.Module):
    """Rotary frequencies computed on the device of a parameter its owner passes, as code that
    follows the module's device does: under a meta build they are on meta, whatever the build
    does with buffers. `rebuild_buffers(device)` recomputes them after a meta build."""

    freqs: torch.Tensor

    def __init__(self, hidden: int, device: torch.device) -> None:
        super().__init__()
        self.hidden = hidden
        self.register_buffer("freqs", rotary_freqs(hidden, device), persistent=False)

    def rebuild_buffers(self, device: torch.device) -> None:
        # Computed on CPU, as construction does, so the values match an ordinary build.
        self.freqs = rotary_freqs(self.hidden).to(device)


class HookedRotaryDiT(TinyDiT):
    """VAE-9 on the DiT path: each block holds a `FollowingRotary` (on meta after a meta
    build, its hook two levels below the root's children: `blocks.<i>.rotary`)."""

    def __init__(self, config: DiTConfig | None = None, **options: object) -> None:
        super().__init__(config, **options)  # type: ignore[arg-type]
        for block in self.blocks:
            device = block.get_parameter("norm1.weight").device
            block.rotary = FollowingRotary(self.config.hidden, device)


class PlainDiT(nn.Module):
    """A DiT of plain torch layers: patch conv, time embedding, norm, linears, and a persistent
    buffer. No parameter has `weight_loader`; every one starts with requires_grad=True."""

    time_scale: torch.Tensor

    def __init__(self, config: DiTConfig | None = None) -> None:
        super().__init__()
        config = config or DiTConfig()
        h, dtype = config.hidden, config.params_dtype
        self.patch_embed = nn.Conv2d(config.in_channels, h, kernel_size=2, stride=2, dtype=dtype)
        self.time_embed = nn.Embedding(config.num_steps, h, dtype=dtype)
        self.register_buffer("time_scale", torch.ones(config.num_steps, dtype=dtype))
        self.norm = nn.LayerNorm(h, dtype=dtype)
        self.mlp_up = nn.Linear(h, config.mlp_ratio * h, dtype=dtype)
        self.mlp_down = nn.Linear(config.mlp_ratio * h, h, dtype=dtype)
        self.head = nn.Linear(h, config.in_channels, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)  # (batch, patches, hidden)
        h = tokens + (self.time_embed(t) * self.time_scale[t, None])[:, None]
        h = h + self.mlp_down(F.gelu(self.mlp_up(self.norm(h))))
        out: torch.Tensor = self.head(h)
        return out


def random_state(
    model: nn.Module, *, dtype: torch.dtype | None = None, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Random values for every state entry of `model` (built on `meta`), in `dtype` if given."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: (torch.randn(slot.shape, generator=generator) / math.sqrt(slot.shape[-1])).to(
            dtype or slot.dtype
        )
        for name, slot in model.state_dict().items()
    }


def write_plain_dit_checkpoint(
    folder: Path,
    *,
    config: DiTConfig | None = None,
    dtype: torch.dtype | None = None,
    shards: int = 1,
    seed: int = 0,
) -> tuple[Path, Mapping[str, torch.Tensor]]:
    """Write a `PlainDiT` checkpoint (single file, or shards + index), values in `dtype`.

    Returns:
        The path to hand a loader, and the state that was written.
    """
    with torch.device("meta"):
        model = PlainDiT(config)
    state = random_state(model, dtype=dtype, seed=seed)
    return write_checkpoint(state, folder, shards=shards), state


def dit_state(
    config: DiTConfig | None = None,
    *,
    dtype: torch.dtype | None = None,
    quantization: QuantizationSpec | None = None,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """A full (TP=1) checkpoint state for `TinyDiT(config, quantization=...)`, random values.

    Args:
        dtype: the dtype of floating tensors (default: the config's), except FP8 weights.
        quantization: a serialized FP8 spec writes block weights in FP8 with `weight_scale`.
    """
    config = config or DiTConfig()
    with torch.device("meta"):
        model = TinyDiT(config, quantization=quantization)
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, slot in model.state_dict().items():
        values = torch.randn(slot.shape, generator=generator) / math.sqrt(slot.shape[-1])
        if name.endswith("weight_scale"):
            continue
        if slot.dtype == torch.float8_e4m3fn:
            state[name], state[name + "_scale"] = quantize_fp8(values)
        else:
            state[name] = values.to(dtype or slot.dtype)
    return state


def write_dit_checkpoint(
    folder: Path,
    *,
    config: DiTConfig | None = None,
    dtype: torch.dtype | None = None,
    quantization: QuantizationSpec | None = None,
    shards: int = 1,
    seed: int = 0,
) -> tuple[Path, Mapping[str, torch.Tensor]]:
    """Write a TinyDiT checkpoint (single file, or shards + `model.safetensors.index.json`).

    Returns:
        The path to hand a loader, and the state that was written.
    """
    state = dit_state(config, dtype=dtype, quantization=quantization, seed=seed)
    return write_checkpoint(state, folder, shards=shards), state
