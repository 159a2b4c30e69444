"""Precision: the dtype each component computes in, and the modules kept in fp32 (PREC-1..3).

Serving builds a DiT in `--dit-precision` (default bf16) and a VAE in `--vae-precision` (default
fp32), with an exact override per component (`--component-precisions.<component>`). A component
is constructed on meta and its slots (parameters and persistent buffers) are given that dtype
before any tensor is read, so a checkpoint tensor already in it is adopted (ZC-8) and any other
is converted once, into a fresh tensor of the slot's dtype (PREC-4). Modules the class keeps in
fp32 (diffusers' `_keep_in_fp32_modules`, matched as `from_pretrained(torch_dtype=...)` matches
them: a name among the dotted parts of the slot's key) stay fp32; integer and float8 slots keep
their dtype (PREC-2). Non-persistent buffers are not slots: they keep what construction gave
them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

import torch
from torch import nn

from reference.errors import ArgumentError

__all__ = [
    "COMPONENT_PRECISIONS_FLAG",
    "DEFAULT_DIT_PRECISION",
    "DEFAULT_VAE_PRECISION",
    "DIT_PRECISION_FLAG",
    "IMAGE_ENCODER_PRECISION_FLAG",
    "PRECISIONS",
    "TEXT_ENCODER_PRECISIONS_FLAG",
    "VAE_PRECISION_FLAG",
    "check_precision",
    "fp32_modules",
    "keeps_fp32",
    "parse_precision",
    "precision_name",
    "slot_dtype",
    "stored_dtype",
]

DIT_PRECISION_FLAG = "--dit-precision"
VAE_PRECISION_FLAG = "--vae-precision"
COMPONENT_PRECISIONS_FLAG = "--component-precisions"
TEXT_ENCODER_PRECISIONS_FLAG = "--text-encoder-precisions"
IMAGE_ENCODER_PRECISION_FLAG = "--image-encoder-precision"

PRECISIONS: Mapping[str, torch.dtype] = MappingProxyType(
    {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
)
"""The accepted precision values, as upstream spells them."""
_NAMES = {dtype: name for name, dtype in PRECISIONS.items()}

DEFAULT_DIT_PRECISION = torch.bfloat16
DEFAULT_VAE_PRECISION = torch.float32


def parse_precision(flag: str, value: str) -> torch.dtype:
    """PREC-3: a precision value of `flag` (`fp32`, `fp16` or `bf16`, exactly).

    Raises:
        ArgumentError: for any other value (an empty one included), naming the flag and the
            accepted values.
    """
    dtype = PRECISIONS.get(value)
    if dtype is None:
        raise ArgumentError(
            f"{flag}: unknown precision {value!r}; accepted: {', '.join(PRECISIONS)}"
            f" (as in {flag}=bf16)"
        )
    return dtype


def precision_name(dtype: torch.dtype) -> str:
    """`bf16` for torch.bfloat16, ...; the dtype's own name for one outside PRECISIONS."""
    return _NAMES.get(dtype, str(dtype).removeprefix("torch."))


def check_precision(name: str, value: object) -> torch.dtype:
    """ARGS-4 for a precision given in code: one of PRECISIONS' dtypes.

    Raises:
        ArgumentError: naming the field and the accepted values.
    """
    if not isinstance(value, torch.dtype) or value not in _NAMES:
        accepted = ", ".join(f"torch.{str(d).removeprefix('torch.')}" for d in _NAMES)
        raise ArgumentError(f"{name} must be one of {accepted}, got {value!r}")
    return value


def fp32_modules(module: nn.Module) -> tuple[str, ...]:
    """The module names `module`'s class keeps in fp32 (diffusers' `_keep_in_fp32_modules`)."""
    kept = getattr(type(module), "_keep_in_fp32_modules", None)
    if kept is None:
        return ()
    return (kept,) if isinstance(kept, str) else tuple(kept)


def keeps_fp32(key: str, modules: Sequence[str]) -> bool:
    """Whether the state key `key` lies in one of `modules` (one of its dotted parts is one of
    them), as diffusers matches `_keep_in_fp32_modules`."""
    return not set(modules).isdisjoint(key.split("."))


def slot_dtype(built: torch.dtype, target: torch.dtype, *, kept: bool) -> torch.dtype:
    """The dtype a slot built in `built` holds under precision `target`: unchanged unless it is
    a floating dtype of two bytes or more (integer and float8 slots keep theirs), fp32 where it
    is `kept` in fp32 (the class's fp32-kept modules, `keeps_fp32`, or a library's own rule),
    else `target` (PREC-1, PREC-2)."""
    if not built.is_floating_point or built.itemsize < 2:
        return built
    return torch.float32 if kept else target


def stored_dtype(tensors: Iterable[tuple[torch.dtype, int]]) -> torch.dtype | None:
    """TE-3: the floating dtype a checkpoint stores, from its headers' (dtype, bytes) pairs: the
    floating dtype of two bytes or more that holds most of its bytes (integer and float8 tensors
    do not count); None when it holds none."""
    totals: dict[torch.dtype, int] = {}
    for dtype, nbytes in tensors:
        if dtype.is_floating_point and dtype.itemsize >= 2:
            totals[dtype] = totals.get(dtype, 0) + nbytes
    return max(totals, key=lambda d: totals[d]) if totals else None
