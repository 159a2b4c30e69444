"""Broken loaders that keep a rule caught once each test judges its own rule only (VAE-2)."""

from __future__ import annotations

from fakes.broken.vae import VAEDefect
from reference.load.vae import VAESteps
from reference.place.slots import ABI_FUNCTIONS, SlotChecks

__all__ = ["TrustsStateDict"]


class TrustsStateDict(VAEDefect):
    """Checks `_save_to_state_dict`, `_load_from_state_dict` and `load_state_dict` on every
    module but never `state_dict`, so a root whose own class overrides it streams through
    (VAE-2), as does an override of it inherited from a user base class or on a submodule
    (VAE-3)."""

    name = "broken-trusts-state-dict"
    breaks = frozenset({"VAE-2", "VAE-3"})

    def vae_steps(self) -> VAESteps:
        others = tuple(f for f in ABI_FUNCTIONS if f != "state_dict")
        return VAESteps(slot_checks=SlotChecks(functions=others))
