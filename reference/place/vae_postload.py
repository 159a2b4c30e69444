"""After the stream: the state check, and the VAE's layout and dtype policy.

Non-persistent buffers are given their values by `reference.place.modules` (VAE-9); what is left
here is the check that the module's own hooks kept the streamed state (VAE-5, VAE-8).

The policy steps (VAE-11) give the streamed module what an ordinary load followed by the same
steps gives (the suite compares the two): Conv3d weights to `channels_last_3d` when asked, and
the decoder held in a decode dtype through the VAE's own `prepare_decode_dtype(dtype)` method.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from reference.errors import ArgumentError, StateDictABIError
from reference.place.modules import has_method, state_entries

__all__ = [
    "DECODE_DTYPE_HOOK",
    "apply_vae_policy",
    "check_state_kept",
    "hold_decoder_in_decode_dtype",
    "require_decode_dtype_support",
    "to_channels_last_3d",
]

DECODE_DTYPE_HOOK = "prepare_decode_dtype"


def check_state_kept(
    module: nn.Module, filled: Mapping[str, torch.Tensor], *, component: str
) -> None:
    """VAE-5, VAE-8: after the module's own hooks ran, the state is exactly what was streamed.

    With every slot holding its streamed tensor and every non-persistent buffer rebuilt, nothing
    is left on meta.

    Raises:
        StateDictABIError: a hook added state (parameters registered after construction) or
            replaced a streamed tensor; naming the entries.
    """
    current = {entry.key: entry.tensor for entry in state_entries(module)}
    added = sorted(set(current) - set(filled))
    replaced = sorted(key for key, tensor in filled.items() if current.get(key) is not tensor)
    if added or replaced:
        raise StateDictABIError(
            f"{component}: state changed after streaming; registered after construction:"
            f" {added or 'none'}; replaced or removed: {replaced or 'none'}. The checkpoint"
            " filled the slots that construction declared; register every parameter and"
            " persistent buffer in __init__"
        )


def to_channels_last_3d(module: nn.Module) -> tuple[str, ...]:
    """VAE-11: store every Conv3d weight in `channels_last_3d` (same values, new strides).

    A parametrized weight (weight norm, ...) is computed at call time and is left as it is.

    Returns:
        The names of the converted weights.
    """
    converted = []
    for path, sub in module.named_modules():
        weight = sub._parameters.get("weight") if isinstance(sub, nn.Conv3d) else None
        if weight is not None:
            weight.data = weight.data.contiguous(memory_format=torch.channels_last_3d)
            converted.append(f"{path}.weight" if path else "weight")
    return tuple(converted)


def require_decode_dtype_support(module: nn.Module, dtype: torch.dtype, *, component: str) -> None:
    """VAE-11: refuse, before anything is read, a decode dtype the VAE cannot hold.

    Raises:
        ArgumentError: the VAE has no `prepare_decode_dtype(dtype)` method, or `dtype` is not a
            floating dtype; the request is refused rather than ignored.
    """
    if not has_method(module, DECODE_DTYPE_HOOK):
        raise ArgumentError(
            f"{component}: decode_dtype={dtype} was requested but {type(module).__qualname__}"
            f" has no {DECODE_DTYPE_HOOK}(dtype) method, so its decoder cannot be held in that"
            " dtype. Drop decode_dtype for this component"
        )
    if not dtype.is_floating_point:
        raise ArgumentError(f"{component}: decode_dtype={dtype} is not a floating dtype")


def hold_decoder_in_decode_dtype(module: nn.Module, dtype: torch.dtype, *, component: str) -> None:
    """VAE-11: hand the decode dtype to the VAE's own `prepare_decode_dtype(dtype)` method.

    Raises:
        ArgumentError: as `require_decode_dtype_support`.
    """
    require_decode_dtype_support(module, dtype, component=component)
    getattr(module, DECODE_DTYPE_HOOK)(dtype)


def apply_vae_policy(
    module: nn.Module,
    *,
    channels_last_3d: bool,
    decode_dtype: torch.dtype | None,
    component: str,
) -> tuple[str, ...]:
    """VAE-11: the layout and dtype policy, identical for streamed and ordinary loads.

    Returns:
        Events, in order, for the load report.
    """
    events = []
    if channels_last_3d:
        to_channels_last_3d(module)
        events.append("channels_last_3d")
    if decode_dtype is not None:
        hold_decoder_in_decode_dtype(module, decode_dtype, component=component)
        events.append(f"decode_dtype {decode_dtype}")
    return tuple(events)
