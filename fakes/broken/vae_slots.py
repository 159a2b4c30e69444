"""Broken state-dict ABI checks of direct VAE loading: functions, hooks, tied state (VAE-2,3,6)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fakes.broken.vae import VAEDefect
from reference.load.vae import VAESteps
from reference.place.modules import Entry
from reference.place.slots import SlotChecks, check_settled

__all__ = [
    "AllowsTiedState",
    "ChecksOnlyStateDict",
    "IgnoresKeysThatAreNotSlots",
    "IgnoresUserHooks",
    "LetsLazyStateThrough",
    "keys_unchecked",
    "lazy_unchecked",
    "no_tie_check",
]


class ChecksOnlyStateDict(VAEDefect):
    """Checks that `state_dict` is torch's own, but not `load_state_dict`,
    `_load_from_state_dict` or `_save_to_state_dict`, on the root or any submodule (VAE-3:
    VAE-2 is the root's `state_dict` alone, which this loader does check)."""

    name = "broken-checks-only-state-dict"
    breaks = frozenset({"VAE-3"})

    def vae_steps(self) -> VAESteps:
        return VAESteps(slot_checks=SlotChecks(functions=("state_dict",)))


class IgnoresUserHooks(VAEDefect):
    """Checks the state-dict functions of every submodule but not their hooks (VAE-3)."""

    name = "broken-ignores-user-hooks"
    breaks = frozenset({"VAE-3"})

    def vae_steps(self) -> VAESteps:
        return VAESteps(slot_checks=SlotChecks(hook_tables=()))


def no_tie_check(
    module: nn.Module,
    entries: Sequence[Entry],
    *,
    component: str,
) -> None:
    """Lets tied entries through: each name becomes a slot of its own."""


class AllowsTiedState(VAEDefect):
    """Lets a tied VAE through: each tied name is streamed into its own tensor, untying them
    (VAE-6)."""

    name = "broken-allows-tied-state"
    breaks = frozenset({"VAE-6"})

    def vae_steps(self) -> VAESteps:
        return VAESteps(slot_checks=SlotChecks(untied=no_tie_check))


def keys_unchecked(module: nn.Module, found: object, *, component: str) -> None:
    """Trusts the module's state dict to hold its slots and nothing else."""


class IgnoresKeysThatAreNotSlots(VAEDefect):
    """Never compares the module's state-dict keys with its slots, so a key that is no slot
    (a submodule's extra state) goes unnoticed until something tries to fill it (VAE-5)."""

    name = "broken-ignores-keys-that-are-not-slots"
    breaks = frozenset({"VAE-5"})

    def vae_steps(self) -> VAESteps:
        return VAESteps(slot_checks=SlotChecks(keys_are_slots=keys_unchecked))


_check_settled = check_settled


def lazy_unchecked(key: str, tensor: torch.Tensor, *, is_parameter: bool, component: str) -> None:
    """Checks a parameter's class, but takes a lazy parameter or buffer as settled."""
    if not nn.parameter.is_lazy(tensor):
        _check_settled(key, tensor, is_parameter=is_parameter, component=component)


class LetsLazyStateThrough(VAEDefect):
    """Takes lazy parameters and buffers as ordinary slots, so whatever fails later fails on a
    tensor no forward settled, not as a refusal naming it (VAE-4b)."""

    name = "broken-lets-lazy-state-through"
    breaks = frozenset({"VAE-4b"})

    def vae_steps(self) -> VAESteps:
        return VAESteps(slot_checks=SlotChecks(settled=lazy_unchecked))
