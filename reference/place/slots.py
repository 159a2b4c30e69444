"""State slots of a module under the standard state-dict ABI (VAE-2..6).

Direct streaming writes checkpoint tensors straight into a module's parameters and buffers instead
of calling `load_state_dict`. That is only equivalent when the module uses torch's own state-dict
machinery, so before any byte is read this module proves it:

  * every submodule (not only the root) uses `torch.nn.Module`'s `state_dict`,
    `_save_to_state_dict`, `_load_from_state_dict` and `load_state_dict`, or an override that torch
    itself ships for a built-in layer (batch norm's versioned loading); a user override anywhere
    in a class's MRO (its own class, a user base class, behind torch's override) is refused;
    "torch's" means the module `torch` or `torch.*`, not a package named like it (`torchx`);
  * no state-dict or load-state-dict hook comes from user code (torch's own, such as weight norm's
    compatibility hook, are standard);
  * no tensor is registered under two names (tied parameters, a submodule under two paths);
  * every slot is settled: no lazy parameter or buffer, whose shape only a forward decides, and
    no parameter of a class other than `nn.Parameter`;
  * the state-dict keys are exactly the slots: parameters and persistent buffers.
"""

from __future__ import annotations

import functools
import inspect
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from reference.errors import StateDictABIError
from reference.place.modules import Entry, Slot, state_entries, submodules

__all__ = [
    "ABI_FUNCTIONS",
    "HOOK_TABLES",
    "REFERENCE_SLOT_CHECKS",
    "SlotChecks",
    "check_keys_are_slots",
    "check_settled",
    "check_state_dict_abi",
    "is_torch_code",
    "refuse_tied",
    "state_slots",
]

ABI_FUNCTIONS = ("state_dict", "_save_to_state_dict", "_load_from_state_dict", "load_state_dict")
HOOK_TABLES = (
    ("_state_dict_pre_hooks", "state_dict pre-hook"),
    ("_state_dict_hooks", "state_dict hook"),
    ("_load_state_dict_pre_hooks", "load_state_dict pre-hook"),
    ("_load_state_dict_post_hooks", "load_state_dict post-hook"),
)


def _where(path: str) -> str:
    return "the root module" if not path else f"submodule {path!r}"


def is_torch_code(obj: object) -> bool:
    """Whether a function, method, hook object or class comes from torch itself."""
    obj = inspect.unwrap(obj)  # type: ignore[arg-type]  # torch's hook wrapper sets __wrapped__
    while True:
        if isinstance(obj, functools.partial):
            obj = obj.func
        elif inspect.ismethod(obj):
            obj = obj.__func__
        else:
            break
    origin = getattr(obj, "__module__", None) or type(obj).__module__
    return origin == "torch" or origin.startswith("torch.")


def check_state_dict_abi(
    module: nn.Module,
    *,
    component: str,
    functions: tuple[str, ...] = ABI_FUNCTIONS,
    hook_tables: tuple[tuple[str, str], ...] = HOOK_TABLES,
) -> None:
    """VAE-2, VAE-3: every submodule uses torch's own state-dict `functions` and no hook from
    user code sits in any of the `hook_tables` (attribute, what the message calls it).

    Raises:
        StateDictABIError: naming the submodule, the function or hook, and where it comes from.
    """
    for path, sub in submodules(module):
        for name in functions:
            if name in vars(sub):
                raise StateDictABIError(
                    f"{component}: {_where(path)} replaces {name} on the instance; direct"
                    f" streaming needs torch's own state-dict functions. Remove the assignment or"
                    f" load {component} without direct loading"
                )
            # Every definition along the MRO counts, not only the first: torch's own override
            # (batch norm's) calls super(), which reaches a user base class behind it.
            for owner in type(sub).__mro__:
                function = vars(owner).get(name)
                if function is not None and not (is_torch_code(owner) and is_torch_code(function)):
                    raise StateDictABIError(
                        f"{component}: {_where(path)} ({type(sub).__qualname__}) overrides"
                        f" {name} in {owner.__module__}.{owner.__qualname__}; direct streaming"
                        " writes slots directly and would skip that code. Remove the override"
                        f" or load {component} without direct loading"
                    )
        for table, kind in hook_tables:
            for hook in getattr(sub, table).values():
                if not is_torch_code(hook):
                    hook_name = getattr(inspect.unwrap(hook), "__qualname__", repr(hook))
                    raise StateDictABIError(
                        f"{component}: {_where(path)} has a user {kind} ({hook_name}); direct"
                        " streaming writes slots directly and would skip it. Remove the hook or"
                        f" load {component} without direct loading"
                    )


