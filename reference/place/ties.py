"""Tied slots of a built module, and the checkpoint names that fill them (TE-2, ZC-12).

A model may declare two state names for one tensor (T5's `shared.weight` and
`encoder.embed_tokens.weight`). After the meta build the declared ties are re-established
(`tie_slots`), so both names are one slot; `save_pretrained` writes only one of the names, and a
checkpoint written otherwise may hold the other, or both. `tied_names` maps whichever name the
checkpoint holds onto the slot, from the headers alone; where it holds both, `check_twins`
compares their values before the load: equal, one of them fills the slot (one adoption); different,
the load is refused naming both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from reference.errors import StateMismatchError, shown
from reference.place.modules import Slots
from reference.read.checkpoint import Checkpoint, TensorInfo, TensorReader

__all__ = ["Twins", "check_twins", "renamed", "tie_slots", "tied_names"]


def _owner(module: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, attr = name.rpartition(".")
    return (module.get_submodule(path) if path else module), attr


def tie_slots(module: nn.Module, ties: Mapping[str, str], *, component: str) -> None:
    """TE-2: make each tied name of `ties` (tied name -> source name) hold the very tensor its
    source holds, as the class's own `tie_weights` does; on a meta build nothing is allocated.

    Raises:
        StateMismatchError: a name of `ties` that is not a parameter or buffer of `module`.
    """
    for target, source in ties.items():
        try:
            source_owner, source_attr = _owner(module, source)
            owner, attr = _owner(module, target)
        except AttributeError:
            raise StateMismatchError(
                f"{component}: {type(module).__name__} declares {target!r} tied to {source!r},"
                " and the built module has no such submodule"
            ) from None
        if source_attr in source_owner._parameters and attr in owner._parameters:
            owner._parameters[attr] = source_owner._parameters[source_attr]
        elif source_attr in source_owner._buffers and attr in owner._buffers:
            owner._buffers[attr] = source_owner._buffers[source_attr]
        else:
            raise StateMismatchError(
                f"{component}: {type(module).__name__} declares {target!r} tied to {source!r},"
                " and the built module does not hold both as parameters or buffers"
            )


@dataclass(frozen=True)
class Twins:
    """Two names of one tied slot that a checkpoint both holds: `kept` fills the slot, `other`
    must hold the same values."""

    kept: str
    other: str


def renamed(checkpoint: Checkpoint, names: Mapping[str, str], *, component: str) -> Checkpoint:
    """The checkpoint with its tensors named as `names` says (checkpoint name -> slot name;
    others keep theirs), from the headers alone: each tensor still reads from where its file
    holds it.

    Raises:
        StateMismatchError: two tensors that would take one name, naming both.
    """
    if not names:
        return checkpoint
    tensors: dict[str, TensorInfo] = {}
    for name, info in checkpoint.tensors.items():
        new = names.get(name, name)
        if new in tensors:
            raise StateMismatchError(
                f"{component}: the checkpoint holds both {tensors[new].name!r} and {name!r},"
                f" which the model's class loads into one slot {new!r}; keep one of them"
            )
        tensors[new] = info if new == name else replace(info, name=new)
    return replace(checkpoint, tensors=tensors)


def tied_names(checkpoint: Checkpoint, slots: Slots) -> tuple[Checkpoint, tuple[Twins, ...]]:
    """The checkpoint as a module's `slots` name it, from the headers alone: a tied slot is
    filled from whichever of its names the checkpoint holds (renamed to the slot's first name),
    and where it holds several, the first present is kept and the others are returned as
    `Twins`, left out of the returned checkpoint (`check_twins` compares them)."""
    aliases = slots.aliases
    if not aliases:
        return checkpoint, ()
    groups: dict[str, list[str]] = {}
    for alias, first in aliases.items():
        groups.setdefault(first, [first]).append(alias)
    tensors = dict(checkpoint.tensors)
    twins: list[Twins] = []
    for first, names in groups.items():
        present = [name for name in names if name in tensors]
        if not present:
            continue
        kept = present[0]
        twins.extend(Twins(kept, other) for other in present[1:])
        for other in present[1:]:
            del tensors[other]
        if kept != first:
            tensors[first] = replace(tensors.pop(kept), name=first)
    if not twins and tensors.keys() == checkpoint.tensors.keys():
        return checkpoint, ()
    return replace(checkpoint, tensors=tensors), tuple(twins)


def check_twins(checkpoint: Checkpoint, twins: Sequence[Twins], *, component: str) -> None:
    """TE-2, ZC-12: every pair of names of one tied slot that `checkpoint` (as written, before
    `tied_names`) holds must hold the same tensor: same dtype, shape and values. Compared from
    views of the files' maps (nothing is copied).

    Raises:
        StateMismatchError: naming both names and their files.
    """
    if not twins:
        return
    reader = TensorReader(checkpoint)
    cpu = torch.device("cpu")
    try:
        for twin in twins:
            a, b = (checkpoint.tensors[name] for name in (twin.kept, twin.other))
            same = a.dtype == b.dtype and a.shape == b.shape
            if same:
                same = torch.equal(reader.read(a.name, device=cpu), reader.read(b.name, device=cpu))
            if not same:
                raise StateMismatchError(
                    f"{component}: the checkpoint holds both {twin.kept!r} ({shown(a.file.name)})"
                    f" and {twin.other!r} ({shown(b.file.name)}), which the model ties into one"
                    " slot, with different values; keep one of them in the checkpoint"
                )
    finally:
        reader.close()
