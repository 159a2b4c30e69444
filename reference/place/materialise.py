"""A module built on meta, made ready for the ordinary way's `load_state_dict`: every slot given
fresh, uninitialised host memory (`materialise_slots`), where nothing else of it would stay on
meta (`meta_leftovers`).

The ordinary way (ADM-6) builds a module for real, initialising every parameter, and then
copies its checkpoint over all of them. A pipeline load builds the same module on meta for its
checks (PIPE-2), and a component loaded alone the ordinary way does the same first, with every
non-persistent buffer computed as construction computes it
(`reference.place.build.build_on_meta`). Giving that module's slots fresh memory and
loading the checkpoint into it through its own `load_state_dict` ends in the same state (the
load is strict: every slot is written) without initialising what the checkpoint overwrites, as
diffusers' `from_pretrained` builds under `init_empty_weights`. Measured on 2026-12-07 on the
bench pipeline's fp32 `AutoencoderKLWan` (54 MiB; `pipe_offload_sequential`, warm, fresh
processes, medians of 5, 2 cores): its load took 0.050 s, where the real build's took 0.120 s.

Each slot's tensor object itself becomes real where nothing else holds its data (its tensor
implementation is swapped, as `reference.place.meta.MetaBuild` swapped it to meta), so a
construction that kept the object elsewhere (an attribute, a hook's closure) sees the loaded
values, as it does after a real build. A module that would keep a meta tensor anyway cannot be
made real this way: a non-persistent buffer that construction computed from a parameter, or a
tensor attribute that is not a slot's own object (a view of a parameter). `meta_leftovers`
names those, before anything is allocated; the caller then builds for real, as the ordinary way
always did.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from reference.place.meta import SWAP_IMPL
from reference.place.modules import Slots, non_persistent_buffers, submodules

__all__ = ["materialise_slots", "meta_leftovers"]


def _in_place(tensor: torch.Tensor) -> bool:
    """Whether `tensor`'s implementation can be swapped: no view, autograd node or weak
    reference holds it."""
    return (
        SWAP_IMPL is not None
        and tensor._use_count() == 1  # type: ignore[attr-defined]
        and not weakref.getweakrefs(tensor)
    )


def meta_leftovers(module: nn.Module, slots: Slots) -> tuple[str, ...]:
    """The full names of what `materialise_slots(slots)` would leave on meta in `module`: its
    non-persistent buffers on meta, and its submodules' tensor attributes on meta that are not
    a slot's object made real in place."""
    names = [key for key, entry in non_persistent_buffers(module).items() if entry.tensor.is_meta]
    made_real = {id(slot.tensor) for slot in slots.by_name.values() if _in_place(slot.tensor)}
    for path, sub in submodules(module):
        prefix = f"{path}." if path else ""
        names += [
            prefix + attr
            for attr, value in vars(sub).items()
            if isinstance(value, torch.Tensor) and value.is_meta and id(value) not in made_real
        ]
    return tuple(sorted(set(names)))


def materialise_slots(slots: Slots) -> None:
    """Give every slot on meta fresh, uninitialised CPU memory of its shape and dtype: in place
    (the same object, its class, instance attributes and `requires_grad` unchanged) where
    nothing else holds its data, else as a new tensor of its class in each of its places (ties
    stay tied either way). For a module whose `meta_leftovers` are none, and whose every slot
    is then written (a strict `load_state_dict`)."""
    for slot in slots.by_name.values():
        target = slot.tensor
        if not target.is_meta:
            continue
        # Not empty_like: onto another device than meta's it runs a Python reference that
        # imports sympy (about a second, once per process).
        fresh = (
            torch.empty(target.shape, dtype=target.dtype)
            if target.is_contiguous()
            else torch.empty_like(target, device="cpu")
        )
        if _in_place(target):
            assert SWAP_IMPL is not None
            SWAP_IMPL(target, fresh.requires_grad_(target.requires_grad))
            continue
        if slot.is_parameter:
            fresh = torch.Tensor._make_subclass(type(target), fresh, target.requires_grad)
            fresh.__dict__.update(target.__dict__)
        for owner, leaf in slot.places:
            store = owner._parameters if slot.is_parameter else owner._buffers
            store[leaf] = fresh  # type: ignore[assignment]
