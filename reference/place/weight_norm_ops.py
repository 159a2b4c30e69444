"""Weight normalisation's two ops, answered by their shape arithmetic during a build.

`torch.nn.utils.parametrizations.weight_norm` (and the older hook-based
`torch.nn.utils.weight_norm`) runs `torch.norm_except_dim` on the weight it wraps, and
`torch._weight_norm` whenever the weight is read. On `meta` tensors torch answers both through
its Python references, whose first run in a process imports `torch._dynamo`: measured on
2026-12-07 (torch 2.13, 2 cores), a first meta build of one `weight_norm(nn.Conv1d(4, 8, 3))`
took 1.3-2.0 s and about 45 MiB, where with these answers it takes 4 ms. A meta build of a
vocoder or a VAE with weight-normalised layers (HiFi-GAN, Oobleck) would pay that once per
process, in a load's checks; so would the construction guard's size of the same ops on CPU
tensors (`reference.place.op_sizes`), which otherwise runs them on meta.

Each answer follows aten's own steps (`WeightNorm.cpp`) on empty meta tensors, so its shape,
strides and dtype are those torch gives; an argument it does not cover (another dtype, an
integer weight, a scalar) is answered None, and torch runs the op itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["META_ANSWERS", "SIZES"]

Args = tuple[Any, ...]
Kwargs = Mapping[str, Any]
Request = tuple[int, tuple[int, ...]]
"""Bytes a call would allocate on the host, and the shape of its largest new tensor."""


def _argument(args: Args, kwargs: Kwargs, index: int, name: str, default: Any = None) -> Any:
    return args[index] if len(args) > index else kwargs.get(name, default)


def _norm_except_dim_args(args: Args, kwargs: Kwargs) -> tuple[torch.Tensor, int] | None:
    """`norm_except_dim(v, pow=2, dim=0)`'s weight and dim, where this module answers it."""
    v, dim = _argument(args, kwargs, 0, "v"), _argument(args, kwargs, 2, "dim", 0)
    if not isinstance(v, torch.Tensor) or not v.is_floating_point() or type(dim) is not int:
        return None
    if dim != -1 and not -v.dim() <= dim < v.dim():
        return None
    return v, dim


def _weight_norm_args(args: Args, kwargs: Kwargs) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`_weight_norm(v, g, dim=0)`'s two tensors, where this module answers it (one floating
    dtype: torch's fused kernel and its pointwise path then agree on it)."""
    v, g = _argument(args, kwargs, 0, "v"), _argument(args, kwargs, 1, "g")
    if not isinstance(v, torch.Tensor) or not isinstance(g, torch.Tensor):
        return None
    if not v.is_floating_point() or v.dtype != g.dtype:
        return None
    return v, g


def _norm(v: torch.Tensor, dim: int) -> torch.Tensor:
    """aten's `norm_except_dim` on meta, for its shape and strides: a vector of the kept
    dimension viewed in place, through a transpose for a dimension between the ends."""
    if dim == -1:
        return torch.empty((), dtype=v.dtype, device="meta")
    if dim in (0, v.dim() - 1):
        shape = [1] * v.dim()
        shape[dim] = v.shape[dim]
        return torch.empty(v.shape[dim], dtype=v.dtype, device="meta").view(shape)
    return _norm(v.transpose(0, dim), 0).transpose(0, dim)


def _requires_grad(*inputs: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in inputs)


def _norm_on_meta(args: Args, kwargs: Kwargs) -> torch.Tensor | None:
    found = _norm_except_dim_args(args, kwargs)
    if found is None:
        return None
    v, dim = found
    if not v.is_meta:
        return None
    shaped = _norm(v, dim)
    return torch.empty_strided(
        shaped.shape,
        shaped.stride(),
        dtype=v.dtype,
        device="meta",
        requires_grad=_requires_grad(v),
    )


def _weight_norm_on_meta(args: Args, kwargs: Kwargs) -> torch.Tensor | None:
    found = _weight_norm_args(args, kwargs)
    if found is None:
        return None
    v, g = found
    if not (v.is_meta and g.is_meta):
        return None
    return torch.empty(v.shape, dtype=v.dtype, device="meta", requires_grad=_requires_grad(v, g))


META_ANSWERS: dict[str, Callable[[Args, Kwargs], torch.Tensor | None]] = {
    "norm_except_dim": _norm_on_meta,
    "_weight_norm": _weight_norm_on_meta,
}
"""Each op's result where its inputs are on meta, by torch's name for it; None: not answered
here (inputs elsewhere, or arguments it does not cover)."""


def _norm_request(args: Args, kwargs: Kwargs, tensors: list[torch.Tensor]) -> Request | None:
    found = _norm_except_dim_args(args, kwargs)
    if found is None:
        return None
    v, dim = found
    shape = tuple(_norm(v.to("meta"), dim).shape)
    return math.prod(shape) * v.dtype.itemsize, shape


def _weight_norm_request(args: Args, kwargs: Kwargs, tensors: list[torch.Tensor]) -> Request | None:
    found = _weight_norm_args(args, kwargs)
    if found is None:
        return None
    v, _ = found
    return v.numel() * v.dtype.itemsize, tuple(v.shape)


SIZES: dict[str, Callable[[Args, Kwargs, list[torch.Tensor]], Request | None]] = {
    "norm_except_dim": _norm_request,
    "_weight_norm": _weight_norm_request,
}
"""Each op's new host bytes and shape on CPU inputs (the guard's `Sizer`); None: meta decides."""
