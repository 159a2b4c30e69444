"""The one home of `nn.Module` introspection: the walk, the slots, non-persistent buffers.

Both component loaders (`reference.load.dit`, `reference.load.vae`) ask a module the same
questions here, so neither imports the other (the meta build is `reference.place.build`):
  * `walk` is the only loop over a module's parameters and buffers (every path, ties included);
  * a `Slot` is one assignable entry (a parameter or a persistent buffer) under all its names;
    `find_slots` groups the walk into slots and the alias names of tied entries;
  * `refuse_unrebuildable_buffers` and `rebuild_non_persistent_buffers` give the non-persistent
    buffers their values after a load, or refuse before one (VAE-9).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from reference.errors import StateDictABIError

__all__ = [
    "REBUILD_HOOK",
    "Entry",
    "Slot",
    "Slots",
    "find_slots",
    "has_method",
    "in_eval_mode",
    "non_persistent_buffers",
    "own_attribute",
    "rebuild_non_persistent_buffers",
    "refuse_unrebuildable_buffers",
    "state_entries",
    "submodules",
    "walk",
]

REBUILD_HOOK = "rebuild_buffers"


@dataclass(frozen=True, eq=False)
class Entry:
    """One tensor of a module under one of its names.

    Attributes:
        key: the full name (`decoder.conv_in.weight`).
        owner: the submodule that holds it; `attr` is its name there (`weight`).
        tensor: the tensor itself.
        is_parameter: a parameter (else a buffer).
        persistent: saved in the state dict (every parameter; buffers unless registered
            with `persistent=False`).
    """

    key: str
    owner: nn.Module
    attr: str
    tensor: torch.Tensor
    is_parameter: bool
    persistent: bool


def submodules(module: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """Every submodule under every path, the module itself first, in registration order
    (pre-order): `module.named_modules(remove_duplicate=False)`, typed."""
    return cast(Iterator[tuple[str, nn.Module]], module.named_modules(remove_duplicate=False))


def walk(module: nn.Module, *, persistent: bool | None = None) -> Iterator[Entry]:
    """Every parameter and buffer of `module` under every name it has, in registration order;
    only the persistent ones (parameters and persistent buffers) or only the non-persistent
    buffers where `persistent` says so.

    Nothing is deduplicated: a submodule registered under two paths contributes its entries
    once per path, and a tensor registered under two names appears under each.
    """
    for path, sub in submodules(module):
        prefix = f"{path}." if path else ""
        if persistent is not False:
            for attr, param in sub._parameters.items():
                if param is not None:
                    yield Entry(prefix + attr, sub, attr, param, True, True)
        for attr, buf in sub._buffers.items():
            kept = attr not in sub._non_persistent_buffers_set
            # Asked before an Entry is made: a load walks its module several times.
            if buf is not None and persistent in (None, kept):
                yield Entry(prefix + attr, sub, attr, buf, False, kept)


def state_entries(module: nn.Module) -> list[Entry]:
    """The entries a state dict holds: parameters and persistent buffers, every name."""
    return list(walk(module, persistent=True))


def non_persistent_buffers(module: nn.Module) -> dict[str, Entry]:
    """Every non-persistent buffer of `module` by full name (no checkpoint holds them)."""
    return {entry.key: entry for entry in walk(module, persistent=False)}


@dataclass(frozen=True, eq=False)
class Slot:
    """One assignable entry of a module: a parameter or a persistent buffer, under all its names.

    Attributes:
        name: its first state-dict key.
        tensor: the tensor as built (on meta its shape and dtype are known without any data).
        places: every (owner, attribute) that holds it; more than one when it is tied.
        is_parameter: a parameter (else a persistent buffer).
    """

    name: str
    tensor: torch.Tensor
    places: tuple[tuple[nn.Module, str], ...]
    is_parameter: bool

    @property
    def owner(self) -> nn.Module:
        return self.places[0][0]

    @property
    def attr(self) -> str:
        return self.places[0][1]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.tensor.dtype

    @property
    def requires_grad(self) -> bool:
        """The parameter's flag as built (False for buffers)."""
        return self.is_parameter and bool(self.tensor.requires_grad)


