"""Kept so `--loader=reference.baseline:PlainAssign` works: the home is `reference.kit.baseline`."""

from reference.kit.baseline import PlainAssign, PlainLoadStateDict

__all__ = ["PlainAssign", "PlainLoadStateDict"]
