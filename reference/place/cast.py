"""A built module's slots given its component's precision, before any tensor is read (PREC-1,
PREC-2): on meta nothing is allocated, so a checkpoint tensor already in the slot's dtype is
adopted and any other is converted once (PREC-4)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from reference.place.modules import Slot, Slots, find_slots
from reference.request.precision import fp32_modules, keeps_fp32, slot_dtype

__all__ = ["cast_slots"]


@torch.no_grad()
def cast_slots(
    module: nn.Module, dtype: torch.dtype, *, keeps_fp32_key: Callable[[str], bool] | None = None
) -> Slots:
    """Give every slot of `module` the dtype precision `dtype` asks (`slot_dtype`), in place;
    on a module built on meta nothing is allocated. A parameter keeps its class, attributes
    and `requires_grad`; tied slots stay tied. Returns the module's slots as they now are
    (`find_slots` after the cast, without a second walk: a load passes them on).

    `keeps_fp32_key` answers which state keys stay fp32 (a library's own rule, such as
    transformers', `reference.place.transformers_models.fp32_keeper`); by default the
    class's diffusers-style `_keep_in_fp32_modules` decide (PREC-2)."""
    if keeps_fp32_key is None:
        modules = fp32_modules(module)
        keeps_fp32_key = lambda key: keeps_fp32(key, modules)  # noqa: E731
    found = find_slots(module)
    cast: dict[str, Slot] = {}
    for name, slot in found.by_name.items():
        wanted = slot_dtype(slot.dtype, dtype, kept=keeps_fp32_key(name))
        if wanted == slot.dtype:
            continue
        data = slot.tensor.detach().to(wanted)
        if slot.is_parameter:
            new = torch.Tensor._make_subclass(type(slot.tensor), data, slot.tensor.requires_grad)
            new.__dict__.update(slot.tensor.__dict__)
        else:
            new = data
        for owner, leaf in slot.places:
            store = owner._parameters if slot.is_parameter else owner._buffers
            store[leaf] = new  # type: ignore[assignment]
        cast[name] = Slot(name, new, slot.places, slot.is_parameter)
    if not cast:
        return found
    return Slots({**found.by_name, **cast}, found.aliases)