@dataclass(frozen=True)
class Slots:
    """A module's slots by first name, and each tied alias name mapped to that first name."""

    by_name: Mapping[str, Slot]
    aliases: Mapping[str, str]


def find_slots(module: nn.Module) -> Slots:
    """Group the module's state entries into slots: one per tensor, however many names it has.

    One pass over the submodules' own tables, the entries `state_entries` lists in its order,
    without an `Entry` per name: on a 231-tensor Wan DiT the `Entry` objects were half the cost
    of a call. A DiT or encoder load asks once, after its cast (`reference.place.cast.cast_slots`
    returns them), and passes them on to its steps."""
    # By tensor id: its first name, the tensor, whether a parameter, every (owner, attribute).
    found: dict[int, tuple[str, torch.Tensor, bool, list[tuple[nn.Module, str]]]] = {}
    aliases: dict[str, str] = {}
    for path, sub in submodules(module):
        prefix = f"{path}." if path else ""
        for table, parameter in ((sub._parameters, True), (sub._buffers, False)):
            transient = () if parameter else sub._non_persistent_buffers_set
            for attr, tensor in table.items():
                if tensor is None or attr in transient:
                    continue
                key = prefix + attr
                known = found.get(id(tensor))
                if known is None:
                    found[id(tensor)] = (key, tensor, parameter, [(sub, attr)])
                    continue
                places = known[3]
                if all(owner is not sub or name != attr for owner, name in places):
                    places.append((sub, attr))
                aliases[key] = known[0]
    slots = {
        key: Slot(key, tensor, tuple(places), parameter)
        for key, tensor, parameter, places in found.values()
    }
    return Slots(slots, aliases)


def has_method(module: nn.Module, name: str) -> bool:
    # Looked up on the class: a submodule registered under that name is not a hook.
    return callable(getattr(type(module), name, None))


def own_attribute(module: nn.Module, name: str) -> Any:
    """`getattr(module, name, None)`, without `nn.Module.__getattr__` raising (and formatting)
    an AttributeError for each module that lacks `name`: a load asks every submodule (a
    layer's `quant_method`), and most have none."""
    held = module.__dict__.get(name)
    if held is not None:
        return held
    if (
        hasattr(type(module), name)
        or name in module._parameters
        or name in module._buffers
        or name in module._modules
    ):
        return getattr(module, name, None)
    return None


def in_eval_mode(module: nn.Module) -> nn.Module:
    """`module.eval()`, returning `module`: every submodule's `training` False. One loop over
    the submodules instead of torch's recursion through `train` (a third of a millisecond on
    a 240-module DiT); where any class of the tree overrides `train`, `eval` or `__setattr__`,
    `module.eval()` itself, so that the override runs."""
    subs = [sub for _, sub in submodules(module)]
    plain = nn.Module.train, nn.Module.eval, nn.Module.__setattr__
    if any((type(sub).train, type(sub).eval, type(sub).__setattr__) != plain for sub in subs):
        return module.eval()
    for sub in subs:
        # What Module.__setattr__ ends with for a name that is no parameter, buffer or module.
        object.__setattr__(sub, "training", False)
    return module


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
        name: entry.owner
        for name, entry in non_persistent_buffers(module).items()
        if entry.tensor.is_meta
    }
    orphans = sorted(name for name, sub in on_meta.items() if not has_method(sub, REBUILD_HOOK))
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
        if has_method(sub, REBUILD_HOOK):
            getattr(sub, REBUILD_HOOK)(device)
    buffers = non_persistent_buffers(module)
    on_meta = sorted(name for name, entry in buffers.items() if entry.tensor.is_meta)
    if on_meta:
        raise StateDictABIError(
            f"{component}: non-persistent buffers {', '.join(on_meta)} are still on meta after"
            f" the {REBUILD_HOOK}(device) methods ran; no checkpoint holds them. Make the"
            f" method recompute every buffer it owns, or drop the direct-loading flag for"
            f" {component}"
        )
    for entry in buffers.values():
        # Read again: under a second path the owner's buffer may have moved already.
        entry.owner._buffers[entry.attr] = entry.owner._buffers[entry.attr].to(device)  # type: ignore[union-attr]
    return tuple(buffers)