def check_settled(key: str, tensor: torch.Tensor, *, is_parameter: bool, component: str) -> None:
    """VAE-4b: a slot's shape and class are known from the module as built.

    Raises:
        StateDictABIError: a lazy parameter or buffer (its shape is settled by the first forward,
            which streaming never runs), or a parameter of another class than `nn.Parameter`.
    """
    if nn.parameter.is_lazy(tensor):
        kind = "parameter" if is_parameter else "buffer"
        raise StateDictABIError(
            f"{component}: {key} is a lazy {kind} ({type(tensor).__name__}) whose shape only its"
            " first forward settles, which direct streaming never runs. Give the layer its"
            f" shapes (not an nn.Lazy* module) or load {component} without direct loading"
        )
    if is_parameter and type(tensor) is not nn.Parameter:
        raise StateDictABIError(
            f"{component}: {key} is a {type(tensor).__name__}, not a plain nn.Parameter; its"
            " class is settled by code that direct streaming does not run. Use plain parameters"
            f" or load {component} without direct loading"
        )


def refuse_tied(module: nn.Module, entries: Sequence[Entry], *, component: str) -> None:
    """VAE-6: no tensor of `entries` is registered under two names.

    Raises:
        StateDictABIError: naming each group of tied names (and a submodule under two paths).
    """
    names_by_tensor: dict[int, list[str]] = defaultdict(list)
    for entry in entries:
        names_by_tensor[id(entry.tensor)].append(entry.key)
    tied = [names for names in names_by_tensor.values() if len(names) > 1]
    if not tied:
        return
    paths_by_module: dict[int, list[str]] = defaultdict(list)
    for path, sub in submodules(module):
        paths_by_module[id(sub)].append(path)
    shared = [" and ".join(p) for p in paths_by_module.values() if len(p) > 1]
    groups = "; ".join(" = ".join(names) for names in tied)
    also = f" (submodule registered under several paths: {', '.join(shared)})" if shared else ""
    raise StateDictABIError(
        f"{component}: tied state, one tensor under several names: {groups}{also}. Direct"
        " streaming fills each slot from its own checkpoint tensor; untie them or load"
        f" {component} without direct loading"
    )


def check_keys_are_slots(module: nn.Module, slots: Mapping[str, Slot], *, component: str) -> None:
    """VAE-5: the module's state-dict keys are exactly its slots.

    Raises:
        StateDictABIError: listing the keys that are not slots and the slots that are not keys.
    """
    keys = set(module.state_dict(keep_vars=True))
    extra, absent = sorted(keys - set(slots)), sorted(set(slots) - keys)
    if extra or absent:
        raise StateDictABIError(
            f"{component}: state-dict keys differ from the slots (parameters and persistent"
            f" buffers): keys that are not slots: {extra or 'none'}; slots missing from the"
            f" state dict: {absent or 'none'}. Direct streaming can only fill slots; load"
            f" {component} without direct loading"
        )


@dataclass(frozen=True)
class SlotChecks:
    """The checks of `state_slots`, each with the reference's default; a loader that checks
    differently passes its own (the conformance kit's broken loaders do)."""

    functions: tuple[str, ...] = ABI_FUNCTIONS
    hook_tables: tuple[tuple[str, str], ...] = HOOK_TABLES
    settled: Callable[..., None] = check_settled
    untied: Callable[..., None] = refuse_tied
    keys_are_slots: Callable[..., None] = check_keys_are_slots


REFERENCE_SLOT_CHECKS = SlotChecks()


def state_slots(
    module: nn.Module, *, component: str, checks: SlotChecks = REFERENCE_SLOT_CHECKS
) -> dict[str, Slot]:
    """VAE-2..6: the slots of `module`, after proving it uses the standard state-dict ABI.

    Slots are all parameters and persistent buffers; non-persistent buffers are not slots (they
    are never saved, so a checkpoint cannot fill them).

    Args:
        module: typically built on `meta`; no tensor data is read.
        component: named in error messages.
        checks: the checks to run (see `SlotChecks`); the reference's by default.

    Returns:
        Slots by state-dict key, in registration order.

    Raises:
        StateDictABIError: a user override or hook (VAE-2, VAE-3), a lazy or custom parameter
            class, tied entries (VAE-6), or state-dict keys that differ from the slots (VAE-5).
    """
    check_state_dict_abi(
        module, component=component, functions=checks.functions, hook_tables=checks.hook_tables
    )
    entries = state_entries(module)
    for entry in entries:
        checks.settled(
            entry.key, entry.tensor, is_parameter=entry.is_parameter, component=component
        )
    checks.untied(module, entries, component=component)
    slots = {
        entry.key: Slot(entry.key, entry.tensor, ((entry.owner, entry.attr),), entry.is_parameter)
        for entry in entries
    }
    checks.keys_are_slots(module, slots, component=component)
    return slots
