"""After the stream: non-persistent buffers, state checks, and the VAE's layout and dtype policy.

Non-persistent buffers are not in any checkpoint: their values come from construction (VAE-9).
The meta build (`reference.vae.build_on_meta`) keeps them real: it sends only parameters and
persistent buffers to `meta`, so a buffer computed in `__init__` holds the value an ordinary
construction gives it. A buffer that construction itself leaves on `meta` (one derived from a
parameter, or made on `meta` on purpose) needs a `rebuild_buffers(device)` method on the
submodule that owns it, which recomputes it after the stream; without one the load is refused
right after the build, naming the buffers, before any tensor data is read.

The policy steps (VAE-11) give the streamed module what an ordinary load followed by the same
steps gives (the suite compares the two): Conv3d weights to `channels_last_3d` when asked, and
the decoder held in a decode dtype through the VAE's own `prepare_decode_dtype(dtype)` method.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from reference.errors import ArgumentError, StateDictABIError
from reference.slots import named_state

REBUILD_HOOK = "rebuild_buffers"
DECODE_DTYPE_HOOK = "prepare_decode_dtype"


def non_persistent_buffers(module: nn.Module) -> dict[str, tuple[nn.Module, str]]:
    """Every non-persistent buffer of `module`: full name -> (owner, attribute)."""
    found = {}
    for path, sub in module.named_modules():
        prefix = f"{path}." if path else ""
        for attr, buf in sub._buffers.items():
            if buf is not None and attr in sub._non_persistent_buffers_set:
                found[prefix + attr] = (sub, attr)
    return found


def _has_method(module: nn.Module, name: str) -> bool:
    # Looked up on the class: a submodule registered under that name is not a hook.
    return callable(getattr(type(module), name, None))


def refuse_unrebuildable_buffers(module: nn.Module, *, component: str) -> tuple[str, ...]:
    """VAE-9: right after the meta build, refuse buffers that nothing will give a value.

    A non-persistent buffer on `meta` is acceptable only when the submodule that owns it has a
    `rebuild_buffers(device)` method; checked before any tensor data is read.

    Returns:
        The names of the non-persistent buffers the hooks will rebuild.

    Raises:
        StateDictABIError: naming every buffer on meta whose owner has no such method.
    """
    on_meta = {
        name: sub
        for name, (sub, _) in non_persistent_buffers(module).items()
        if module.get_buffer(name).is_meta
    }
    orphans = sorted(name for name, sub in on_meta.items() if not _has_method(sub, REBUILD_HOOK))
    if orphans:
        raise StateDictABIError(
            f"{component}: non-persistent buffers {', '.join(orphans)} are on meta after the"
            " meta build: construction made them from meta tensors, no checkpoint holds them,"
            f" and their submodules have no {REBUILD_HOOK}(device) method to recompute them."
            f" Drop the direct-loading flag for {component}, or give the owning submodule a"
            f" {REBUILD_HOOK}(device) method"
        )
    return tuple(sorted(on_meta))


def rebuild_non_persistent_buffers(
    module: nn.Module, *, device: torch.device, component: str
) -> tuple[str, ...]:
    """VAE-9: give every non-persistent buffer its constructed value on `device`, or fail.

    Calls `rebuild_buffers(device)` on each submodule that defines it, then moves the
    non-persistent buffers (real since construction, or rebuilt) to `device`.

    Returns:
        The names of the non-persistent buffers, all real and on `device`.

    Raises:
        StateDictABIError: naming the buffers still on meta.
    """
    for sub in module.modules():
        if _has_method(sub, REBUILD_HOOK):
            getattr(sub, REBUILD_HOOK)(device)
    buffers = non_persistent_buffers(module)
    on_meta = sorted(name for name in buffers if module.get_buffer(name).is_meta)
    if on_meta:
        raise StateDictABIError(
            f"{component}: non-persistent buffers {', '.join(on_meta)} are still on meta after"
            f" the {REBUILD_HOOK}(device) methods ran; no checkpoint holds them. Make the"
            f" method recompute every buffer it owns, or drop the direct-loading flag for"
            f" {component}"
        )
    for name, (sub, attr) in buffers.items():
        sub._buffers[attr] = module.get_buffer(name).to(device)
    return tuple(buffers)


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
    current = {key: tensor for key, _, _, tensor, _ in named_state(module)}
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
    if not _has_method(module, DECODE_DTYPE_HOOK):
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
